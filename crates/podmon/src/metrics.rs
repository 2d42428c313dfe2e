//! podmon's metrics: failovers by result, connectivity samples by result, cleanup duration,
//! tainted nodes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// Outcomes of a controller cleanup (a failover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverResult {
    /// Fenced, tainted, VolumeAttachments and pods deleted.
    Success,
    /// The driver said the node is still connected or busy, or data was missing.
    Aborted,
    /// A step failed (fencing, taint, delete); retried with backoff.
    Failed,
    /// Held by the circuit breaker or the maintenance switch.
    Held,
}

impl FailoverResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Aborted => "aborted",
            Self::Failed => "failed",
            Self::Held => "held",
        }
    }
}

/// Outcomes of a connectivity sample of a node (ValidateVolumeHostConnectivity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    Connected,
    Disconnected,
    /// The call failed: no evidence either way.
    Failed,
}

impl Sample {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Disconnected => "disconnected",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PodmonMetrics {
    failovers: Family<ResultLabel, Counter>,
    connectivity_samples: Family<ResultLabel, Counter>,
    cleanup_seconds: Histogram,
    tainted_nodes: Gauge,
    passes: Counter,
}

impl PodmonMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        registry.register(
            "podmon_failover",
            "Cleanups of pods on failed nodes, by result",
            metrics.failovers.clone(),
        );
        registry.register(
            "podmon_connectivity_checks",
            "Connectivity samples of nodes hosting protected pods through the driver's podmon \
             extension, by result",
            metrics.connectivity_samples.clone(),
        );
        registry.register(
            "podmon_cleanup_seconds",
            "Duration of successful cleanups (fence to force delete), and of node-side cleanups",
            metrics.cleanup_seconds.clone(),
        );
        registry.register(
            "podmon_tainted_nodes",
            "Nodes carrying podmon's fenced taint",
            metrics.tainted_nodes.clone(),
        );
        registry.register(
            "podmon_controller_passes",
            "Completed evaluations of every protected pod and node by controller-podmon (it \
             runs one per change and at least every second: a counter that stops is a stuck \
             controller)",
            metrics.passes.clone(),
        );
        metrics
    }

    pub fn unregistered() -> Self {
        Self {
            failovers: Family::default(),
            connectivity_samples: Family::default(),
            cleanup_seconds: Histogram::new([
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0,
            ]),
            tainted_nodes: Gauge::default(),
            passes: Counter::default(),
        }
    }

    pub fn failover(&self, result: FailoverResult) {
        counter(&self.failovers, result.as_str()).inc();
    }

    pub fn failovers(&self, result: FailoverResult) -> u64 {
        counter(&self.failovers, result.as_str()).get()
    }

    pub fn connectivity_sample(&self, sample: Sample) {
        counter(&self.connectivity_samples, sample.as_str()).inc();
    }

    /// How many connectivity samples had this result.
    pub fn connectivity_samples(&self, sample: Sample) -> u64 {
        counter(&self.connectivity_samples, sample.as_str()).get()
    }

    pub fn cleanup_took(&self, seconds: f64) {
        self.cleanup_seconds.observe(seconds);
    }

    pub fn pass_done(&self) {
        self.passes.inc();
    }

    /// How many passes controller-podmon has completed.
    pub fn passes(&self) -> u64 {
        self.passes.get()
    }

    pub fn set_tainted_nodes(&self, count: usize) {
        self.tainted_nodes
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

/// The counter of `family` for `result` (sharing its value).
fn counter(family: &Family<ResultLabel, Counter>, result: &str) -> Counter {
    family
        .get_or_create(&ResultLabel {
            result: result.to_string(),
        })
        .clone()
}
