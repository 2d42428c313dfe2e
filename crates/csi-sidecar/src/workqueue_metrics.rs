//! client-go's workqueue metrics as component-base registers them (`workqueue_*{name}`, the
//! Go sidecars import it), so dashboards and alerts on queue depth and latency keep working.
//! Our queues are [`crate::workers::KeyedWorkers`]: a key is *added* when a sync of it is
//! scheduled, *waits* until a worker of its lane is free (depth, queue duration), then *runs*
//! (work duration, unfinished work); a failed sync is a *retry*. Each controller names its
//! queues as upstream's do ("claims", "volumes", "csi-attacher-va", …).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::lock;
use csi_grpc::metrics::{encode_as_upstream, register_as_upstream};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    name: String,
}

type DurationFamily = Family<QueueLabel, Histogram, fn() -> Histogram>;

/// component-base's buckets: `ExponentialBuckets(10e-9, 10, 10)`, 10 ns to 10 s.
fn duration_histogram() -> Histogram {
    Histogram::new(go_exponential_buckets(10e-9, 10.0, 10))
}

/// client_golang's `ExponentialBuckets`: each bound the previous one times `factor`, so the
/// bounds (and the `le` labels users select) carry Go's rounding (`9.999999999999999e-06`).
fn go_exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    std::iter::successors(Some(start), |bound| Some(bound * factor))
        .take(count)
        .collect()
}

/// The families every queue of a process shares. `Default` is unregistered (in-process use
/// without an HTTP endpoint).
#[derive(Clone, Debug)]
pub struct WorkqueueMetrics {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    latency: DurationFamily,
    work_duration: DurationFamily,
    retries: Family<QueueLabel, Counter>,
    running: Arc<Running>,
}

/// The syncs under way, by queue, for the two gauges client-go updates every half second
/// (here: computed at each scrape).
#[derive(Debug, Default)]
struct Running {
    next_id: AtomicU64,
    started: Mutex<HashMap<u64, (Arc<str>, Instant)>>,
    /// Every queue created, so its gauges read 0 while nothing runs (as client-go's).
    queues: Mutex<Vec<Arc<str>>>,
}

impl Default for WorkqueueMetrics {
    fn default() -> Self {
        Self {
            depth: Family::default(),
            adds: Family::default(),
            latency: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            retries: Family::default(),
            running: Arc::default(),
        }
    }
}

impl WorkqueueMetrics {
    /// Registers the seven `workqueue_*` families in `registry` with component-base's texts.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        register_as_upstream(
            registry,
            "workqueue_depth",
            "[BETA] Current depth of workqueue",
            metrics.depth.clone(),
        );
        register_as_upstream(
            registry,
            "workqueue_adds",
            "[BETA] Total number of adds handled by workqueue",
            metrics.adds.clone(),
        );
        register_as_upstream(
            registry,
            "workqueue_queue_duration_seconds",
            "[BETA] How long in seconds an item stays in workqueue before being requested.",
            metrics.latency.clone(),
        );
        register_as_upstream(
            registry,
            "workqueue_work_duration_seconds",
            "[BETA] How long in seconds processing an item from workqueue takes.",
            metrics.work_duration.clone(),
        );
        register_as_upstream(
            registry,
            "workqueue_retries",
            "[BETA] Total number of retries handled by workqueue",
            metrics.retries.clone(),
        );
        registry.register_collector(Box::new(RunningCollector(metrics.running.clone())));
        metrics
    }

    /// The queue `name`; its series exist (at 0) from now on, as a client-go queue's do.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let name: Arc<str> = Arc::from(name);
        let label = QueueLabel {
            name: name.to_string(),
        };
        drop(self.depth.get_or_create(&label));
        drop(self.adds.get_or_create(&label));
        drop(self.latency.get_or_create(&label));
        drop(self.work_duration.get_or_create(&label));
        drop(self.retries.get_or_create(&label));
        let mut queues = lock(&self.running.queues);
        if !queues.contains(&name) {
            queues.push(name.clone());
        }
        drop(queues);
        QueueMetrics {
            name,
            label,
            metrics: self.clone(),
        }
    }
}

/// One named queue's metrics.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    name: Arc<str>,
    label: QueueLabel,
    metrics: WorkqueueMetrics,
}

impl QueueMetrics {
    /// A key entered the queue; it counts in the depth until the returned guard starts its
    /// work or is dropped (a task cancelled while it waited).
    pub fn added(&self) -> Queued {
        self.metrics.adds.get_or_create(&self.label).inc();
        self.metrics.depth.get_or_create(&self.label).inc();
        Queued {
            queue: Some(self.clone()),
            since: Instant::now(),
        }
    }

    /// The key's sync failed and is retried later (client-go's `AddRateLimited`).
    pub fn retried(&self) {
        self.metrics.retries.get_or_create(&self.label).inc();
    }
}

/// A key waiting for a worker.
#[derive(Debug)]
pub struct Queued {
    /// Taken when the work starts.
    queue: Option<QueueMetrics>,
    since: Instant,
}

impl Queued {
    /// A worker took the key: its wait is observed; the returned guard observes the work's
    /// duration when dropped.
    pub fn start(mut self) -> Work {
        let queue = self.queue.take().expect("a queued key starts once");
        let metrics = &queue.metrics;
        metrics.depth.get_or_create(&queue.label).dec();
        metrics
            .latency
            .get_or_create(&queue.label)
            .observe(self.since.elapsed().as_secs_f64());
        let id = metrics.running.next_id.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        lock(&metrics.running.started).insert(id, (queue.name.clone(), now));
        Work {
            queue,
            id,
            started: now,
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.take() {
            queue.metrics.depth.get_or_create(&queue.label).dec();
        }
    }
}

/// A sync under way; its end is observed when this is dropped (also when the sync panics).
#[derive(Debug)]
pub struct Work {
    queue: QueueMetrics,
    id: u64,
    started: Instant,
}

impl Drop for Work {
    fn drop(&mut self) {
        let metrics = &self.queue.metrics;
        lock(&metrics.running.started).remove(&self.id);
        metrics
            .work_duration
            .get_or_create(&self.queue.label)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// One queue's syncs under way.
#[derive(Debug, PartialEq)]
struct Load {
    queue: Arc<str>,
    /// Their summed seconds so far.
    unfinished: f64,
    /// The oldest one's seconds.
    longest: f64,
}

fn loads(running: &Running, now: Instant) -> Vec<Load> {
    let started = lock(&running.started);
    lock(&running.queues)
        .iter()
        .map(|queue| {
            let ages = started
                .values()
                .filter(|(name, _)| name == queue)
                .map(|(_, at)| now.duration_since(*at).as_secs_f64());
            let (unfinished, longest) =
                ages.fold((0.0, 0.0_f64), |(sum, max), age| (sum + age, max.max(age)));
            Load {
                queue: queue.clone(),
                unfinished,
                longest,
            }
        })
        .collect()
}

#[derive(Debug)]
struct RunningCollector(Arc<Running>);

/// A gauge family's name, help and value of a queue's load.
type LoadFamily = (&'static str, &'static str, fn(&Load) -> f64);

impl Collector for RunningCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let loads = loads(&self.0, Instant::now());
        let families: [LoadFamily; 2] = [
            (
                "workqueue_unfinished_work_seconds",
                "[BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                |load| load.unfinished,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "[BETA] How many seconds has the longest running processor for workqueue been running.",
                |load| load.longest,
            ),
        ];
        for (name, help, value) in families {
            let gauges = loads
                .iter()
                .map(|load| {
                    let label = QueueLabel {
                        name: load.queue.to_string(),
                    };
                    (label, ConstGauge::new(value(load)))
                })
                .collect();
            encode_as_upstream(&mut encoder, name, help, &ConstFamily(gauges))?;
        }
        Ok(())
    }
}

/// Constant gauges by label, encoded as one family.
#[derive(Debug)]
struct ConstFamily(Vec<(QueueLabel, ConstGauge<f64>)>);

impl prometheus_client::encoding::EncodeMetric for ConstFamily {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        for (label, gauge) in &self.0 {
            gauge.encode(encoder.encode_family(label)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn scrape(registry: &Registry) -> String {
        csi_grpc::metrics::encode(registry)
    }

    /// The value of `series` (name and labels) in `text`.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn queues_report_adds_waits_work_and_retries_as_client_go_names_them() {
        let mut registry = Registry::default();
        let metrics = WorkqueueMetrics::register(&mut registry);
        let claims = metrics.queue("claims");
        metrics.queue("volumes");
        let text = scrape(&registry);
        for zero in [
            r#"workqueue_depth{name="volumes"} 0"#,
            r#"workqueue_adds_total{name="volumes"} 0"#,
            r#"workqueue_retries_total{name="volumes"} 0"#,
            r#"workqueue_queue_duration_seconds_count{name="volumes"} 0"#,
            r#"workqueue_unfinished_work_seconds{name="volumes"} 0"#,
            r#"workqueue_longest_running_processor_seconds{name="volumes"} 0"#,
        ] {
            assert!(
                text.contains(zero),
                "a queue's series exist from its start: {zero}\n{text}"
            );
        }
        assert!(text.contains("# HELP workqueue_depth [BETA] Current depth of workqueue\n"));
        assert!(
            text.contains(r#"workqueue_work_duration_seconds_bucket{name="claims",le="1e-08"} 0"#)
        );

        let first = claims.added();
        let cancelled = claims.added();
        let text = scrape(&registry);
        assert!(
            text.contains(r#"workqueue_depth{name="claims"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"workqueue_adds_total{name="claims"} 2"#));
        drop(cancelled);
        let text = scrape(&registry);
        assert!(
            text.contains(r#"workqueue_depth{name="claims"} 1"#),
            "a cancelled wait leaves the depth: {text}"
        );
        let work = first.start();
        claims.retried();
        let text = scrape(&registry);
        assert!(
            text.contains(r#"workqueue_depth{name="claims"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"workqueue_queue_duration_seconds_count{name="claims"} 1"#));
        assert!(text.contains(r#"workqueue_retries_total{name="claims"} 1"#));
        let unfinished = r#"workqueue_unfinished_work_seconds{name="claims"}"#;
        assert!(value(&text, unfinished) > 0.0, "{text}");
        drop(work);
        let text = scrape(&registry);
        assert!(text.contains(r#"workqueue_work_duration_seconds_count{name="claims"} 1"#));
        assert_eq!(value(&text, unfinished), 0.0, "{text}");
    }

    #[test]
    fn bucket_bounds_carry_gos_rounding() {
        let bounds: Vec<String> = go_exponential_buckets(10e-9, 10.0, 10)
            .into_iter()
            .map(csi_grpc::metrics::text::go_float)
            .collect();
        // As upstream external-provisioner serves them.
        assert_eq!(
            bounds,
            [
                "1e-08",
                "1e-07",
                "1e-06",
                "9.999999999999999e-06",
                "9.999999999999999e-05",
                "0.001",
                "0.01",
                "0.1",
                "1",
                "10"
            ]
        );
    }

    #[test]
    fn unfinished_work_sums_and_longest_takes_the_oldest() {
        let running = Running::default();
        let now = Instant::now();
        lock(&running.queues).extend([Arc::from("a"), Arc::from("b")]);
        lock(&running.started).insert(1, (Arc::from("a"), now - Duration::from_secs(3)));
        lock(&running.started).insert(2, (Arc::from("a"), now - Duration::from_secs(5)));
        let load = |queue: &str, unfinished, longest| Load {
            queue: Arc::from(queue),
            unfinished,
            longest,
        };
        assert_eq!(
            loads(&running, now),
            vec![load("a", 8.0, 5.0), load("b", 0.0, 0.0)]
        );
    }
}
