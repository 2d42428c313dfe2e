//! kube-sim API server throughput, over HTTP with `kube::Client` as the suite's controllers
//! talk to it: creates of 5,000 ConfigMaps by 1, 8 and 32 concurrent writers; merge patches
//! and replaces with 8 watchers open (and how long a change takes to reach all of them); list
//! of 5,000 objects, whole and in pages of 500; deletes of the 5,000 objects.
//!
//! Run: `cargo bench -p kube-sim --bench apiserver`. Prints the tables and writes them, with the
//! machine and the command, as the "kube-sim API server" section of `BENCHMARKS.md` at the
//! repository root (replacing that section only). Nothing asserts a timing.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use kube_sim::ApiServer;
use serde_json::json;

/// Objects created per row, and listed.
const OBJECTS: usize = 5_000;
/// Writes per update row.
const UPDATES: usize = 4_000;
const WRITERS: [usize; 3] = [1, 8, 32];
const WATCHERS: usize = 8;
const LIST_RUNS: usize = 20;
const PAGE: u32 = 500;

const HEADING: &str = "## kube-sim API server";

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// One measured row: operations, wall time, per-op latencies.
struct Row {
    what: String,
    clients: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Row {
    fn markdown(&mut self) -> String {
        self.latencies.sort();
        let ops = self.latencies.len();
        format!(
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} |",
            self.what,
            self.clients,
            ops,
            self.elapsed.as_secs_f64(),
            ops as f64 / self.elapsed.as_secs_f64(),
            ms(percentile(&self.latencies, 50.0)),
            ms(percentile(&self.latencies, 99.0)),
        )
    }
}

async fn namespace(client: &Client, name: &str) -> anyhow::Result<Api<ConfigMap>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    Ok(Api::namespaced(client.clone(), name))
}

fn configmap(name: &str, value: &str) -> anyhow::Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"bench": "kube-sim"}}, "data": {"t": value}}),
    )?)
}

/// Runs `ops` operations spread over `writers` tasks; operation `i` is `op(i)`.
async fn run<F, Fut>(what: &str, writers: usize, ops: usize, op: F) -> anyhow::Result<Row>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for i in (writer..ops).step_by(writers) {
                let begun = Instant::now();
                op(i).await?;
                latencies.push(begun.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(ops);
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok(Row {
        what: what.to_string(),
        clients: writers,
        latencies,
        elapsed: started.elapsed(),
    })
}

/// Watchers that record, for each change they receive, how long after the writer sent it.
struct Watchers {
    delays: Arc<Mutex<Vec<Duration>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watchers {
    async fn start(api: &Api<ConfigMap>, base: Instant) -> anyhow::Result<Self> {
        let version = api
            .list_metadata(&ListParams::default().limit(1))
            .await?
            .metadata
            .resource_version
            .context("list without a resourceVersion")?;
        let delays = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..WATCHERS {
            let mut stream = api
                .watch(&WatchParams::default().timeout(290), &version)
                .await?
                .boxed();
            let delays = delays.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok(Some(event)) = stream.try_next().await {
                    let WatchEvent::Modified(object) = event else {
                        continue;
                    };
                    let sent = object
                        .data
                        .as_ref()
                        .and_then(|d| d.get("t"))
                        .and_then(|t| t.parse::<u64>().ok());
                    if let Some(sent) = sent {
                        let delay = base.elapsed().saturating_sub(Duration::from_nanos(sent));
                        delays.lock().unwrap_or_else(|p| p.into_inner()).push(delay);
                    }
                }
            }));
        }
        Ok(Self { delays, tasks })
    }

    /// Waits until the watchers have received `expected` changes in all (at most 30 s).
    async fn delays(self, expected: usize) -> Vec<Duration> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.delays.lock().unwrap_or_else(|p| p.into_inner()).len() < expected
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for task in &self.tasks {
            task.abort();
        }
        let mut delays =
            std::mem::take(&mut *self.delays.lock().unwrap_or_else(|p| p.into_inner()));
        delays.sort();
        delays
    }
}

fn stamp(base: Instant) -> String {
    base.elapsed().as_nanos().to_string()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let sim = ApiServer::start().await?;
    let client = sim.client();
    let base = Instant::now();
    let mut throughput = Vec::new();
    let mut fanout = Vec::new();

    let mut populated = None;
    for writers in WRITERS {
        let api = namespace(&client, &format!("create-{writers}")).await?;
        let creates = api.clone();
        let row = run("create ConfigMap", writers, OBJECTS, move |i| {
            let api = creates.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &configmap(&format!("cm-{i:05}"), "0")?,
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        throughput.push(row);
        populated = Some(api);
    }
    let api = populated.context("no namespace was populated")?;

    for writers in WRITERS {
        let watchers = Watchers::start(&api, base).await?;
        let patches = api.clone();
        let row = run(
            &format!("merge patch, {WATCHERS} watchers open"),
            writers,
            UPDATES,
            move |i| {
                let api = patches.clone();
                async move {
                    let patch = json!({"data": {"t": stamp(base)}});
                    api.patch(
                        &format!("cm-{:05}", i % OBJECTS),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                    Ok(())
                }
            },
        )
        .await?;
        let delays = watchers.delays(UPDATES * WATCHERS).await;
        fanout.push((writers, row.latencies.len() * WATCHERS, delays));
        throughput.push(row);
    }

    for writers in WRITERS {
        let watchers = Watchers::start(&api, base).await?;
        // Each writer owns its objects, so replaces of the last version never conflict.
        let current: Arc<Vec<Mutex<ConfigMap>>> = Arc::new(
            api.list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(Mutex::new)
                .collect(),
        );
        let replaces = api.clone();
        let row = run(
            &format!("replace (PUT), {WATCHERS} watchers open"),
            writers,
            UPDATES,
            move |i| {
                let api = replaces.clone();
                let current = current.clone();
                async move {
                    let slot = &current[i % OBJECTS];
                    let mut object = slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    object.data = Some([("t".to_string(), stamp(base))].into());
                    let written = api
                        .replace(&object.name_any(), &PostParams::default(), &object)
                        .await?;
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = written;
                    Ok(())
                }
            },
        )
        .await?;
        drop(watchers.delays(UPDATES * WATCHERS).await);
        throughput.push(row);
    }

    let mut lists = Vec::new();
    let list_api = api.clone();
    for (what, limit) in [
        ("list 5,000 (one response)", None),
        ("list 5,000 (pages of 500)", Some(PAGE)),
    ] {
        let mut latencies = Vec::new();
        let started = Instant::now();
        for _ in 0..LIST_RUNS {
            let begun = Instant::now();
            let mut params = ListParams {
                limit,
                ..Default::default()
            };
            let mut count = 0;
            loop {
                let page = list_api.list(&params).await?;
                count += page.items.len();
                match page.metadata.continue_.filter(|t| !t.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            anyhow::ensure!(count == OBJECTS, "listed {count} objects");
            latencies.push(begun.elapsed());
        }
        lists.push(Row {
            what: what.to_string(),
            clients: 1,
            latencies,
            elapsed: started.elapsed(),
        });
    }
    for writers in WRITERS {
        let api = Api::namespaced(client.clone(), &format!("create-{writers}"));
        let row = run("delete ConfigMap", writers, OBJECTS, move |i| {
            let api: Api<ConfigMap> = api.clone();
            async move {
                api.delete(&format!("cm-{i:05}"), &Default::default())
                    .await?;
                Ok(())
            }
        })
        .await?;
        throughput.push(row);
    }
    sim.stop();

    let mut tables = String::new();
    writeln!(
        tables,
        "### Writes (ops/s over HTTP, latency per request)\n"
    )?;
    writeln!(
        tables,
        "| operation | writers | ops | seconds | ops/s | p50 | p99 |"
    )?;
    writeln!(tables, "|---|---:|---:|---:|---:|---:|---:|")?;
    for row in &mut throughput {
        writeln!(tables, "{}", row.markdown())?;
    }
    writeln!(
        tables,
        "\n### Watch fan-out (merge patches above: time from sending the patch to each of the {WATCHERS} watchers receiving it)\n"
    )?;
    writeln!(
        tables,
        "| writers | deliveries expected | received | p50 | p99 | max |"
    )?;
    writeln!(tables, "|---:|---:|---:|---:|---:|---:|")?;
    for (writers, expected, delays) in &fanout {
        writeln!(
            tables,
            "| {writers} | {expected} | {} | {} | {} | {} |",
            delays.len(),
            ms(percentile(delays, 50.0)),
            ms(percentile(delays, 99.0)),
            ms(delays.last().copied().unwrap_or_default()),
        )?;
    }
    writeln!(
        tables,
        "\n### Lists ({LIST_RUNS} runs each; latency of the whole list)\n"
    )?;
    writeln!(
        tables,
        "| operation | clients | lists | seconds | lists/s | p50 | p99 |"
    )?;
    writeln!(tables, "|---|---:|---:|---:|---:|---:|---:|")?;
    for row in &mut lists {
        writeln!(tables, "{}", row.markdown())?;
    }
    println!("{tables}");
    write_section(&tables)
}

/// Writes this benchmark's section of BENCHMARKS.md, replacing the previous one.
fn write_section(tables: &str) -> anyhow::Result<()> {
    let machine = kube_sim_harness::benchmarks::machine(
        "`cargo bench -p kube-sim --bench apiserver` (release build; server, client and watchers in one process on the same CPUs)",
    );
    let body = format!(
        "The in-process API server (`crates/kube-sim`) over HTTP on 127.0.0.1, driven with `kube::Client` as the suite's controllers drive it. Writers are tokio tasks sharing one client; each row of writes is {UPDATES} requests (creates: {OBJECTS}) spread evenly over the writers; patches and replaces go to the {OBJECTS} ConfigMaps of the last create row while {WATCHERS} watches of that namespace are open and read. Latencies are per request as the client sees them (nearest-rank percentiles). The 2 CPUs may be shared with other work: single rows have varied by up to 2x between runs.\n\n{machine}\n{tables}"
    );
    let path = kube_sim_harness::benchmarks::write_section(HEADING, &body)
        .context("writing BENCHMARKS.md")?;
    println!("written to {}", path.display());
    Ok(())
}
