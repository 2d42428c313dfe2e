//! csi-inventory on a live cluster: a volume whose Retain PV an administrator deleted and a
//! volume made straight at the driver show as orphaned (the first naming the claim it was
//! made for); a volume deleted behind its PV's back shows as missing; importing the first
//! gives a claim that a pod mounts with the old records, `--all-orphans` takes the rest, and
//! the inventory ends clean. Paging two entries at a time over 25 volumes finds every one,
//! snapshots are compared with VolumeSnapshotContents, and a volume whose data is gone is
//! reported abnormal from the driver's volume condition. A pod's CSI ephemeral inline volume
//! is not a finding while the pod exists; left behind after the pod is gone, it is an orphaned
//! ephemeral volume, which import never turns into a PV.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use csi_inventory::flags::{Command, InventoryArgs};
use csi_inventory::report::{Finding, Report, inline_volume_handle};
use csi_inventory::run::Inventory;
use csi_kinds::snapshot::VolumeSnapshotContent;
use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::fixtures::{
    claim, handle_of, install_snapshot_crds, pod, provision_static_volume, read_records, volume_of,
    write_records,
};
use csi_suite_scenarios::{Cluster, rbac, skip_without_root, step_timeout};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use serde_json::json;

fn args(cluster: &Cluster, command: &[&str]) -> InventoryArgs {
    let socket = cluster
        .driver
        .controller
        .endpoint
        .path()
        .display()
        .to_string();
    let argv = ["csi-inventory"]
        .into_iter()
        .chain(command.iter().copied())
        .chain(["--csi-address", &socket]);
    csi_grpc::flags::try_parse_from::<InventoryArgs, _, _>(argv).expect("valid flags")
}

/// The inventory as the chart's CronJob runs it: with its own RBAC (report) or, for imports,
/// an administrator's credentials.
async fn inventory(cluster: &Cluster, command: &[&str], client: kube::Client) -> Inventory {
    Inventory::connect(
        args(cluster, command).target(),
        client,
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .expect("the inventory connects")
}

async fn report(cluster: &Cluster, extra: &[&str]) -> Report {
    let mut command = vec!["report"];
    command.extend(extra);
    let client = cluster.component_client(rbac::INVENTORY);
    inventory(cluster, &command, client)
        .await
        .scan(&mut |_, _, _| {})
        .await
        .expect("a scan")
}

async fn import(cluster: &Cluster, command: &[&str]) -> String {
    let (imported, out) = try_import(cluster, command).await;
    imported.expect("imported");
    out
}

/// An import with an administrator's credentials: its outcome and what it printed.
async fn try_import(
    cluster: &Cluster,
    command: &[&str],
) -> (Result<(), csi_inventory::run::InventoryError>, String) {
    let parsed = args(cluster, command);
    let Command::Import(import) = &parsed.command else {
        panic!("an import")
    };
    let inventory = inventory(cluster, command, cluster.client.clone()).await;
    let mut out = Vec::new();
    let imported = inventory.import(import, &mut out).await;
    (imported, String::from_utf8(out).unwrap())
}

fn orphans(report: &Report) -> BTreeSet<String> {
    report
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::Orphaned { volume, .. } => Some(volume.id.clone()),
            _ => None,
        })
        .collect()
}

fn missing(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::Missing { pv, .. } => Some(pv.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn orphans_are_found_and_imported_and_lost_volumes_reported_missing() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("inventory").await;
    let _provisioner = cluster
        .start_provisioner_with(|settings| settings.extra_create_metadata = true)
        .await;
    let _attacher = cluster.start_attacher().await;
    let retained = cluster
        .storage_class("inventory", "Immediate", "Retain", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    let released = |pv: &PersistentVolume| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    };

    // A claim with records; the claim is deleted, and then its Retain PV: the volume stays.
    cluster.create(&claims, claim("source", &retained)).await;
    let old_pv = write_records(&cluster, "source").await;
    let source_volume = handle_of(&cluster, &old_pv).await;
    cluster
        .delete_and_wait(&claims, "source", "the source claim gone")
        .await;
    cluster
        .wait_for(&pvs, &old_pv, "the source PV Released", released)
        .await;
    cluster
        .delete_and_wait(
            &pvs,
            &old_pv,
            "the Released PV deleted by the administrator",
        )
        .await;
    // A volume made at the driver, never in the cluster.
    let direct = provision_static_volume(
        &cluster.driver.controller.csi,
        &format!("{}-direct", cluster.namespace),
        1 << 20,
    )
    .await;
    // A claim whose volume is deleted at the driver behind its PV's back.
    cluster.create(&claims, claim("lost", &retained)).await;
    cluster
        .wait_for(
            &claims,
            "lost",
            "the lost claim Bound",
            csi_suite_scenarios::fixtures::bound,
        )
        .await;
    let lost_pv = volume_of(&cluster, "lost").await;
    cluster
        .driver
        .controller
        .csi
        .delete_volume(
            csi::DeleteVolumeRequest {
                volume_id: handle_of(&cluster, &lost_pv).await,
                ..Default::default()
            },
            step_timeout(),
        )
        .await
        .expect("DeleteVolume at the driver");

    let found = report(&cluster, &[]).await;
    assert_eq!(
        orphans(&found),
        BTreeSet::from([source_volume.clone(), direct.clone()])
    );
    assert_eq!(missing(&found), vec![lost_pv.clone()]);
    let made_for = found.findings.iter().find_map(|f| match f {
        Finding::Orphaned { volume, claim } if volume.id == source_volume => claim.clone(),
        _ => None,
    });
    assert_eq!(
        made_for,
        Some(format!("{}/source", cluster.namespace)),
        "the orphan names the claim it was provisioned for"
    );
    let text = csi_inventory::render::text(&found);
    assert!(
        text.contains(&format!("{}/source", cluster.namespace)),
        "{text}"
    );
    assert!(text.contains(&lost_pv), "{text}");

    // Import the orphan for a new claim: bound to it, and a pod finds the records.
    let restored_pv = format!("{}-restored", cluster.namespace);
    let claim_ref = format!("{}/restored", cluster.namespace);
    let printed = import(
        &cluster,
        &[
            "import",
            &source_volume,
            "--name",
            &restored_pv,
            "--storage-class",
            &retained,
            "--claim",
            &claim_ref,
        ],
    )
    .await;
    assert!(
        printed.contains(&format!("persistentvolume/{restored_pv} created")),
        "{printed}"
    );
    cluster.delete_at_cleanup::<PersistentVolume>(None, &restored_pv);
    cluster.create(&claims, claim("restored", &retained)).await;
    assert_eq!(volume_of_bound(&cluster, "restored").await, restored_pv);
    assert!(
        read_records(&cluster, "restored").await.lines().count() > 0,
        "the imported volume has the records written before"
    );

    // The rest of the orphans, in one go.
    let printed = import(
        &cluster,
        &[
            "import",
            "--all-orphans",
            "--yes",
            "--storage-class",
            &retained,
        ],
    )
    .await;
    let created: Vec<&str> = printed
        .lines()
        .filter_map(|l| {
            l.strip_prefix("persistentvolume/")?
                .strip_suffix(" created")
        })
        .collect();
    assert_eq!(created.len(), 1, "{printed}");
    cluster.delete_at_cleanup::<PersistentVolume>(None, created[0]);
    let imported = pvs.get(created[0]).await.unwrap();
    assert_eq!(imported.spec.unwrap().csi.unwrap().volume_handle, direct);

    let after = report(&cluster, &[]).await;
    assert!(orphans(&after).is_empty(), "{:?}", after.findings);
    assert_eq!(missing(&after), vec![lost_pv.clone()]);

    // The administrator removes the lost volume's claim and PV: clean.
    cluster
        .delete_and_wait(&claims, "lost", "the lost claim gone")
        .await;
    cluster
        .wait_for(&pvs, &lost_pv, "the lost PV Released", released)
        .await;
    cluster
        .delete_and_wait(&pvs, &lost_pv, "the lost PV deleted")
        .await;
    let clean = report(&cluster, &[]).await;
    assert!(clean.is_clean(), "{:?}", clean.findings);
    cluster.stop().await;
}

async fn volume_of_bound(cluster: &Cluster, claim: &str) -> String {
    cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim,
            "the claim Bound",
            csi_suite_scenarios::fixtures::bound,
        )
        .await;
    volume_of(cluster, claim).await
}

#[tokio::test]
async fn paging_two_at_a_time_finds_every_volume_and_snapshots_are_compared() {
    let cluster = Cluster::start("inventory-paging").await;
    install_snapshot_crds(&cluster.client).await;
    let csi = &cluster.driver.controller.csi;
    let mut volumes = BTreeSet::new();
    for n in 0..25 {
        let name = format!("{}-page-{n}", cluster.namespace);
        volumes.insert(provision_static_volume(csi, &name, 1 << 20).await);
    }
    let source = volumes.first().cloned().unwrap();
    // One volume loses its data: the driver reports it abnormal.
    let sick = volumes.last().cloned().unwrap();
    let data = csi_hostpath::state::Store::open(&cluster.driver.state_dir)
        .expect("the driver's state")
        .volume_data(&sick, csi_hostpath::state::Layout::Directory);
    std::fs::remove_dir_all(&data).expect("the volume's data removed");
    let snapshot = csi
        .create_snapshot(
            csi::CreateSnapshotRequest {
                source_volume_id: source,
                name: format!("{}-snap", cluster.namespace),
                ..Default::default()
            },
            Duration::from_secs(30),
        )
        .await
        .expect("CreateSnapshot at the driver")
        .snapshot
        .unwrap()
        .snapshot_id;
    // A pre-provisioned content for a snapshot the driver does not have.
    let content = format!("{}-gone", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeSnapshotContent>(),
            json!({"metadata": {"name": content},
                "spec": {"driver": cluster.driver_name, "deletionPolicy": "Retain",
                    "source": {"snapshotHandle": "no-such-snapshot"},
                    "volumeSnapshotRef": {"name": "gone", "namespace": cluster.namespace}}}),
        )
        .await;
    cluster.delete_at_cleanup::<VolumeSnapshotContent>(None, &content);

    let inventory = inventory(
        &cluster,
        &["report", "--max-entries=2"],
        cluster.component_client(rbac::INVENTORY),
    )
    .await;
    let mut pages = 0;
    let found = inventory
        .scan(&mut |rpc, _, _| {
            if rpc == "ListVolumes" {
                pages += 1;
            }
        })
        .await
        .expect("a scan");
    assert_eq!(
        pages, 12,
        "25 volumes two at a time: 12 pages with a successor"
    );
    assert_eq!(found.volumes_on_storage, 25);
    assert_eq!(orphans(&found), volumes, "every volume found once");
    let snapshots: Vec<(&str, String)> = found
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::OrphanedSnapshot { snapshot } => Some(("orphaned", snapshot.id.clone())),
            Finding::MissingSnapshot { content, .. } => Some(("missing", content.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        snapshots,
        vec![("orphaned", snapshot), ("missing", content)]
    );
    cluster.stop().await;
}

/// The findings that name `volume`, by kind.
fn findings_of(report: &Report, volume: &str) -> Vec<&'static str> {
    report
        .findings
        .iter()
        .filter(|f| match f {
            Finding::Orphaned { volume: v, .. } | Finding::OrphanedEphemeral { volume: v } => {
                v.id == volume
            }
            Finding::Abnormal { volume_id, .. } => volume_id == volume,
            _ => false,
        })
        .map(Finding::kind)
        .collect()
}

#[tokio::test]
async fn an_inline_volume_is_in_use_while_its_pod_exists_and_orphaned_ephemeral_after() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("inventory-inline").await;
    let class = cluster
        .storage_class("inventory-inline", "Immediate", "Retain", json!({}))
        .await;
    let node = cluster.node("node-a");
    let pods = cluster.namespaced::<Pod>();
    let mut manifest = pod("inline", &node, None, false);
    manifest["spec"]["volumes"] = json!([{"name": "scratch",
        "csi": {"driver": cluster.driver_name}}]);
    manifest["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "scratch", "mountPath": "/scratch"}]);
    let created: Pod = cluster.create(&pods, manifest).await;
    let uid = created.uid().expect("the pod's UID");
    // The kubelet's NodePublishVolume of the pod's inline volume, as it sends it with the
    // CSIDriver's podInfoOnMount (kube-sim's kubelet mounts claims only).
    let handle = inline_volume_handle(&uid, "scratch");
    let target = kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(&node),
        &uid,
        "scratch",
        false,
    );
    std::fs::create_dir_all(target.parent().unwrap()).expect("the pod's volume directory");
    let context: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "inline"),
        (
            "csi.storage.k8s.io/pod.namespace",
            cluster.namespace.as_str(),
        ),
        ("csi.storage.k8s.io/pod.uid", uid.as_str()),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let publisher = &cluster.driver.node(&node).csi;
    publisher
        .node_publish_volume(
            csi::NodePublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: target.display().to_string(),
                volume_capability: Some(csi::VolumeCapability {
                    access_type: Some(
                        csi::volume_capability::AccessType::Mount(Default::default()),
                    ),
                    access_mode: Some(csi::volume_capability::AccessMode {
                        mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                    }),
                }),
                volume_context: context,
                ..Default::default()
            },
            step_timeout(),
        )
        .await
        .expect("NodePublishVolume of the inline volume");

    let in_use = report(&cluster, &[]).await;
    assert!(
        in_use.findings.is_empty(),
        "the pod's inline volume is no finding: {:?}",
        in_use.findings
    );
    assert_eq!(in_use.inline_volumes, 1);
    assert_eq!(
        in_use.volumes_on_storage, 1,
        "the driver lists the inline volume"
    );

    // The pod goes; its volume is left behind on purpose (no NodeUnpublishVolume).
    cluster
        .delete_and_wait(&pods, "inline", "the pod with the inline volume gone")
        .await;
    let left = report(&cluster, &[]).await;
    assert_eq!(findings_of(&left, &handle), vec!["orphanedEphemeral"]);
    assert!(orphans(&left).is_empty(), "{:?}", left.findings);
    let text = csi_inventory::render::text(&left);
    assert!(text.contains("ORPHANED EPHEMERAL"), "{text}");

    // Never imported: skipped by --all-orphans, refused by name.
    let (all, printed) = try_import(
        &cluster,
        &[
            "import",
            "--all-orphans",
            "--dry-run",
            "--storage-class",
            &class,
        ],
    )
    .await;
    all.expect("--all-orphans with only an inline volume");
    assert!(
        printed.contains(&format!(
            "skipped: volume {handle} is a CSI ephemeral inline volume"
        )),
        "{printed}"
    );
    assert!(printed.contains("no orphaned volumes"), "{printed}");
    let (one, printed) = try_import(
        &cluster,
        &[
            "import",
            &handle,
            "--name",
            "inline",
            "--storage-class",
            &class,
        ],
    )
    .await;
    let refused = one
        .expect_err("an inline volume is not imported")
        .to_string();
    assert!(refused.contains("CSI ephemeral inline volume"), "{refused}");
    assert!(printed.is_empty(), "{printed}");

    // The kubelet's late NodeUnpublishVolume deletes it: clean.
    publisher
        .node_unpublish_volume(
            csi::NodeUnpublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: target.display().to_string(),
            },
            step_timeout(),
        )
        .await
        .expect("NodeUnpublishVolume of the inline volume");
    let clean = report(&cluster, &[]).await;
    assert!(clean.is_clean(), "{:?}", clean.findings);
    cluster.stop().await;
}
