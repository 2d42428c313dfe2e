//! `make demo`, the cluster story: kube-sim's API server, its cluster roles (PV binder,
//! scheduler, attach/detach, node lifecycle, a kubelet per node) and the reference driver on
//! three simulated nodes. A pre-provisioned volume is bound, attached, mounted and written to
//! by a pod; its node is cut off the control plane and recovers; then everything is torn
//! down; then csi-provisioner provisions a volume for a WaitForFirstConsumer claim on the node
//! its pod is scheduled to, and deletes it with the claim; then csi-resizer grows a mounted
//! volume, the snapshot-controller and csi-snapshotter snapshot it while its pod writes, and
//! the snapshot is restored on another node with the data, and two claims of a database are
//! snapshotted together as a volume group and a member restored; then a block volume is backed
//! up through csi-snapshot-metadata (changed block tracking), in full and then only its changed
//! blocks, and restored from both backups with its checksum; then csi-health-monitor tells a
//! claim, once, that its volume's data went missing behind the driver's back, and once that it
//! came back; then podmon fails a protected pod
//! of a failed node over — fence, taint, force delete, replacement on another node, no zombie
//! write after the fence — and cleans the node when it comes back; then COSI gives a workload a
//! bucket on a real S3 server and credentials that stop working when its access is deleted.
//! Each step prints what
//! happened, on which object and how long it took; a summary table ends the run. Needs root
//! (the driver really mounts); exits non-zero on any failure.

#![allow(clippy::print_stdout, reason = "the demo narrates on stdout")]

use std::ops::Range;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use csi_health_monitor::health::{ABNORMAL, NORMAL, RECOVERED};
use csi_inventory::snapshot_metadata::client::Lister;
use csi_inventory::snapshot_metadata::resolve::{Previous, Query, ServiceAccountRef};
use csi_kinds::groupsnapshot::{VolumeGroupSnapshot, VolumeGroupSnapshotClass};
use csi_kinds::objectstorage::{BucketAccess, BucketAccessClass, BucketClaim, BucketClass};
use csi_kinds::quantity::binary_si;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass};
use csi_suite_scenarios::fixtures::{
    bound, claim, cut_snapshot, file_size, handle_of, install_cbt_crds, install_cosi_crds,
    install_snapshot_crds, is_running, pod, provision_static_volume, read_records, static_claim,
    static_pv, static_pvc, taint_effects, write_records,
};
use csi_suite_scenarios::object_storage::{CosiDriver, access_ready, bucket_id_of, claim_ready};
use csi_suite_scenarios::podmon::{Narration, failover_story};
use csi_suite_scenarios::snapshot_metadata::{
    BACKUP, block_claim, block_device, joined, read_block, write_blocks,
};
use csi_suite_scenarios::{Cluster, can_mount};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube_sim::roles::kubelet::{attachment_name, target_path};
use serde_json::json;

const NODE: &str = "node-b";

/// One narrated step: what, on which object, how long.
struct Step {
    what: &'static str,
    object: String,
    took: Duration,
}

#[derive(Default)]
struct Story {
    steps: Vec<Step>,
    started: Option<Instant>,
}

impl Story {
    fn begin(&mut self, what: &str) {
        println!("… {what}");
        self.started = Some(Instant::now());
    }

    fn done(&mut self, what: &'static str, object: impl Into<String>) {
        let took = self.started.take().map_or(Duration::ZERO, |s| s.elapsed());
        let object = object.into();
        println!("✔ {what} — {object} ({})", millis(took));
        self.steps.push(Step { what, object, took });
    }

    fn table(&self) {
        println!("\n| # | step | object | took |\n|---|------|--------|------|");
        for (i, step) in self.steps.iter().enumerate() {
            println!(
                "| {} | {} | {} | {} |",
                i + 1,
                step.what,
                step.object,
                millis(step.took)
            );
        }
        let total: Duration = self.steps.iter().map(|s| s.took).sum();
        println!("\n{} steps, {} in all.", self.steps.len(), millis(total));
    }
}

fn millis(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

#[tokio::main]
async fn main() -> ExitCode {
    if !can_mount() {
        eprintln!("make demo needs root: the driver's node instances make real bind mounts.");
        return ExitCode::FAILURE;
    }
    csi_suite_scenarios::init_logging_at("error");
    // The fixture panics with a cluster dump when a step does not happen in time.
    let outcome = tokio::spawn(story()).await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\ncluster demo FAILED: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn story() {
    let mut story = Story::default();
    println!(
        "The cluster story: kube-sim + cluster roles + the reference driver on three nodes.\n"
    );

    story.begin("starting the API server, the roles, the driver, and registering it on every node");
    let cluster = Cluster::start("demo").await;
    let driver = cluster.driver_name.clone();
    for node in &cluster.nodes {
        let csi_node = cluster
            .cluster_scoped::<CSINode>()
            .get(node)
            .await
            .expect("CSINode");
        assert!(csi_node.spec.drivers.iter().any(|d| d.name == driver));
    }
    story.done(
        "cluster up, driver registered via the plugin watcher",
        format!("CSINode {} → {driver}", cluster.nodes.join(", ")),
    );
    let attacher = cluster.start_attacher().await;

    story.begin("an administrator pre-provisions a volume and creates its PV");
    let pv_name = format!("{}-pv", cluster.namespace);
    let handle = provision_static_volume(&cluster.driver.controller.csi, &pv_name, 8 << 20).await;
    cluster
        .create(
            &cluster.cluster_scoped::<PersistentVolume>(),
            static_pv(
                &pv_name,
                &driver,
                &handle,
                "8Mi",
                Some((&cluster.namespace, "data")),
            ),
        )
        .await;
    story.done(
        "volume created and PV registered",
        format!("PersistentVolume {pv_name}"),
    );

    story.begin("a claim is created; the PV binder binds it to the PV");
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            static_pvc("data", "8Mi", &pv_name),
        )
        .await;
    cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "claim bound",
            |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        )
        .await;
    story.done(
        "claim Bound",
        format!("PersistentVolumeClaim {}/data", cluster.namespace),
    );

    story.begin("a writing pod is created; scheduled, attached, staged, published, started");
    let node = cluster.node(NODE);
    let mut manifest = pod("writer", &node, Some("data"), true);
    manifest["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]);
    let created: Pod = cluster.create(&cluster.namespaced(), manifest).await;
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "writer",
            "pod running",
            is_running,
        )
        .await;
    let va = attachment_name(&handle, &driver, &node);
    story.done(
        "pod Running on node-b with its volume mounted",
        format!("Pod writer, VolumeAttachment {}…", &va[..16]),
    );

    story.begin("csi-attacher published the volume to node-b and recorded it");
    let attachment = cluster
        .cluster_scoped::<VolumeAttachment>()
        .get(&va)
        .await
        .expect("the VolumeAttachment");
    let attacher_finalizer = csi_attacher::attach::finalizer(&driver);
    assert!(attachment.status.as_ref().is_some_and(|s| s.attached));
    assert!(attachment.finalizers().contains(&attacher_finalizer));
    let node_id = attachment
        .annotations()
        .get(csi_kinds::volume_attachment::NODE_ID_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .expect("the PV");
    assert!(pv.finalizers().contains(&attacher_finalizer));
    story.done(
        "ControllerPublishVolume done: attached, finalizer on VA and PV, node ID annotated",
        format!("{attacher_finalizer}, node-id {node_id}"),
    );

    let target = target_path(
        &cluster.driver.kubelet_dir(&node),
        &created.uid().unwrap_or_default(),
        &pv_name,
        false,
    );
    let log = target.join("writer.log");
    story.begin("the pod writes to its volume");
    cluster.eventually("writes", || file_size(&log) > 0).await;
    story.done("records appended", format!("writer.log on {node}"));

    story.begin("node-b is cut off the control plane (its writer keeps running)");
    cluster.kubelet(&node).partition();
    cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &node,
            "unreachable taints",
            |n| taint_effects(n, "node.kubernetes.io/unreachable") == ["NoExecute", "NoSchedule"],
        )
        .await;
    story.done(
        "node Unknown, tainted unreachable (NoSchedule + NoExecute)",
        format!("Node {node}"),
    );

    story.begin("the zombie writer on the partitioned node is still writing");
    let before = file_size(&log);
    cluster
        .eventually("zombie writes", || file_size(&log) > before)
        .await;
    story.done(
        "writes continue during the partition (fencing is podmon's job: its chapter follows)",
        format!("writer.log on {node}"),
    );

    story.begin("node-b reconnects");
    cluster.kubelet(&node).heal();
    cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &node,
            "taints cleared",
            |n| taint_effects(n, "node.kubernetes.io/unreachable").is_empty(),
        )
        .await;
    story.done("node Ready again, taints removed", format!("Node {node}"));

    story.begin("the pod is deleted; its kubelet unpublishes and unstages, then removes it");
    cluster
        .namespaced::<Pod>()
        .delete("writer", &DeleteParams::default())
        .await
        .expect("delete pod");
    cluster
        .wait_gone(&cluster.namespaced::<Pod>(), "writer", "pod gone")
        .await;
    assert!(!target.exists(), "unpublished");
    story.done("volume unmounted, pod removed", "Pod writer");

    story.begin(
        "the attach/detach controller deletes the VolumeAttachment; csi-attacher unpublishes, then releases it",
    );
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &va,
            "VolumeAttachment deleted",
        )
        .await;
    story.done(
        "ControllerUnpublishVolume done, VolumeAttachment gone",
        format!("VolumeAttachment {}…", &va[..16]),
    );

    story.begin("the claim is deleted; the Retain PV is Released");
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    let pv = cluster
        .wait_for(
            &cluster.cluster_scoped::<PersistentVolume>(),
            &pv_name,
            "PV released",
            |pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"),
        )
        .await;
    story.done(
        "PV Released (Retain keeps the data)",
        format!("PersistentVolume {}", pv.name_any()),
    );

    println!("\nChapter: dynamic provisioning with csi-provisioner.\n");
    story.begin("csi-provisioner starts; a WaitForFirstConsumer class and a claim are created");
    let provisioner = cluster.start_provisioner().await;
    let class_name = format!("{}-local", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": class_name}, "provisioner": driver, "volumeBindingMode": "WaitForFirstConsumer"}),
        )
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            json!({"metadata": {"name": "dynamic"}, "spec": {"storageClassName": class_name, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "4Mi"}}}}),
        )
        .await;
    story.done(
        "claim waits for its first consumer",
        format!("StorageClass {class_name}"),
    );

    story.begin(
        "a pod uses it: the scheduler selects node-a, the provisioner creates the volume there",
    );
    cluster
        .create(
            &cluster.namespaced::<Pod>(),
            pod("consumer", &cluster.node("node-a"), Some("dynamic"), true),
        )
        .await;
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "consumer",
            "pod running",
            is_running,
        )
        .await;
    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("dynamic")
        .await
        .expect("claim");
    let dynamic_pv = claim.spec.and_then(|s| s.volume_name).unwrap_or_default();
    story.done(
        "volume provisioned on node-a, bound, mounted, pod Running",
        format!("PersistentVolume {dynamic_pv}"),
    );

    story.begin("pod and claim are deleted: the volume is unmounted, detached and deleted");
    cluster
        .namespaced::<Pod>()
        .delete("consumer", &DeleteParams::default())
        .await
        .expect("delete pod");
    cluster
        .wait_gone(&cluster.namespaced::<Pod>(), "consumer", "pod gone")
        .await;
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .delete("dynamic", &DeleteParams::default())
        .await
        .expect("delete claim");
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<PersistentVolume>(),
            &dynamic_pv,
            "PV deleted",
        )
        .await;
    story.done(
        "volume deleted at the driver, PV gone",
        format!("PersistentVolume {dynamic_pv}"),
    );

    snapshot_chapter(&mut story, &cluster).await;
    group_snapshot_chapter(&mut story, &cluster).await;
    backup_chapter(&mut story, &cluster).await;
    health_chapter(&mut story, &cluster).await;
    failover_chapter(&mut story, &cluster).await;
    object_storage_chapter(&mut story, &cluster).await;

    provisioner.stop().await;
    attacher.stop().await;
    cluster.stop().await;
    story.table();
}

/// csi-resizer, the snapshot-controller and csi-snapshotter: a mounted volume grows, is
/// snapshotted while its pod writes, and is restored on another node with the data.
async fn snapshot_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: expand a mounted volume, snapshot it, restore it elsewhere.\n");
    story.begin("csi-resizer, the snapshot-controller and csi-snapshotter start; a pod writes to a 2Mi claim on node-a");
    install_snapshot_crds(&cluster.client).await;
    let resizer = cluster.start_resizer().await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let class_name = format!("{}-grow", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": class_name}, "provisioner": cluster.driver_name,
                "volumeBindingMode": "Immediate", "allowVolumeExpansion": true}),
        )
        .await;
    let snapshot_class = format!("{}-snapshots", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeSnapshotClass>(),
            json!({"metadata": {"name": snapshot_class,
                    "annotations": {"snapshot.storage.kubernetes.io/is-default-class": "true"}},
                "driver": cluster.driver_name, "deletionPolicy": "Delete"}),
        )
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("grow", &class_name)).await;
    let pods = cluster.namespaced::<Pod>();
    cluster
        .create(
            &pods,
            pod("writer", &cluster.node("node-a"), Some("grow"), true),
        )
        .await;
    cluster
        .wait_for(&pods, "writer", "the writer Running", is_running)
        .await;
    story.done(
        "the writer Running on its volume",
        "PersistentVolumeClaim grow",
    );

    story.begin(
        "the claim asks for 4Mi while mounted: ControllerExpandVolume, the PV and the claim grow",
    );
    claims
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "4Mi"}}}})),
        )
        .await
        .expect("the new request");
    cluster
        .wait_for(&claims, "grow", "the claim's capacity 4Mi", |c| {
            c.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .is_some_and(|q| q.0 == "4Mi")
        })
        .await;
    story.done(
        "expanded online, the pod still Running",
        "PersistentVolumeClaim grow: 4Mi",
    );

    story.begin("a VolumeSnapshot of the claim in use: the controller makes its content, the sidecar cuts it");
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "grow-snap"},
                "spec": {"source": {"persistentVolumeClaimName": "grow"}}}),
        )
        .await;
    let snapshot = cluster
        .wait_for(&snapshots, "grow-snap", "the snapshot ready", |s| {
            s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
        })
        .await;
    let status = snapshot.status.unwrap_or_default();
    story.done(
        "snapshot ready (the default class of the driver was chosen)",
        format!(
            "VolumeSnapshot grow-snap → {} ({})",
            status
                .bound_volume_snapshot_content_name
                .unwrap_or_default(),
            status.restore_size.map(|q| q.0).unwrap_or_default()
        ),
    );

    story.begin("restored as a new claim, read by a pod on node-b");
    let mut restored = claim("grow-restored", &class_name);
    restored["spec"]["resources"]["requests"]["storage"] = json!("4Mi");
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "grow-snap"});
    cluster.create(&claims, restored).await;
    cluster
        .wait_for(&claims, "grow-restored", "the restored claim Bound", bound)
        .await;
    let records = read_records(cluster, "grow-restored").await.lines().count();
    assert!(records > 0, "the restored volume has the writer's records");
    story.done(
        "the restore has the data written before the snapshot",
        format!("PersistentVolumeClaim grow-restored: {records} records"),
    );

    story.begin("snapshot, pod and claims deleted: the snapshot goes from the driver too");
    cluster
        .delete_and_wait(&snapshots, "grow-snap", "the snapshot deleted")
        .await;
    cluster
        .delete_and_wait(&pods, "writer", "the writer gone")
        .await;
    for name in ["grow-restored", "grow"] {
        cluster
            .delete_and_wait(&claims, name, "the claim deleted")
            .await;
    }
    cluster
        .cluster_scoped::<VolumeSnapshotClass>()
        .delete(&snapshot_class, &DeleteParams::default())
        .await
        .expect("delete the snapshot class");
    story.done(
        "cleaned up",
        format!("VolumeSnapshotClass {snapshot_class}"),
    );
    snapshotter.stop().await;
    controller.stop().await;
    resizer.stop().await;
}

/// The snapshot-controller and csi-snapshotter with volume group snapshots: two claims of a
/// database, written by pods, are cut together by one CreateVolumeGroupSnapshot; each gets a
/// member VolumeSnapshot, one restores on another node with its data, and deleting the group
/// deletes its members and the driver's group snapshot.
async fn group_snapshot_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: snapshot a database's two volumes together, restore one.\n");
    story.begin("two claims of a database (app=db) written by pods; a VolumeGroupSnapshotClass");
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let class_name = format!("{}-db", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": class_name}, "provisioner": cluster.driver_name,
                "volumeBindingMode": "Immediate"}),
        )
        .await;
    let group_class = format!("{}-groups", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeGroupSnapshotClass>(),
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "kind": "VolumeGroupSnapshotClass",
                "metadata": {"name": group_class,
                    "annotations": {"groupsnapshot.storage.kubernetes.io/is-default-class": "true"}},
                "driver": cluster.driver_name, "deletionPolicy": "Delete"}),
        )
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for name in ["db-data", "db-log"] {
        let mut labelled = claim(name, &class_name);
        labelled["metadata"]["labels"] = json!({"app": "db"});
        cluster.create(&claims, labelled).await;
        write_records(cluster, name).await;
    }
    story.done(
        "both claims Bound with records written",
        "PersistentVolumeClaims db-data, db-log",
    );

    story.begin("a VolumeGroupSnapshot selects app=db: the group is cut at once, one member snapshot per claim");
    let groups = cluster.namespaced::<VolumeGroupSnapshot>();
    cluster
        .create(
            &groups,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "db"},
                "spec": {"source": {"selector": {"matchLabels": {"app": "db"}}}}}),
        )
        .await;
    let group = cluster
        .wait_for(&groups, "db", "the group ready", |g| {
            g.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
        })
        .await;
    let uid = group.uid().unwrap_or_default();
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    let members: Vec<VolumeSnapshot> = snapshots
        .list(&Default::default())
        .await
        .expect("listing snapshots")
        .items
        .into_iter()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .collect();
    assert_eq!(members.len(), 2, "one member snapshot per claim");
    let member_of = |claim: &str| {
        members
            .iter()
            .find(|m| m.spec.source.persistent_volume_claim_name.as_deref() == Some(claim))
            .map(|m| m.name_any())
            .expect("a member of each claim")
    };
    let data_member = member_of("db-data");
    story.done(
        "the group ready with its members (the default group class was chosen)",
        format!(
            "VolumeGroupSnapshot db → {} ({} members)",
            group
                .status
                .and_then(|s| s.bound_volume_group_snapshot_content_name)
                .unwrap_or_default(),
            members.len()
        ),
    );

    story.begin("db-data's member restored as a new claim, read by a pod on node-b");
    let mut restored = claim("db-restored", &class_name);
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": data_member});
    cluster.create(&claims, restored).await;
    cluster
        .wait_for(&claims, "db-restored", "the restored claim Bound", bound)
        .await;
    let records = read_records(cluster, "db-restored").await.lines().count();
    assert!(records > 0, "the restored member has db-data's records");
    story.done(
        "the restore has the data written before the group was cut",
        format!("PersistentVolumeClaim db-restored: {records} records"),
    );

    story.begin("the group deleted: its member snapshots and the driver's group snapshot go");
    cluster
        .delete_and_wait(&groups, "db", "the group deleted")
        .await;
    for member in &members {
        cluster
            .wait_gone(&snapshots, &member.name_any(), "the member snapshot gone")
            .await;
    }
    for name in ["db-restored", "db-data", "db-log"] {
        cluster
            .delete_and_wait(&claims, name, "the claim deleted")
            .await;
    }
    cluster
        .cluster_scoped::<VolumeGroupSnapshotClass>()
        .delete(&group_class, &DeleteParams::default())
        .await
        .expect("delete the group class");
    story.done(
        "cleaned up",
        format!("VolumeGroupSnapshotClass {group_class}"),
    );
    snapshotter.stop().await;
    controller.stop().await;
}
/// Changed block tracking: csi-snapshot-metadata serves the driver's SnapshotMetadata over TLS;
/// a backup application (a ServiceAccount allowed to read VolumeSnapshots, through
/// snapshot-metadata-lister's library) backs a block volume up in full from its first snapshot
/// (the allocated blocks, read from the snapshot restored as a volume), then incrementally from
/// the second (only the blocks changed since); both backups restored into an empty volume give
/// the volume's bytes back, checksum for checksum (the demo fails otherwise).
async fn backup_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: back a block volume up in full, then incrementally, and restore it.\n");
    story.begin("csi-snapshot-metadata starts (TLS), with the driver's SnapshotMetadataService and a backup ServiceAccount");
    install_cbt_crds(&cluster.client).await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let metadata = cluster.start_snapshot_metadata().await;
    cluster.backup_accounts().await;
    let lister = Lister::new(cluster.client.clone());
    story.done(
        "serving; backup may get VolumeSnapshots, its tokens are for the service's audience",
        format!(
            "SnapshotMetadataService {} → {}",
            cluster.driver_name, metadata.service.spec.address
        ),
    );

    story.begin("a pod on node-a writes 8 MiB across a 64Mi block volume");
    let class = cluster
        .storage_class("cbt", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .create(&claims, block_claim("disk", &class, "64Mi"))
        .await;
    let disk = block_device(cluster, "db", "node-a", "disk").await;
    let writes: Vec<(u64, Vec<u8>)> = (0..8u8)
        .map(|i| (u64::from(i) * 8 * MIB, pattern(i, MIB)))
        .collect();
    write_blocks(&disk, &writes);
    story.done(
        "written through its block device",
        "PersistentVolumeClaim disk",
    );

    story.begin("VolumeSnapshot disk-1; the full backup reads the allocated blocks (GetMetadataAllocated) from it, restored");
    cut_snapshot(cluster, &cluster.namespace, "disk-1", "disk").await;
    let allocated = listed(&lister, cluster, "disk-1", None).await;
    let full = read_from_restore(cluster, &class, "disk-1", &allocated).await;
    story.done(
        "full backup",
        format!(
            "{} ranges, {} of 64Mi",
            allocated.len(),
            binary_si(bytes(&allocated))
        ),
    );

    story.begin("the pod writes again: 3 blocks of 4 KiB changed, one rewritten with the bytes it had; VolumeSnapshot disk-2");
    let changes = vec![
        (20 * KIB, pattern(101, 4 * KIB)),
        (24 * MIB + 512 * KIB, pattern(102, 4 * KIB)),
        (60 * MIB, pattern(103, 4 * KIB)),
        (40 * MIB, writes[5].1[..4096].to_vec()),
    ];
    write_blocks(&disk, &changes);
    cut_snapshot(cluster, &cluster.namespace, "disk-2", "disk").await;
    story.done("snapshot ready", "VolumeSnapshot disk-2");

    story.begin("the incremental backup reads only what changed since disk-1 (GetMetadataDelta), from disk-2 restored");
    let changed = listed(&lister, cluster, "disk-2", Some("disk-1")).await;
    let incremental = read_from_restore(cluster, &class, "disk-2", &changed).await;
    story.done(
        "incremental backup",
        format!(
            "{} ranges, {} read instead of {} (the full backup)",
            changed.len(),
            binary_si(bytes(&changed)),
            binary_si(bytes(&allocated))
        ),
    );

    story.begin("both backups restored into a new empty volume on node-c, checksums compared");
    cluster
        .create(&claims, block_claim("rebuilt", &class, "64Mi"))
        .await;
    let rebuilt = block_device(cluster, "restorer", "node-c", "rebuilt").await;
    write_blocks(&rebuilt, &full);
    write_blocks(&rebuilt, &incremental);
    let (want, got) = (checksum(&disk), checksum(&rebuilt));
    assert_eq!(
        got, want,
        "the volume rebuilt from the full and the incremental backup differs from the original"
    );
    story.done(
        "the rebuilt volume is the volume at disk-2",
        format!("sha256 {}", &got[..16]),
    );

    story.begin("snapshots, pods and claims deleted; csi-snapshot-metadata stops");
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    for name in ["disk-2", "disk-1"] {
        cluster
            .delete_and_wait(&snapshots, name, "the snapshot deleted")
            .await;
    }
    let pods = cluster.namespaced::<Pod>();
    for name in ["restorer", "db"] {
        cluster.delete_and_wait(&pods, name, "the pod gone").await;
    }
    for name in ["rebuilt", "disk"] {
        cluster
            .delete_and_wait(&claims, name, "the claim deleted")
            .await;
    }
    // The sidecar exits the process when its driver connection goes, as its binary does: the
    // link it has to the driver stays up for the rest of the demo.
    let _ = DRIVER_LINK.set(metadata.stop().await);
    snapshotter.stop().await;
    controller.stop().await;
    story.done("cleaned up", format!("StorageClass {class}"));
}

/// csi-snapshot-metadata's link to the driver, kept until the process exits.
static DRIVER_LINK: std::sync::OnceLock<csi_suite_scenarios::csi_proxy::CsiProxy> =
    std::sync::OnceLock::new();

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// `len` bytes that differ from block to block and from `seed` to `seed`.
fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i / 4096) as u8 ^ (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The byte ranges the backup application is told to read of `snapshot` (the allocated ones,
/// or with `base` the changed ones), read as the ServiceAccount `backup`.
async fn listed(
    lister: &Lister,
    cluster: &Cluster,
    snapshot: &str,
    base: Option<&str>,
) -> Vec<Range<u64>> {
    let query = Query {
        namespace: cluster.namespace.clone(),
        snapshot: snapshot.to_string(),
        previous: base.map(|name| Previous::Name(name.to_string())),
        starting_offset: 0,
        max_results: 0,
    };
    let account = ServiceAccountRef {
        namespace: cluster.namespace.clone(),
        name: BACKUP.to_string(),
    };
    let mut stream = lister
        .open(&query, Some(account), 600)
        .await
        .expect("the metadata stream");
    let mut ranges = Vec::new();
    while let Some(record) = stream.next().await.expect("a record") {
        for block in record.block_metadata {
            let start = u64::try_from(block.byte_offset).expect("an offset");
            ranges.push(start..start + u64::try_from(block.size_bytes).expect("a size"));
        }
    }
    joined(ranges)
}

fn bytes(ranges: &[Range<u64>]) -> i64 {
    ranges.iter().map(|r| (r.end - r.start) as i64).sum()
}

/// Restores `snapshot` as a new claim, reads `ranges` from it on node-b, and deletes it again.
async fn read_from_restore(
    cluster: &Cluster,
    class: &str,
    snapshot: &str,
    ranges: &[Range<u64>],
) -> Vec<(u64, Vec<u8>)> {
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let name = format!("{snapshot}-restore");
    let mut restore = block_claim(&name, class, "64Mi");
    restore["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": snapshot});
    cluster.create(&claims, restore).await;
    cluster
        .wait_for(&claims, &name, "the restored claim Bound", bound)
        .await;
    let reader = format!("{snapshot}-reader");
    let device = block_device(cluster, &reader, "node-b", &name).await;
    let backup = ranges
        .iter()
        .map(|r| (r.start, read_block(&device, r.start, r.end - r.start)))
        .collect();
    cluster
        .delete_and_wait(&cluster.namespaced::<Pod>(), &reader, "the reader gone")
        .await;
    cluster
        .delete_and_wait(&claims, &name, "the restored claim deleted")
        .await;
    backup
}

/// The SHA-256 of a whole device, in hex.
fn checksum(device: &std::path::Path) -> String {
    use sha2::Digest;
    let mut file = std::fs::File::open(device).expect("the device");
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).expect("reading the device");
    hex::encode(hasher.finalize())
}

/// csi-health-monitor: a volume's data moved away behind the driver's back, the claim's Event,
/// no repeat, the recovery's Event.
async fn health_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: a volume goes bad behind the driver's back; its claim says so, once.\n");
    story.begin("a bound claim; csi-health-monitor checking the driver's volumes every second");
    let pv = static_claim(cluster, "health-data").await;
    let handle = handle_of(cluster, &pv).await;
    let data = csi_hostpath::state::Store::open(&cluster.driver.state_dir)
        .expect("the driver's state")
        .volume_data(&handle, csi_hostpath::state::Layout::Directory);
    let away = data.with_extension("away");
    let monitor = cluster
        .start_health_monitor(Duration::from_secs(1), false)
        .await;
    story.done(
        "claim bound, monitor running",
        format!("claim health-data, PV {pv}"),
    );

    story.begin("the volume's data is moved away behind the driver's back");
    std::fs::rename(&data, &away).expect("the volume's data moved away");
    let message = cluster
        .wait_for_event("health-data", ABNORMAL, "VolumeDataMissing")
        .await;
    story.done("Warning VolumeConditionAbnormal on the claim", message);

    story.begin("three more passes with nothing new");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let told: Vec<i32> = cluster
        .events()
        .await
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("health-data"))
        .filter(|e| e.reason.as_deref() == Some(ABNORMAL))
        .map(|e| e.count.unwrap_or(1))
        .collect();
    assert_eq!(told, [1], "the condition is told once");
    story.done("not repeated", "one VolumeConditionAbnormal, count 1");

    story.begin("the data comes back");
    std::fs::rename(&away, &data).expect("the volume's data moved back");
    let message = cluster
        .wait_for_event("health-data", NORMAL, RECOVERED)
        .await;
    story.done("Normal VolumeConditionNormal on the claim", message);
    monitor.stop().await;
}

/// podmon: node failure → fence → failover → heal, with the data proof. Returns the PV it used.
async fn failover_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: failover of a stateful pod with podmon.\n");
    // The zombie's writes are I/O the driver sees: skipArrayConnectionValidation with the
    // unreachable NoExecute taint lets the failover go on (Dell's setting for this case).
    let controller = cluster
        .start_podmon_controller(|_, t| t.skip_validation = true)
        .await;
    let mut node_agents = Vec::new();
    for node in &cluster.nodes {
        node_agents.push(cluster.start_podmon_node(node).await);
    }
    failover_story(
        cluster,
        &cluster.node("node-a"),
        |narration| match narration {
            Narration::Begin(what) => story.begin(what),
            Narration::Done(what, object) => story.done(what, object),
        },
    )
    .await;
    cluster
        .delete_and_wait(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the replacement deleted",
        )
        .await;
    for agent in node_agents {
        agent.stop().await;
    }
    controller.sidecar.stop().await;
}

/// COSI: a bucket for a workload on a real S3 server (moto, IAM enforced), credentials in a
/// Secret, revoked with their BucketAccess, the bucket deleted with its claim.
async fn object_storage_chapter(story: &mut Story, cluster: &Cluster) {
    println!("\nChapter: a bucket for a workload with COSI.\n");
    story.begin("the COSI CRDs, cosi-controller, cosi-s3 on a local S3 server, cosi-provisioner");
    install_cosi_crds(&cluster.client).await;
    let controller = cluster.start_cosi_controller();
    let Some(driver) = CosiDriver::start(cluster).await else {
        panic!("the COSI chapter needs moto: make demo installs it (scripts/install-moto.sh)");
    };
    let admin = driver.moto.admin.clone();
    let classes = cluster.cluster_scoped::<BucketClass>();
    let bucket_class = format!("{}-buckets", cluster.namespace);
    cluster
        .create(
            &classes,
            json!({"metadata": {"name": bucket_class}, "driverName": driver.name, "deletionPolicy": "Delete"}),
        )
        .await;
    let access_class = format!("{}-keys", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<BucketAccessClass>(),
            json!({"metadata": {"name": access_class}, "driverName": driver.name, "authenticationType": "Key"}),
        )
        .await;
    story.done(
        "COSI is served, the driver named itself",
        format!("BucketClass {bucket_class}, driver {}", driver.name),
    );

    story.begin("a BucketClaim: the controller makes its Bucket, the sidecar the bucket");
    let claims = cluster.namespaced::<BucketClaim>();
    let photos = claim_ready(
        cluster,
        &claims,
        "photos",
        json!({"bucketClassName": bucket_class}),
    )
    .await;
    let bucket_id = bucket_id_of(cluster, &cluster.cluster_scoped(), &photos).await;
    story.done("the claim is ready", format!("bucket {bucket_id}"));

    story.begin("a BucketAccess: credentials minted, in a Secret the workload reads");
    let accesses = cluster.namespaced::<BucketAccess>();
    let workload = access_ready(
        cluster,
        &accesses,
        &cluster.namespaced(),
        "photos",
        "uploader",
        &access_class,
        &admin,
    )
    .await;
    workload
        .put_object(&bucket_id, "cat.jpg", b"meow")
        .await
        .expect("the workload writes");
    let read = workload
        .get_object(&bucket_id, "cat.jpg")
        .await
        .expect("the workload reads");
    assert_eq!(&read[..], b"meow");
    story.done(
        "the workload wrote and read an object with its own key",
        "Secret uploader-creds (BucketInfo)",
    );

    story.begin("the BucketAccess is deleted: the key is revoked at the S3 server");
    cluster
        .delete_and_wait(&accesses, "uploader", "the access revoked")
        .await;
    let refused = workload
        .get_object(&bucket_id, "cat.jpg")
        .await
        .expect_err("a revoked key is refused");
    story.done(
        "the same credentials are refused now",
        format!("S3 answered {}", refused.code().unwrap_or("an error")),
    );

    story.begin("the BucketClaim is deleted: with policy Delete the bucket goes too");
    cluster
        .delete_and_wait(&claims, "photos", "the claim deleted")
        .await;
    let gone = admin
        .list_objects(&bucket_id)
        .await
        .expect_err("the bucket is gone");
    story.done(
        "bucket deleted with its objects",
        format!("S3 answered {}", gone.code().unwrap_or("an error")),
    );
    classes
        .delete(&bucket_class, &DeleteParams::default())
        .await
        .expect("delete the class");
    cluster
        .cluster_scoped::<BucketAccessClass>()
        .delete(&access_class, &DeleteParams::default())
        .await
        .expect("delete the access class");
    driver.stop().await;
    controller.stop().await;
}
