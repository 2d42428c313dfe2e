//! csi-provisioner under load: N claims (default 1000, `BENCH_CLAIMS`) created at once until all
//! are Bound, then all deleted until every PV is gone. The real `csi-provisioner` binary runs as
//! its own process against kube-sim (or the cluster of `KUBECONFIG`) and the reference driver,
//! with its default flags. Reports claims/s, p50/p99 time to Bound, API requests per volume by
//! verb and resource (counted by kube-sim per client), and the provisioner's peak RSS.
//! Writes the "csi-provisioner" section of `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binary: `cargo build --release -p csi-provisioner` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_hostpath::local::LocalCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kube_sim::apiserver::RequestCounts;
use kube_sim::roles::{Role, Timing};
use serde_json::json;

const HEADING: &str = "## csi-provisioner";
const NAMESPACE: &str = "bench";
const CLASS: &str = "bench";
const DRIVER: &str = "bench.csi-suite.io";
const NODE: &str = "bench-node";
/// The provisioner's client name in kube-sim's request counts (its User-Agent).
const CLIENT: &str = "csi-provisioner";
const LIMIT: Duration = Duration::from_secs(120);
/// Claims created concurrently.
const CREATORS: usize = 64;

fn main() -> anyhow::Result<()> {
    let claims: usize = std::env::var("BENCH_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(claims))
}

/// The API server to use: kube-sim with the pv-binder role, or the cluster of `KUBECONFIG`.
struct ApiServerUnderTest {
    client: Client,
    kubeconfig: PathBuf,
    sim: Option<kube_sim::ApiServer>,
    _control_plane: tokio::task::JoinSet<()>,
}

async fn api_server(root: &Path) -> anyhow::Result<ApiServerUnderTest> {
    if let Ok(path) = std::env::var("KUBECONFIG") {
        return Ok(ApiServerUnderTest {
            client: Client::try_default().await?,
            kubeconfig: PathBuf::from(path),
            sim: None,
            _control_plane: tokio::task::JoinSet::new(),
        });
    }
    let sim = kube_sim::ApiServer::start().await?;
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(&kubeconfig, kube_sim::cli::kubeconfig_yaml(sim.addr))?;
    let client = sim.client();
    let control_plane = kube_sim::roles::start_control_plane(
        client.clone(),
        &[Role::PvBinder],
        Timing::default(),
        tokio_util::sync::CancellationToken::new(),
    );
    Ok(ApiServerUnderTest {
        client,
        kubeconfig,
        sim: Some(sim),
        _control_plane: control_plane,
    })
}

/// The `csi-provisioner` binary beside this benchmark's profile directory.
fn provisioner_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("the benchmark is not in a cargo target directory")?;
    let binary = profile.join("csi-provisioner");
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p csi-provisioner` first (make bench does)",
            binary.display()
        );
    }
    Ok(binary)
}

/// The peak resident set of a process (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Mean CreateVolume and DeleteVolume latency from the provisioner's metrics endpoint.
async fn driver_latencies(address: std::net::SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let value = |suffix: &str, method: &str| -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("csi_sidecar_operations_seconds_{suffix}{{")))
            .filter(|l| l.contains(&format!("/csi.v1.Controller/{method}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .reduce(|a, b| a + b)
    };
    let mean = |method: &str| {
        let (sum, count) = (value("sum", method)?, value("count", method)?);
        (count > 0.0).then(|| format!("{method} {:.1} ms", sum / count * 1e3))
    };
    let parts: Vec<String> = ["CreateVolume", "DeleteVolume"]
        .iter()
        .filter_map(|m| mean(m))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The provisioner's requests between two snapshots of the counts.
fn provisioner_requests(before: &RequestCounts, after: &RequestCounts) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(key, _)| key.client == CLIENT)
        .filter_map(|(key, count)| {
            let earlier = before.get(key).copied().unwrap_or(0);
            (count > &earlier).then(|| (format!("{} {}", key.verb, key.resource), count - earlier))
        })
        .collect()
}

struct Phase {
    name: &'static str,
    elapsed: Duration,
    latencies: Vec<Duration>,
    requests: Option<BTreeMap<String, u64>>,
}

async fn run(claims: usize) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("bench-provisioning-")
        .tempdir()?;
    let binary = provisioner_binary()?;
    let api = api_server(root.path()).await?;
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await?;
    let client = api.client.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    // The node the driver runs on, as its registration would have published it.
    let key = format!("topology.{DRIVER}/node");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE, "labels": {&key: NODE}}}))?,
        )
        .await?;
    Api::<CSINode>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE}, "spec": {"drivers": [
                {"name": DRIVER, "nodeID": NODE, "topologyKeys": [key]}]}}))?,
        )
        .await?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": CLASS}, "provisioner": DRIVER,
                "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}))?,
        )
        .await?;

    let metrics_address = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let log = std::fs::File::create(root.path().join("csi-provisioner.log"))?;
    let mut child = std::process::Command::new(&binary)
        .arg(format!(
            "--csi-address={}",
            driver.controller.endpoint.path().display()
        ))
        .arg(format!("--kubeconfig={}", api.kubeconfig.display()))
        .arg(format!("--http-endpoint={metrics_address}"))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id();
    let counts = || api.sim.as_ref().map(kube_sim::ApiServer::request_counts);
    // Ready once its caches are filled: it watches claims, PVs, classes, CSINodes, Nodes and
    // VolumeAttachments.
    let started = Instant::now();
    while let Some(current) = counts() {
        let watches = current
            .iter()
            .filter(|(k, _)| k.client == CLIENT && k.verb == "watch")
            .count();
        if watches >= 6 {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            bail!("csi-provisioner did not start its watches within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if api.sim.is_none() {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    let provision = provision_phase(&client, claims, counts).await;
    let delete = match &provision {
        Ok(_) => delete_phase(&client, claims, counts).await,
        Err(_) => Err(anyhow::anyhow!("not run")),
    };
    if provision.is_err() || delete.is_err() {
        let log = std::fs::read_to_string(root.path().join("csi-provisioner.log"))?;
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("csi-provisioner's last log lines:");
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
    }
    let rss = peak_rss_mib(pid);
    let driver_time = driver_latencies(metrics_address).await;
    let _ = child.kill();
    let _ = child.wait();
    driver.stop().await;
    let phases = [provision?, delete?];
    let mut report = report(claims, &phases, rss, &binary);
    if let Some(lines) = driver_time {
        let _ = write!(
            report,
            "\nTime in the driver (mean per call, from the provisioner's `csi_sidecar_operations_seconds`): {lines}. The reference driver commits every change to one state file, so its calls slow down as it holds more volumes.\n"
        );
    }
    println!("{report}");
    if api.sim.is_some() {
        let body = format!(
            "{}\n{report}",
            kube_sim::benchmarks::machine(
                "`make bench` (`cargo bench -p csi-suite-scenarios --bench provisioning`; the release `csi-provisioner` binary as its own process; kube-sim with the pv-binder role and the reference driver in the benchmark's process, all on the same CPUs)"
            )
        );
        let path = kube_sim::benchmarks::write_section(HEADING, &body)?;
        println!("written to {}", path.display());
    }
    Ok(())
}

/// Creates the claims at once and waits until all are Bound.
async fn provision_phase(
    client: &Client,
    claims: usize,
    counts: impl Fn() -> Option<RequestCounts>,
) -> anyhow::Result<Phase> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let before = counts();
    let mut bound_at: HashMap<String, Instant> = HashMap::new();
    let watch = watcher::watcher(api.clone(), watcher::Config::default());
    let mut events = std::pin::pin!(watch);
    // The watch is open before the first create, so no Bound transition is missed.
    events.next().await;
    let start = Instant::now();
    let created: HashMap<String, Instant> = futures::stream::iter(0..claims)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("claim-{i}");
                let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Mi"}}}}))?;
                let at = Instant::now();
                api.create(&PostParams::default(), &claim).await?;
                Ok::<_, anyhow::Error>((name, at))
            }
        })
        .buffer_unordered(CREATORS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    while bound_at.len() < claims {
        let event = tokio::time::timeout(LIMIT, events.next())
            .await
            .context("claims still unbound")?;
        let objects = match event {
            Some(Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim))) => {
                vec![claim]
            }
            Some(Ok(_)) => continue,
            Some(Err(error)) => bail!("watching claims: {error}"),
            None => bail!("the claim watch ended"),
        };
        for claim in objects {
            let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Bound") {
                bound_at
                    .entry(claim.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    }
    let elapsed = start.elapsed();
    let mut latencies: Vec<Duration> = bound_at
        .iter()
        .filter_map(|(name, at)| Some(at.saturating_duration_since(*created.get(name)?)))
        .collect();
    latencies.sort();
    Ok(Phase {
        name: "provision",
        elapsed,
        latencies,
        requests: before
            .zip(counts())
            .map(|(b, a)| provisioner_requests(&b, &a)),
    })
}

/// Deletes every claim and waits until every PV is gone (DeleteVolume done).
async fn delete_phase(
    client: &Client,
    claims: usize,
    counts: impl Fn() -> Option<RequestCounts>,
) -> anyhow::Result<Phase> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let before = counts();
    let start = Instant::now();
    futures::stream::iter(0..claims)
        .map(|i| {
            let api = api.clone();
            async move {
                api.delete(&format!("claim-{i}"), &DeleteParams::default())
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(CREATORS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    loop {
        let left = volumes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == DRIVER)
            })
            .count();
        if left == 0 {
            break;
        }
        if start.elapsed() > LIMIT {
            bail!("{left} PVs still exist");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Phase {
        name: "delete",
        elapsed: start.elapsed(),
        latencies: Vec::new(),
        requests: before
            .zip(counts())
            .map(|(b, a)| provisioner_requests(&b, &a)),
    })
}

fn report(claims: usize, phases: &[Phase], rss: Option<f64>, binary: &Path) -> String {
    let mut out = String::new();
    let size = std::fs::metadata(binary).map_or(0.0, |m| m.len() as f64 / 1024.0 / 1024.0);
    let _ = writeln!(
        out,
        "{claims} claims of an Immediate class created at once by 64 concurrent clients; the provisioner runs with its default flags (`--worker-threads=100`, no client-side QPS limit). Time to Bound includes kube-sim's pv-binder binding the claim to the new PV, as kube-controller-manager does. Deletion: all claims deleted at once, until every PV is gone (DeleteVolume done). API requests are the provisioner's own, per volume, counted by the API server per client (its User-Agent); watches are per run, not per volume.\n"
    );
    let _ = writeln!(out, "| phase | volumes/s | p50 | p99 | wall time |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for phase in phases {
        let rate = claims as f64 / phase.elapsed.as_secs_f64();
        let (p50, p99) = if phase.latencies.is_empty() {
            ("—".to_string(), "—".to_string())
        } else {
            (
                format!(
                    "{:.0} ms",
                    percentile(&phase.latencies, 50.0).as_secs_f64() * 1e3
                ),
                format!(
                    "{:.0} ms",
                    percentile(&phase.latencies, 99.0).as_secs_f64() * 1e3
                ),
            )
        };
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {p50} | {p99} | {:.2} s |",
            phase.name,
            phase.elapsed.as_secs_f64()
        );
    }
    let _ = writeln!(
        out,
        "\nPeak RSS of csi-provisioner: {}; binary size: {size:.1} MiB (release, stripped of nothing).\n",
        rss.map_or("n/a".to_string(), |r| format!("{r:.1} MiB"))
    );
    let _ = writeln!(out, "| phase | request | per volume |");
    let _ = writeln!(out, "|---|---|---|");
    for phase in phases {
        let Some(requests) = &phase.requests else {
            let _ = writeln!(
                out,
                "| {} | (not counted on a real cluster) | |",
                phase.name
            );
            continue;
        };
        let mut writes = 0;
        for (request, count) in requests {
            if request.starts_with("watch ") {
                let _ = writeln!(out, "| {} | {request} | {count} in all |", phase.name);
                continue;
            }
            if ["create", "update", "patch", "delete"]
                .iter()
                .any(|verb| request.starts_with(verb))
            {
                writes += count;
            }
            let _ = writeln!(
                out,
                "| {} | {request} | {:.2} |",
                phase.name,
                *count as f64 / claims as f64
            );
        }
        let _ = writeln!(
            out,
            "| {} | **all writes** | **{:.2}** |",
            phase.name,
            writes as f64 / claims as f64
        );
    }
    out
}
