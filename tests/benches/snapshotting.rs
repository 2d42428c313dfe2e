//! csi-snapshotter and snapshot-controller under load: N VolumeSnapshots (default 1000,
//! `BENCH_SNAPSHOTS`) of N bound claims created at once until all are ready to use, then all
//! deleted until every VolumeSnapshotContent is gone (DeleteSnapshot done). Both release
//! binaries run as their own processes against kube-sim (or the cluster of `KUBECONFIG`) and
//! the reference driver, with their default flags; `BENCH_SNAPSHOTTER` /
//! `BENCH_SNAPSHOT_CONTROLLER` (and `_ARGS`) run other binaries instead, e.g. upstream's.
//! Reports snapshots/s, p50/p99, each binary's API requests per snapshot by verb and resource
//! (counted by kube-sim per client) and its peak RSS. Writes the "csi-snapshotter and
//! snapshot-controller" section of `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binaries: `cargo build --release -p csi-snapshotter` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use csi_hostpath::local::LocalCluster;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, BoundClaims, Phase, SidecarProcess, client_requests, latencies,
    listed_watch, main_with_count, phase_table, reached, record, request_table, timed_requests,
    volumes_with_pvs,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

const HEADING: &str = "## csi-snapshotter and snapshot-controller";
const DRIVER: &str = "bench-snapshot.csi-suite.io";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench-snapshots";
/// The binaries' client names in kube-sim's request counts (their User-Agent).
const SIDECAR: &str = "csi-snapshotter";
const CONTROLLER: &str = "snapshot-controller";
/// The longest wait for the next object to get there (a stuck binary fails the run).
const LIMIT: Duration = Duration::from_secs(120);
/// Objects created (and deleted) concurrently.
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_SNAPSHOTS", 1000, run)
}

fn name(i: usize) -> String {
    format!("bench-snap-{i}")
}

async fn run(count: usize) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("bench-snapshotting-")
        .tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[]).await?;
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await?;
    let client = api.client.clone();
    println!("preparing {count} volumes, PVs and bound claims …");
    prepare(&client, &driver, count).await?;

    // The controller's caches: snapshots, contents, classes, claims, PVs; the sidecar's:
    // contents and classes.
    let mut controller = SidecarProcess::start(CONTROLLER, &[], &api, root.path(), 5).await?;
    let address = format!(
        "--csi-address={}",
        driver.controller.endpoint.path().display()
    );
    let mut sidecar = SidecarProcess::start(SIDECAR, &[address], &api, root.path(), 2).await?;
    let cut = cut_phase(&api, count).await;
    let delete = match &cut {
        Ok(_) => delete_phase(&api, count).await,
        Err(_) => Err(anyhow::anyhow!("not run")),
    };
    if cut.is_err() || delete.is_err() {
        controller.print_log_tail();
        sidecar.print_log_tail();
    }
    let rss = [controller.peak_rss_mib(), sidecar.peak_rss_mib()];
    let driver_time = sidecar
        .driver_latencies(&["CreateSnapshot", "DeleteSnapshot"])
        .await;
    controller.stop();
    sidecar.stop();
    driver.stop().await;
    let (cut, delete) = (cut?, delete?);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{count} VolumeSnapshots of {count} bound claims (one PV each, a default VolumeSnapshotClass of the driver, policy Delete) created at once by {CLIENTS} concurrent clients; both binaries run with their default flags (`--worker-threads=10`, no client-side QPS limit). Cut: until every VolumeSnapshot is `readyToUse`. Delete: all deleted at once, until every VolumeSnapshotContent is gone (DeleteSnapshot done, finalizers removed). API requests are each binary's own, per snapshot, counted by the API server per client (its User-Agent); watches are per run.\n"
    );
    report.push_str(&phase_table(
        count,
        "snapshots",
        &[phase_of(&cut, CONTROLLER), phase_of(&delete, CONTROLLER)],
    ));
    let mib = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.1} MiB"));
    let _ = writeln!(
        report,
        "\n| binary | peak RSS | binary size (release) |\n|---|---|---|\n| snapshot-controller | {} | {:.1} MiB |\n| csi-snapshotter | {} | {:.1} MiB |\n",
        mib(rss[0]),
        controller.binary_mib(),
        mib(rss[1]),
        sidecar.binary_mib()
    );
    for who in [CONTROLLER, SIDECAR] {
        let _ = writeln!(report, "API requests of {who}:\n");
        report.push_str(&request_table(
            count,
            "snapshot",
            &[phase_of(&cut, who), phase_of(&delete, who)],
        ));
        report.push('\n');
    }
    if let Some(lines) = driver_time {
        let _ = writeln!(
            report,
            "Time in the driver (mean per call, from csi-snapshotter's `csi_sidecar_operations_seconds`): {lines}."
        );
    }
    record(
        &api,
        controller.swapped() || sidecar.swapped(),
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench snapshotting`; the release `snapshot-controller` and `csi-snapshotter` binaries as their own processes; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// A measured phase, with the requests of both binaries.
struct Measured {
    name: &'static str,
    elapsed: Duration,
    latencies: Vec<Duration>,
    controller: Option<csi_suite_scenarios::bench::Requests>,
    sidecar: Option<csi_suite_scenarios::bench::Requests>,
}

fn phase_of(measured: &Measured, who: &str) -> Phase {
    let requests = if who == CONTROLLER {
        &measured.controller
    } else {
        &measured.sidecar
    };
    Phase {
        name: measured.name,
        elapsed: measured.elapsed,
        latencies: measured.latencies.clone(),
        requests: requests
            .as_ref()
            .map(|r| csi_suite_scenarios::bench::Requests {
                all_clients: r.all_clients,
                by_request: r.by_request.clone(),
            }),
    }
}

/// The CRDs, the namespace, the class, and per snapshot a volume at the driver with its PV and
/// a claim bound to it.
async fn prepare(client: &Client, driver: &LocalCluster, count: usize) -> anyhow::Result<()> {
    for crd in csi_kinds::snapshot::crds() {
        let crds: Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = Api::all(client.clone());
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let class: VolumeSnapshotClass = serde_json::from_value(json!({
        "metadata": {"name": "bench", "annotations": {
            "snapshot.storage.kubernetes.io/is-default-class": "true"}},
        "driver": DRIVER, "deletionPolicy": "Delete"}))?;
    // A real server needs a moment to serve a new CRD.
    let classes: Api<VolumeSnapshotClass> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(error) = classes.create(&PostParams::default(), &class).await {
        if Instant::now() > deadline {
            bail!("creating the VolumeSnapshotClass: {error}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bound = BoundClaims {
        namespace: NAMESPACE,
        class: "",
        status: json!({"phase": "Bound"}),
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
    .await
}

async fn counts(server: &ApiServerUnderTest) -> [Option<kube_sim::apiserver::RequestCounts>; 2] {
    let counts = server.counts().await;
    [counts.clone(), counts]
}

/// Creates the VolumeSnapshots at once and waits until all are ready to use.
async fn cut_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Measured> {
    let api: Api<VolumeSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let [before_controller, before_sidecar] = counts(server).await;
    let mut events = std::pin::pin!(listed_watch(&api).await);
    let start = Instant::now();
    let created = timed_requests(count, CLIENTS, |i| {
        let api = api.clone();
        async move {
            let snapshot: VolumeSnapshot = serde_json::from_value(json!({
                "metadata": {"name": name(i)},
                "spec": {"source": {"persistentVolumeClaimName": name(i)}}}))?;
            api.create(&PostParams::default(), &snapshot).await?;
            Ok(name(i))
        }
    })
    .await?;
    let ready_at = reached(&mut events, count, "ready", LIMIT, |event| match event {
        watcher::Event::Apply(s)
            if s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true) =>
        {
            Some(s.name_any())
        }
        _ => None,
    })
    .await?;
    let elapsed = start.elapsed();
    let [after_controller, after_sidecar] = counts(server).await;
    Ok(Measured {
        name: "cut",
        elapsed,
        latencies: latencies(&created, &ready_at),
        controller: client_requests(CONTROLLER, before_controller, after_controller),
        sidecar: client_requests(SIDECAR, before_sidecar, after_sidecar),
    })
}

/// Deletes every VolumeSnapshot at once and waits until every content is gone.
async fn delete_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Measured> {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let contents: Api<VolumeSnapshotContent> = Api::all(server.client.clone());
    let [before_controller, before_sidecar] = counts(server).await;
    let mut events = std::pin::pin!(listed_watch(&contents).await);
    let names: HashMap<String, String> = contents
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| Some((c.name_any(), c.spec.volume_snapshot_ref.name?)))
        .collect();
    let start = Instant::now();
    let deleted = timed_requests(count, CLIENTS, |i| {
        let api = snapshots.clone();
        async move {
            api.delete(&name(i), &DeleteParams::default()).await?;
            Ok(name(i))
        }
    })
    .await?;
    let gone_at = reached(&mut events, count, "deleted", LIMIT, |event| match event {
        watcher::Event::Delete(content) => names.get(&content.name_any()).cloned(),
        _ => None,
    })
    .await?;
    let elapsed = start.elapsed();
    let [after_controller, after_sidecar] = counts(server).await;
    Ok(Measured {
        name: "delete",
        elapsed,
        latencies: latencies(&deleted, &gone_at),
        controller: client_requests(CONTROLLER, before_controller, after_controller),
        sidecar: client_requests(SIDECAR, before_sidecar, after_sidecar),
    })
}
