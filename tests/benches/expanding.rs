//! csi-resizer under load: N bound claims (default 1000, `BENCH_EXPANSIONS`) of an expandable
//! class all asking for twice their size at once, until every claim's `status.capacity` shows
//! the new size. The release `csi-resizer` runs as its own process against kube-sim (or the
//! cluster of `KUBECONFIG`) and the reference driver, with its default flags;
//! `BENCH_RESIZER` (and `BENCH_RESIZER_ARGS`) run another binary instead, e.g. upstream's.
//! Reports expansions/s, p50/p99, the resizer's API requests per claim by verb and resource
//! (counted by kube-sim per client) and its peak RSS. Writes the "csi-resizer" section of
//! `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binary: `cargo build --release -p csi-resizer` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use csi_hostpath::local::LocalCluster;
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, BoundClaims, Footprint, Phase, SidecarProcess, client_requests, latencies,
    listed_watch, main_with_count, reached, record, sidecar_report, start_with_reference_driver,
    timed_requests, volumes_with_pvs,
};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

const HEADING: &str = "## csi-resizer";
const DRIVER: &str = "bench-resize.csi-suite.io";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench-expansions";
const CLASS: &str = "bench-expandable";
/// The resizer's client name in kube-sim's request counts (its User-Agent).
const CLIENT: &str = "csi-resizer";
/// The longest wait for the next claim to get there (a stuck binary fails the run).
const LIMIT: Duration = Duration::from_secs(120);
/// Objects created (and patched) concurrently.
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_EXPANSIONS", 1000, run)
}

fn name(i: usize) -> String {
    format!("bench-grow-{i}")
}

async fn run(count: usize) -> anyhow::Result<()> {
    let (root, api, driver) =
        start_with_reference_driver("bench-expanding-", DRIVER, NODE, |_| {}).await?;
    let client = api.client.clone();
    println!("preparing {count} volumes, PVs and bound claims …");
    prepare(&client, &driver, count).await?;

    // Its caches: claims, PVs and pods.
    let address = format!(
        "--csi-address={}",
        driver.controller.endpoint.path().display()
    );
    let mut resizer = SidecarProcess::start(CLIENT, &[address], &api, root.path(), 3).await?;
    let expand = expand_phase(&api, count).await;
    if expand.is_err() {
        resizer.print_log_tail();
    }
    let rss = resizer.peak_rss_mib();
    let driver_time = resizer.driver_latencies(&["ControllerExpandVolume"]).await;
    resizer.stop();
    driver.stop().await;
    let phases = [expand?];
    let intro = format!(
        "{count} bound claims of 1Mi (one PV each, a class that allows expansion) all asking for 2Mi at once, patched by {CLIENTS} concurrent clients; the resizer runs with its default flags (`--workers=10`, no client-side QPS limit). Until every claim's `status.capacity` is 2Mi (the reference driver's directory volumes need no node expansion, so the resizer finishes each one). API requests are the resizer's own, per claim, counted by the API server per client (its User-Agent); watches are per run."
    );
    let mut report = sidecar_report(
        &intro,
        count,
        "expansions",
        "claim",
        &phases,
        Footprint {
            sidecar: "csi-resizer",
            rss,
            binary_mib: resizer.binary_mib(),
        },
    );
    if let Some(lines) = driver_time {
        let _ = writeln!(
            report,
            "\nTime in the driver (mean per call, from the resizer's `csi_sidecar_operations_seconds`): {lines}."
        );
    }
    record(
        &api,
        resizer.swapped(),
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench expanding`; the release `csi-resizer` binary as its own process; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// The namespace, the class, and per claim a volume at the driver with its PV and a claim
/// bound to it.
async fn prepare(client: &Client, driver: &LocalCluster, count: usize) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": CLASS}, "provisioner": DRIVER,
                "allowVolumeExpansion": true, "volumeBindingMode": "Immediate"}))?,
        )
        .await?;
    let bound = BoundClaims {
        namespace: NAMESPACE,
        class: CLASS,
        status: json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Mi"}}),
    };
    volumes_with_pvs(
        client,
        &driver.controller.csi,
        DRIVER,
        count,
        CLIENTS,
        name,
        Some(bound),
    )
    .await?;
    // A real server's PV controller binds the claims itself (and may reset a phase written
    // before it saw the PV): the phase starts once every claim is Bound.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + LIMIT;
    loop {
        let list = claims.list(&Default::default()).await?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == count {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {bound} of {count} claims Bound"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Asks every claim for 2Mi at once and waits until each shows it in its status.
async fn expand_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Phase> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(server.client.clone(), NAMESPACE);
    let before = server.counts().await;
    let mut events = std::pin::pin!(listed_watch(&api).await);
    let start = Instant::now();
    let asked = timed_requests(count, CLIENTS, |i| {
        let api = api.clone();
        async move {
            api.patch(
                &name(i),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}})),
            )
            .await?;
            Ok(name(i))
        }
    })
    .await?;
    let grown_at = reached(&mut events, count, "expanded", LIMIT, |event| match event {
        watcher::Event::Apply(claim)
            if claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .is_some_and(|q| q.0 == "2Mi") =>
        {
            Some(claim.name_any())
        }
        _ => None,
    })
    .await?;
    Ok(Phase {
        name: "expand",
        elapsed: start.elapsed(),
        latencies: latencies(&asked, &grown_at),
        requests: client_requests(CLIENT, before, server.counts().await),
    })
}
