//! Volume group snapshots under load: N VolumeGroupSnapshots (default 100, `BENCH_GROUPS`),
//! each picking three bound claims by a label, created at once until every group is ready to
//! use; then all deleted at once until every VolumeGroupSnapshotContent and every member's
//! VolumeSnapshotContent is gone (DeleteVolumeGroupSnapshot done). The release
//! `snapshot-controller` and `csi-snapshotter` run as their own processes, with their default
//! flags, against kube-sim (or the cluster of `KUBECONFIG`) and the reference driver's
//! GroupController; `BENCH_SNAPSHOT_CONTROLLER` / `BENCH_SNAPSHOTTER` (and `_ARGS`) run other
//! binaries instead, e.g. upstream's (whose group support is behind
//! `--feature-gates=CSIVolumeGroupSnapshot=true`). Reports groups/s, p50/p99, both binaries'
//! peak RSS and API requests per group, and writes the "volume group snapshots" section of
//! `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! `BENCH_DUMP=/path/file.json` also writes, once every group is ready, the first group's
//! objects (the group, its content, its member VolumeSnapshots and VolumeSnapshotContents) and
//! the Events of all the run's objects, without the fields the server or the clock fills
//! (uid, resourceVersion, timestamps, managed fields): run it with `BENCH_GROUPS=1` for ours
//! and for another implementation, and compare the two files.
//!
//! Needs the binaries: `cargo build --release -p csi-snapshotter` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use csi_hostpath::local::LocalCluster;
use csi_kinds::groupsnapshot::{
    VolumeGroupSnapshot, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, BinaryPair, BoundClaims, PairedPhase, crds_and_namespace, create_until,
    create_when_served, delete_until, main_with_count, record, start_with_reference_driver,
    volumes_with_pvs,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const HEADING: &str = "## csi-snapshotter and snapshot-controller: volume group snapshots";
const DRIVER: &str = "bench-group.csi-suite.io";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench-groups";
/// Claims per group.
const MEMBERS: usize = 3;
/// The label that puts a claim in its group.
const GROUP_LABEL: &str = "bench-group";
/// The binaries' client names in kube-sim's request counts (their User-Agent).
const SIDECAR: &str = "csi-snapshotter";
const CONTROLLER: &str = "snapshot-controller";
/// The longest wait for the next object to get there (a stuck binary fails the run).
const LIMIT: Duration = Duration::from_secs(120);
/// Objects created (and deleted) concurrently.
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_GROUPS", 100, run)
}

fn group(i: usize) -> String {
    format!("bench-group-{i}")
}

fn claim(i: usize) -> String {
    format!("bench-claim-{i}")
}

async fn run(groups: usize) -> anyhow::Result<()> {
    let (root, api, driver) =
        start_with_reference_driver("bench-group-snapshotting-", DRIVER, NODE, |_| {}).await?;
    let client = api.client.clone();
    println!(
        "preparing {} volumes, PVs and bound claims in {groups} groups …",
        groups * MEMBERS
    );
    prepare(&client, &driver, groups).await?;

    // The controller's caches: snapshots, contents, classes, claims, PVs and the three group
    // kinds; the sidecar's: contents, classes, group contents and group classes.
    let address = format!(
        "--csi-address={}",
        driver.controller.endpoint.path().display()
    );
    let binaries = [(CONTROLLER, vec![], 8), (SIDECAR, vec![address], 4)];
    let pair = BinaryPair::start(&api, root.path(), binaries).await?;
    let phases = async {
        let cut = cut_phase(&api, groups).await?;
        if let Some(path) = std::env::var_os("BENCH_DUMP") {
            dump(&client, std::path::Path::new(&path)).await?;
        }
        Ok(vec![cut, delete_phase(&api, groups).await?])
    }
    .await;
    let methods = ["CreateVolumeGroupSnapshot", "DeleteVolumeGroupSnapshot"];
    let finished = pair
        .finish(phases, (groups, "groups", "group"), &methods)
        .await;
    driver.stop().await;
    let (table, swapped) = finished?;
    let report = format!(
        "{groups} VolumeGroupSnapshots of {MEMBERS} bound claims each (picked by a label; one PV each; a default VolumeGroupSnapshotClass of the driver, policy Delete, and a default VolumeSnapshotClass) created at once by {CLIENTS} concurrent clients; both binaries run with their default flags (no client-side QPS limit). Cut: until every VolumeGroupSnapshot is `readyToUse` (its {MEMBERS} member VolumeSnapshots made and bound). Delete: all deleted at once, until every VolumeGroupSnapshotContent and member VolumeSnapshotContent is gone (DeleteVolumeGroupSnapshot done, finalizers removed). API requests are each binary's own, per group, counted by the API server per client (its User-Agent); watches are per run.\n\n{table}"
    );
    record(
        &api,
        swapped,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench group_snapshotting`; the release `snapshot-controller` and `csi-snapshotter` binaries as their own processes; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// The CRDs, the namespace, the default classes, and per member a volume at the driver with
/// its PV and a claim bound to it, labelled with its group.
async fn prepare(client: &Client, driver: &LocalCluster, groups: usize) -> anyhow::Result<()> {
    let crds = [
        csi_kinds::snapshot::crds(),
        csi_kinds::groupsnapshot::crds(),
    ]
    .concat();
    crds_and_namespace(client, crds, NAMESPACE).await?;
    let class: VolumeSnapshotClass = serde_json::from_value(json!({
        "metadata": {"name": "bench", "annotations": {
            "snapshot.storage.kubernetes.io/is-default-class": "true"}},
        "driver": DRIVER, "deletionPolicy": "Delete"}))?;
    create_when_served(&Api::all(client.clone()), &class).await?;
    let group_class: VolumeGroupSnapshotClass = serde_json::from_value(json!({
        "metadata": {"name": "bench", "annotations": {
            csi_kinds::groupsnapshot::IS_DEFAULT_CLASS: "true"}},
        "driver": DRIVER, "deletionPolicy": "Delete"}))?;
    create_when_served(&Api::all(client.clone()), &group_class).await?;
    let bound = BoundClaims {
        namespace: NAMESPACE,
        class: "",
        status: json!({"phase": "Bound"}),
    };
    let claims = groups * MEMBERS;
    volumes_with_pvs(
        client,
        &driver.controller.csi,
        DRIVER,
        claims,
        CLIENTS,
        claim,
        Some(bound),
    )
    .await?;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..claims)
        .map(|i| {
            let api = api.clone();
            async move {
                let labels = json!({"metadata": {"labels": {GROUP_LABEL: group(i / MEMBERS)}}});
                api.patch(&claim(i), &PatchParams::default(), &Patch::Merge(labels))
                    .await
            }
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

/// Creates the VolumeGroupSnapshots at once and waits until all are ready to use.
async fn cut_phase(server: &ApiServerUnderTest, groups: usize) -> anyhow::Result<PairedPhase> {
    let api: Api<VolumeGroupSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let snapshot = |i| {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": group(i)},
            "spec": {"source": {"selector": {"matchLabels": {GROUP_LABEL: group(i)}}}}}))?)
    };
    let ready =
        |g: &VolumeGroupSnapshot| g.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    let work = create_until(&api, groups, CLIENTS, (LIMIT, "ready"), snapshot, ready);
    PairedPhase::measure(server, "cut", [CONTROLLER, SIDECAR], work).await
}

/// Deletes every VolumeGroupSnapshot at once and waits until every group content is gone, then
/// until no member content is left.
async fn delete_phase(server: &ApiServerUnderTest, groups: usize) -> anyhow::Result<PairedPhase> {
    let snapshots: Api<VolumeGroupSnapshot> = Api::namespaced(server.client.clone(), NAMESPACE);
    let contents: Api<VolumeGroupSnapshotContent> = Api::all(server.client.clone());
    let members: Api<VolumeSnapshotContent> = Api::all(server.client.clone());
    let stands_for: HashMap<String, String> = contents
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| Some((c.name_any(), c.spec.volume_group_snapshot_ref.name?)))
        .collect();
    let names: Vec<String> = (0..groups).map(group).collect();
    let work = async {
        let latencies =
            delete_until(&snapshots, &names, CLIENTS, LIMIT, &contents, &stands_for).await?;
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = members.list_metadata(&ListParams::default()).await?.items;
            if left.is_empty() {
                return Ok(latencies);
            }
            if Instant::now() > deadline {
                bail!("{} member VolumeSnapshotContents left", left.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    PairedPhase::measure(server, "delete", [CONTROLLER, SIDECAR], work).await
}

/// Writes the first group's objects and every Event of the run's objects to `path`, without
/// what the server or the clock fills in, sorted, for comparison with another implementation.
/// The objects are read untyped: a field our types lack is kept.
async fn dump(client: &Client, path: &std::path::Path) -> anyhow::Result<()> {
    let first = objects::<VolumeGroupSnapshot>(client, Some(NAMESPACE))
        .await?
        .into_iter()
        .find(|g| g.name_any() == group(0))
        .ok_or_else(|| anyhow::anyhow!("{} is gone", group(0)))?;
    let content_name = first.data["status"]["boundVolumeGroupSnapshotContentName"].clone();
    let content = objects::<VolumeGroupSnapshotContent>(client, None)
        .await?
        .into_iter()
        .find(|c| Value::String(c.name_any()) == content_name)
        .ok_or_else(|| anyhow::anyhow!("the content of {} is gone", group(0)))?;
    let group_uid = first.uid();
    let members: Vec<DynamicObject> = objects::<VolumeSnapshot>(client, Some(NAMESPACE))
        .await?
        .into_iter()
        .filter(|s| {
            s.owner_references()
                .iter()
                .any(|r| Some(&r.uid) == group_uid.as_ref())
        })
        .collect();
    // A member's content is the one its snapshot is bound to (not owned by the group content).
    let bound: Vec<Value> = members
        .iter()
        .map(|s| s.data["status"]["boundVolumeSnapshotContentName"].clone())
        .collect();
    let mut member_contents: Vec<Value> = objects::<VolumeSnapshotContent>(client, None)
        .await?
        .iter()
        .filter(|c| bound.contains(&Value::String(c.name_any())))
        .map(normalised)
        .collect();
    let mut members: Vec<Value> = members.iter().map(normalised).collect();
    let mut events = Vec::new();
    for namespace in [NAMESPACE, "default"] {
        let listed = settled_events(client, namespace).await?;
        events.extend(listed.into_iter().filter_map(|e| {
            let kind = e.involved_object.kind.clone().unwrap_or_default();
            kind.contains("Snapshot").then(|| {
                format!(
                    "{} {} {kind}: {} (from {})",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                    e.source.and_then(|s| s.component).unwrap_or_default()
                )
            })
        }));
    }
    events.sort();
    members.sort_by_key(Value::to_string);
    member_contents.sort_by_key(Value::to_string);
    let dumped = json!({
        "group": normalised(&first),
        "content": normalised(&content),
        "members": members,
        "memberContents": member_contents,
        "events": events,
    });
    std::fs::write(path, serde_json::to_string_pretty(&dumped)?)?;
    println!(
        "the first group's objects and the Events: {}",
        path.display()
    );
    Ok(())
}

/// The Events in `namespace` once their number has not changed for a second (at most 10 s):
/// both implementations send Events after the status that made them ready.
async fn settled_events(client: &Client, namespace: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = api.list(&ListParams::default()).await?.items;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = api.list(&ListParams::default()).await?.items;
        if now.len() == events.len() || Instant::now() > deadline {
            return Ok(now);
        }
        events = now;
    }
}

/// Every object of the kind `K`, untyped, in `namespace` or cluster-wide.
async fn objects<K>(client: &Client, namespace: Option<&str>) -> anyhow::Result<Vec<DynamicObject>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    Ok(api.list(&ListParams::default()).await?.items)
}

/// `object` without the fields the server or the clock fills in: uids, resourceVersions,
/// timestamps, managed fields.
fn normalised(object: &DynamicObject) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for field in [
                    "uid",
                    "resourceVersion",
                    "creationTimestamp",
                    "creationTime",
                    "managedFields",
                    "generation",
                ] {
                    if let Some(old) = map.get_mut(field) {
                        *old = Value::String("<set>".into());
                    }
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(object).unwrap_or_default();
    strip(&mut value);
    value
}
