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
use std::time::Duration;

use csi_hostpath::local::LocalCluster;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, BinaryPair, BoundClaims, PairedPhase, crds_and_namespace, create_until,
    create_when_served, delete_until, main_with_count, record, start_with_reference_driver,
    volumes_with_pvs,
};
use kube::api::Api;
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
    let (root, api, driver) =
        start_with_reference_driver("bench-snapshotting-", DRIVER, NODE, |_| {}).await?;
    let client = api.client.clone();
    println!("preparing {count} volumes, PVs and bound claims …");
    prepare(&client, &driver, count).await?;

    // The controller's caches: snapshots, contents, classes, claims, PVs; the sidecar's:
    // contents and classes.
    let address = format!(
        "--csi-address={}",
        driver.controller.endpoint.path().display()
    );
    let binaries = [(CONTROLLER, vec![], 5), (SIDECAR, vec![address], 2)];
    let pair = BinaryPair::start(&api, root.path(), binaries).await?;
    let phases = async {
        let cut = cut_phase(&api, count).await?;
        Ok(vec![cut, delete_phase(&api, count).await?])
    }
    .await;
    let methods = ["CreateSnapshot", "DeleteSnapshot"];
    let finished = pair
        .finish(phases, (count, "snapshots", "snapshot"), &methods)
        .await;
    driver.stop().await;
    let (table, swapped) = finished?;
    let report = format!(
        "{count} VolumeSnapshots of {count} bound claims (one PV each, a default VolumeSnapshotClass of the driver, policy Delete) created at once by {CLIENTS} concurrent clients; both binaries run with their default flags (`--worker-threads=10`, no client-side QPS limit). Cut: until every VolumeSnapshot is `readyToUse`. Delete: all deleted at once, until every VolumeSnapshotContent is gone (DeleteSnapshot done, finalizers removed). API requests are each binary's own, per snapshot, counted by the API server per client (its User-Agent); watches are per run.\n\n{table}"
    );
    record(
        &api,
        swapped,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench snapshotting`; the release `snapshot-controller` and `csi-snapshotter` binaries as their own processes; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// The CRDs, the namespace, the class, and per snapshot a volume at the driver with its PV and
/// a claim bound to it.
async fn prepare(client: &Client, driver: &LocalCluster, count: usize) -> anyhow::Result<()> {
    crds_and_namespace(client, csi_kinds::snapshot::crds(), NAMESPACE).await?;
    let class: VolumeSnapshotClass = serde_json::from_value(json!({
        "metadata": {"name": "bench", "annotations": {
            "snapshot.storage.kubernetes.io/is-default-class": "true"}},
        "driver": DRIVER, "deletionPolicy": "Delete"}))?;
    create_when_served(&Api::all(client.clone()), &class).await?;
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

/// Creates the VolumeSnapshots at once and waits until all are ready to use.
async fn cut_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<PairedPhase> {
    let api: Api<VolumeSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let snapshot = |i| {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name(i)},
            "spec": {"source": {"persistentVolumeClaimName": name(i)}}}))?)
    };
    let ready = |s: &VolumeSnapshot| s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    let work = create_until(&api, count, CLIENTS, (LIMIT, "ready"), snapshot, ready);
    PairedPhase::measure(server, "cut", [CONTROLLER, SIDECAR], work).await
}

/// Deletes every VolumeSnapshot at once and waits until every content is gone.
async fn delete_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<PairedPhase> {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let contents: Api<VolumeSnapshotContent> = Api::all(server.client.clone());
    let stands_for: HashMap<String, String> = contents
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| Some((c.name_any(), c.spec.volume_snapshot_ref.name?)))
        .collect();
    let names: Vec<String> = (0..count).map(name).collect();
    let work = delete_until(&snapshots, &names, CLIENTS, LIMIT, &contents, &stands_for);
    PairedPhase::measure(server, "delete", [CONTROLLER, SIDECAR], work).await
}
