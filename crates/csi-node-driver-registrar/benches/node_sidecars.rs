//! The node sidecars' footprint (they run on every node): the release
//! `csi-node-driver-registrar` registers the reference driver with kube-sim's kubelet, the
//! release `livenessprobe` probes it; then 1000 `/healthz` requests each (what kubelet's
//! probes do over days). Reports peak RSS, binary sizes and /healthz latency; writes the
//! "csi-node-driver-registrar and livenessprobe" section of `BENCHMARKS.md`. Nothing asserts a
//! timing.
//!
//! Needs the binaries: `cargo build --release -p csi-node-driver-registrar` (`make bench`).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube_sim::roles::Timing;
use kube_sim::roles::kubelet::{Kubelet, KubeletConfig};
use kube_sim_harness::benchmarks::{peak_rss_mib, release_binary};
use kube_sim_harness::{Running, free_address, http_get};
use tokio_util::sync::CancellationToken;

const HEADING: &str = "## csi-node-driver-registrar and livenessprobe";
const DRIVER: &str = "bench-node.csi-suite.io";
const NODE: &str = "bench-node";
const REQUESTS: usize = 1000;
const PACKAGE: &str = "csi-node-driver-registrar";

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

/// `REQUESTS` sequential `/healthz` requests: p50 and p99 latency; all must answer 200.
async fn probe_latencies(address: SocketAddr) -> anyhow::Result<(Duration, Duration)> {
    let mut latencies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let start = Instant::now();
        let (code, body) = http_get(address, "/healthz")
            .await
            .context("no /healthz answer")?;
        if code != 200 {
            bail!("/healthz answered {code}: {body}");
        }
        latencies.push(start.elapsed());
    }
    latencies.sort();
    Ok((latencies[REQUESTS / 2], latencies[REQUESTS * 99 / 100]))
}

async fn run() -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("bench-node-")
        .tempdir_in("/tmp")?;
    let sim = kube_sim::ApiServer::start().await?;
    let client = sim.client();
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await?;
    let config = KubeletConfig::new(NODE, driver.kubelet_dir(NODE), Timing::fast());
    let registry = config.plugins_registry();
    let kubelet = Kubelet::start(client.clone(), config, CancellationToken::new()).await?;
    let endpoint = driver.node(NODE).endpoint.path().to_path_buf();

    let (registrar_binary, probe_binary) = (
        release_binary("csi-node-driver-registrar", PACKAGE)?,
        release_binary("livenessprobe", PACKAGE)?,
    );
    let (registrar_http, probe_http) = (free_address(), free_address());
    let registrar = Running(
        Command::new(&registrar_binary)
            .arg(format!("--csi-address={}", endpoint.display()))
            .arg(format!(
                "--kubelet-registration-path={}",
                endpoint.display()
            ))
            .arg(format!("--plugin-registration-path={}", registry.display()))
            .arg(format!("--http-endpoint={registrar_http}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let probe = Running(
        Command::new(&probe_binary)
            .arg(format!("--csi-address={}", endpoint.display()))
            .arg(format!("--http-endpoint={probe_http}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let registered = csi_nodes
            .get_opt(NODE)
            .await?
            .is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER));
        if registered {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the driver was not registered within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let registered_in = start.elapsed();
    while http_get(probe_http, "/healthz").await.map(|(c, _)| c) != Some(200) {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("livenessprobe did not report the driver healthy within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let registrar_latency = probe_latencies(registrar_http).await?;
    let probe_latency = probe_latencies(probe_http).await?;
    let rows = [
        (
            "csi-node-driver-registrar",
            &registrar_binary,
            peak_rss_mib(registrar.0.id()),
            registrar_latency,
        ),
        (
            "livenessprobe",
            &probe_binary,
            peak_rss_mib(probe.0.id()),
            probe_latency,
        ),
    ];
    let mut report = String::new();
    let _ = writeln!(
        report,
        "The release binaries on one simulated node: the registrar registers the reference driver with kube-sim's kubelet (socket → GetInfo → NodeGetInfo → CSINode entry in {:.0} ms from start), livenessprobe probes it; then {REQUESTS} sequential `/healthz` requests to each (the registrar's dials its own socket and calls GetInfo; livenessprobe's opens a new connection to the driver and calls Probe).\n",
        registered_in.as_secs_f64() * 1e3
    );
    let _ = writeln!(
        report,
        "| binary | peak RSS | binary size | /healthz p50 | /healthz p99 |"
    );
    let _ = writeln!(report, "|---|---|---|---|---|");
    for (name, path, rss, (p50, p99)) in rows {
        let size = std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / 1024.0 / 1024.0);
        let _ = writeln!(
            report,
            "| {name} | {} | {size:.1} MiB | {:.2} ms | {:.2} ms |",
            rss.map_or("n/a".to_string(), |r| format!("{r:.1} MiB")),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    drop(registrar);
    drop(probe);
    kubelet.stop().await;
    driver.stop().await;
    println!("{report}");
    let body = format!(
        "{}\n{report}",
        kube_sim_harness::benchmarks::machine(
            "`make bench` (`cargo bench -p csi-node-driver-registrar --bench node_sidecars`; the release binaries as their own processes; kube-sim, its kubelet and the reference driver in the benchmark's process)"
        )
    );
    let path = kube_sim_harness::benchmarks::write_section(HEADING, &body)?;
    println!("written to {}", path.display());
    Ok(())
}
