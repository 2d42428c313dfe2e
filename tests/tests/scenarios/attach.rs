//! csi-attacher against the reference driver (through a recording proxy, so every
//! ControllerPublish/Unpublish that reached the driver is counted) and kube-sim's
//! attach-detach controller and kubelets: attach → mount, detach → release, errors in status
//! with retries, a deleted node, trivial mode, the ListVolumes reconcile, API conflicts and a
//! kill between publish and status. Scenarios that create VolumeAttachments themselves use
//! their own driver name, so they can share a real cluster.

use std::time::Duration;

use csi_attacher::attach::finalizer;
use csi_kinds::volume_attachment::NODE_ID_ANNOTATION;
use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::csi_proxy::CsiProxy;
use csi_suite_scenarios::fixtures::{
    is_running, pod, provision_static_volume, running_pod_with_static_volume, static_pv, static_pvc,
};
use csi_suite_scenarios::{Cluster, Options, Sidecar, skip_without_root};
use http::StatusCode;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use prost::Message;
use serde_json::json;

fn attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

fn attach_error(va: &VolumeAttachment) -> Option<(String, Option<i32>)> {
    let error = va.status.as_ref()?.attach_error.as_ref()?;
    let value = serde_json::to_value(error).ok()?;
    Some((
        error.message.clone().unwrap_or_default(),
        value
            .get("errorCode")
            .and_then(|c| c.as_i64())
            .and_then(|c| i32::try_from(c).ok()),
    ))
}

/// The attacher for `cluster`, talking to the driver through a recording proxy.
async fn attacher_through_proxy(cluster: &Cluster) -> (CsiProxy, Sidecar) {
    let (proxy, csi) = cluster.csi_proxy().await;
    let attacher = cluster.start_attacher_via(csi, |_| {}).await;
    (proxy, attacher)
}

/// A static PV (and its volume at the driver) named after the scenario, reserved for the
/// claim `name` of the scenario's namespace; returns its name and volume handle.
async fn static_volume(cluster: &Cluster, name: &str) -> (String, String) {
    let pv_name = format!("{}-{name}", cluster.namespace);
    let handle = provision_static_volume(&cluster.driver.controller.csi, &pv_name, 1 << 20).await;
    let claim = Some((cluster.namespace.as_str(), name));
    cluster
        .create(
            &cluster.cluster_scoped::<PersistentVolume>(),
            static_pv(&pv_name, &cluster.driver_name, &handle, "1Mi", claim),
        )
        .await;
    (pv_name, handle)
}

/// A VolumeAttachment as the attach-detach controller writes it.
async fn create_attachment(cluster: &Cluster, name: &str, node: &str, pv: &str) {
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            json!({"metadata": {"name": name}, "spec": {"attacher": cluster.driver_name,
                "nodeName": node, "source": {"persistentVolumeName": pv}}}),
        )
        .await;
}

/// The driver loses the attachment of `handle` to `node_id` behind Kubernetes' back.
async fn lose_attachment(cluster: &Cluster, handle: &str, node_id: &str) {
    cluster
        .driver
        .controller
        .csi
        .controller_unpublish_volume(
            csi::ControllerUnpublishVolumeRequest {
                volume_id: handle.to_string(),
                node_id: node_id.to_string(),
                secrets: Default::default(),
            },
            Duration::from_secs(10),
        )
        .await
        .expect("an out-of-band unpublish");
}

async fn wait_attached(cluster: &Cluster, name: &str) -> VolumeAttachment {
    cluster
        .wait_for(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            name,
            "the VolumeAttachment attached",
            attached,
        )
        .await
}

/// The node IDs the driver reports `handle` published to (ListVolumes).
async fn published_nodes(cluster: &Cluster, handle: &str) -> Vec<String> {
    cluster
        .listed_volumes()
        .await
        .into_iter()
        .filter(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == handle))
        .flat_map(|e| e.status.map(|s| s.published_node_ids).unwrap_or_default())
        .collect()
}

async fn node_id(cluster: &Cluster, node: &str) -> String {
    let csi_node = cluster
        .cluster_scoped::<CSINode>()
        .get(node)
        .await
        .expect("the CSINode");
    csi_node
        .spec
        .drivers
        .iter()
        .find(|d| d.name == cluster.driver_name)
        .map(|d| d.node_id.clone())
        .expect("the driver in the CSINode")
}

/// Deletes a VolumeAttachment and waits until the attacher detached and released it.
async fn detach(cluster: &Cluster, name: &str) {
    cluster
        .delete_and_wait(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            name,
            "the VolumeAttachment detached",
        )
        .await;
}

/// ControllerPublishVolume and ControllerUnpublishVolume calls that reached the driver.
fn publishes_and_unpublishes(proxy: &CsiProxy) -> (usize, usize) {
    (
        proxy.forwarded("ControllerPublishVolume"),
        proxy.forwarded("ControllerUnpublishVolume"),
    )
}

fn options(driver: &str) -> Options {
    Options {
        driver_name: driver.to_string(),
        ..Options::default()
    }
}

#[tokio::test]
async fn attach_publishes_for_the_pod_and_detach_releases_the_volume() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("attach").await;
    let ours = finalizer(&cluster.driver_name);
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let (_, pv_name, target) =
        running_pod_with_static_volume(&cluster, "app", &cluster.node("node-b"), |_| {}).await;
    assert!(target.exists(), "mounted at the pod's target path");

    let vas = cluster
        .cluster_scoped::<VolumeAttachment>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let va = vas
        .items
        .iter()
        .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()))
        .expect("the attach-detach controller's VolumeAttachment");
    let va_name = va.name_any();
    assert!(attached(va));
    assert_eq!(
        va.finalizers(),
        std::slice::from_ref(&ours),
        "our finalizer on the VA"
    );
    assert_eq!(
        va.annotations().get(NODE_ID_ANNOTATION),
        Some(&node_id(&cluster, &cluster.node("node-b")).await),
        "the node ID the volume was published to"
    );
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    let pv = pvs.get(&pv_name).await.unwrap();
    assert!(pv.finalizers().contains(&ours), "our finalizer on the PV");
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 1);

    cluster
        .delete_and_wait(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod deleted and unmounted",
        )
        .await;
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &va_name,
            "the VolumeAttachment detached and removed",
        )
        .await;
    assert_eq!(
        publishes_and_unpublishes(&proxy),
        (1, 1),
        "one publish, one unpublish"
    );
    let pv = pvs.get(&pv_name).await.unwrap();
    assert!(
        pv.finalizers().contains(&ours),
        "a live PV keeps the finalizer, as upstream"
    );

    cluster
        .delete_and_wait(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "app",
            "the claim",
        )
        .await;
    cluster
        .delete_and_wait(&pvs, &pv_name, "the PV released by the attacher")
        .await;
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn attach_errors_are_reported_in_status_and_retried_until_attached() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("attach-error").await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    proxy.fail_with(Some((tonic::Code::Unavailable, "driver restarting")));
    let (pv_name, _) = static_volume(&cluster, "app").await;
    let _: PersistentVolumeClaim = cluster
        .create(&cluster.namespaced(), static_pvc("app", "1Mi", &pv_name))
        .await;
    let _: Pod = cluster
        .create(
            &cluster.namespaced(),
            pod("app", &cluster.node("node-a"), Some("app"), false),
        )
        .await;
    let vas = cluster.cluster_scoped::<VolumeAttachment>();
    let failing = || async {
        vas.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(&pv_name))
            // (The first error may be another: the CSINode can lag the driver's registration.)
            .find(|va| attach_error(va).is_some_and(|(m, _)| m.contains("driver restarting")))
    };
    cluster
        .eventually_async(
            "an attach error in the VolumeAttachment's status",
            || async { failing().await.is_some() },
        )
        .await;
    let va = failing().await.expect("the failing VolumeAttachment");
    let va_name = va.name_any();
    let (message, code) = attach_error(&va).unwrap();
    assert!(message.contains("Unavailable"), "{message}");
    if cluster.keeps_attach_error_code("errorCode").await {
        assert_eq!(code, Some(tonic::Code::Unavailable as i32), "errorCode");
    }
    assert!(!attached(&va));

    proxy.fail_with(None);
    let va = wait_attached(&cluster, &va_name).await;
    assert!(attach_error(&va).is_none(), "the error is cleared");
    assert!(
        proxy
            .calls()
            .iter()
            .filter(|c| c.failed && c.path.ends_with("/ControllerPublishVolume"))
            .count()
            >= 1
    );
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 1);
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod running",
            is_running,
        )
        .await;
    attacher.stop().await;
    cluster.stop().await;
}

/// A VolumeAttachment the attacher cannot attach carries upstream's text in `attachError`
/// (the attach/detach controller quotes it in the pod's Events), the first of several faults
/// in upstream's order (the access modes, then the Secret, then the node), and no finalizer
/// of ours, so it is deleted at once.
#[tokio::test]
async fn attach_refusals_read_as_upstream() {
    let cluster = Cluster::start_with("attach-refusals", options("a-refusals.io")).await;
    let attacher = cluster.start_attacher().await;
    let ns = cluster.namespace.clone();
    let ghost = format!("{ns}-ghost");
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    let volume = |name: &str, spec: serde_json::Value| {
        let mut pv = static_pv(name, &cluster.driver_name, name, "1Mi", None);
        for (key, value) in spec.as_object().into_iter().flatten() {
            pv["spec"][key] = value.clone();
        }
        pv
    };
    let secret_ref = json!({"name": "missing", "namespace": ns});
    let mut with_secret = volume(&format!("{ns}-secret"), json!({}));
    with_secret["spec"]["csi"]["controllerPublishSecretRef"] = secret_ref.clone();
    let mut bad_modes = volume(
        &format!("{ns}-modes"),
        json!({"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}),
    );
    bad_modes["spec"]["csi"]["controllerPublishSecretRef"] = secret_ref;
    for pv in [
        volume(&format!("{ns}-plain"), json!({})),
        with_secret,
        bad_modes,
    ] {
        let _: PersistentVolume = cluster.create(&pvs, pv).await;
    }
    // (VolumeAttachment, node, PV, upstream's attachError message)
    let cases = [
        (
            "missing-pv",
            cluster.node("node-a"),
            format!("{ns}-absent"),
            format!("persistentvolume \"{ns}-absent\" not found"),
        ),
        (
            "no-csinode",
            ghost.clone(),
            format!("{ns}-plain"),
            format!("csinode.storage.k8s.io \"{ghost}\" not found"),
        ),
        (
            "no-secret",
            ghost.clone(),
            format!("{ns}-secret"),
            format!("failed to load secret \"{ns}/missing\": secrets \"missing\" not found"),
        ),
        (
            "modes",
            ghost.clone(),
            format!("{ns}-modes"),
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
                .to_string(),
        ),
    ];
    let vas = cluster.cluster_scoped::<VolumeAttachment>();
    for (name, node, pv, _) in &cases {
        create_attachment(&cluster, &format!("{ns}-{name}"), node, pv).await;
    }
    for (name, _, _, message) in &cases {
        // (An informer that lags may give a transient refusal first: wait for the settled one.)
        let va = cluster
            .wait_for(&vas, &format!("{ns}-{name}"), message, |va| {
                attach_error(va).is_some_and(|(m, _)| &m == message)
            })
            .await;
        assert!(!attached(&va), "{name}");
        assert!(va.finalizers().is_empty(), "{name}: {:?}", va.finalizers());
    }
    for (name, _, _, _) in &cases {
        cluster
            .delete_and_wait(
                &vas,
                &format!("{ns}-{name}"),
                "the refused VolumeAttachment",
            )
            .await;
    }
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn attach_detach_of_a_volume_attachment_whose_node_was_deleted() {
    let cluster = Cluster::start_with(
        "attach-node-gone",
        Options {
            nodes: vec!["node-a".to_string(), "node-doomed".to_string()],
            ..options("a-gone.io")
        },
    )
    .await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let (pv_name, handle) = static_volume(&cluster, "vol").await;
    let va_name = format!("{}-doomed", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-doomed"), &pv_name).await;
    wait_attached(&cluster, &va_name).await;
    let doomed_id = node_id(&cluster, &cluster.node("node-doomed")).await;
    assert_eq!(
        published_nodes(&cluster, &handle).await,
        std::slice::from_ref(&doomed_id)
    );

    cluster.kubelet(&cluster.node("node-doomed")).stop().await;
    cluster
        .delete_and_wait(
            &cluster.cluster_scoped::<CSINode>(),
            &cluster.node("node-doomed"),
            "the CSINode",
        )
        .await;
    cluster
        .delete_and_wait(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-doomed"),
            "the Node",
        )
        .await;
    cluster
        .delete_and_wait(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &va_name,
            "the VolumeAttachment of the deleted node detached",
        )
        .await;
    let unpublished: Vec<csi::ControllerUnpublishVolumeRequest> = proxy
        .calls()
        .into_iter()
        .filter(|c| !c.failed && c.path.ends_with("/ControllerUnpublishVolume"))
        .filter_map(|c| csi::ControllerUnpublishVolumeRequest::decode(c.message).ok())
        .collect();
    assert_eq!(unpublished.len(), 1);
    assert_eq!(
        (
            unpublished[0].volume_id.as_str(),
            unpublished[0].node_id.as_str()
        ),
        (handle.as_str(), doomed_id.as_str()),
        "the node ID recorded on the VolumeAttachment"
    );
    assert!(published_nodes(&cluster, &handle).await.is_empty());
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn attach_trivial_mode_marks_attached_without_calling_the_driver() {
    let cluster = Cluster::start_with(
        "attach-trivial",
        Options {
            attach_required: false,
            ..options("a-trivial.io")
        },
    )
    .await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let (pv_name, handle) = static_volume(&cluster, "vol").await;
    let va_name = format!("{}-pv", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-a"), &pv_name).await;
    let inline_name = format!("{}-inline", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            json!({"metadata": {"name": inline_name}, "spec": {"attacher": cluster.driver_name,
                "nodeName": &cluster.node("node-a"), "source": {"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"],
                "csi": {"driver": cluster.driver_name, "volumeHandle": handle}}}}}),
        )
        .await;
    for name in [&va_name, &inline_name] {
        let va = wait_attached(&cluster, name).await;
        assert!(va.finalizers().is_empty(), "no finalizer in trivial mode");
    }
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    assert!(!pv.finalizers().contains(&finalizer(&cluster.driver_name)));
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 0);
    for name in [&va_name, &inline_name] {
        cluster
            .delete_and_wait(
                &cluster.cluster_scoped::<VolumeAttachment>(),
                name,
                "the VolumeAttachment removed at once",
            )
            .await;
    }
    assert_eq!(proxy.forwarded("ControllerUnpublishVolume"), 0);
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn attach_reconcile_publishes_again_what_the_driver_lost() {
    let cluster = Cluster::start_with("attach-reconcile", options("a-reconcile.io")).await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let (pv_name, handle) = static_volume(&cluster, "vol").await;
    let va_name = format!("{}-lost", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-a"), &pv_name).await;
    wait_attached(&cluster, &va_name).await;
    let id = node_id(&cluster, &cluster.node("node-a")).await;
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 1);

    lose_attachment(&cluster, &handle, &id).await;
    assert!(published_nodes(&cluster, &handle).await.is_empty());
    cluster
        .eventually("the reconcile published the volume again", || {
            proxy.forwarded("ControllerPublishVolume") == 2
        })
        .await;
    cluster
        .eventually_async("the driver has the attachment again", || async {
            published_nodes(&cluster, &handle).await == [id.clone()]
        })
        .await;
    // Reconcile passes list the driver's attachments: two more lists mean a whole pass ran
    // after the driver had the attachment again.
    let lists = proxy.forwarded("ListVolumes");
    cluster
        .eventually("two more reconcile passes", || {
            proxy.forwarded("ListVolumes") >= lists + 2
        })
        .await;
    assert_eq!(
        proxy.forwarded("ControllerPublishVolume"),
        2,
        "in step again: no more publishes"
    );
    assert!(
        wait_attached(&cluster, &va_name)
            .await
            .status
            .unwrap()
            .attached
    );
    detach(&cluster, &va_name).await;
    attacher.stop().await;
    cluster.stop().await;
}

/// Upstream reconciles with ListVolumes as soon as its caches are synced, then every
/// `--reconcile-sync`: an attacher restarted while the driver lost an attachment publishes it
/// again at once, not a period (1 minute by default) later.
#[tokio::test]
async fn attach_a_restarted_attacher_reconciles_at_once() {
    let cluster = Cluster::start_with("attach-reconcile-start", options("a-restart.io")).await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let hour = |settings: &mut csi_attacher::controller::Settings| {
        settings.reconcile_sync = Duration::from_secs(3600);
    };
    let attacher = cluster.start_attacher_via(csi.clone(), hour).await;
    let (pv_name, handle) = static_volume(&cluster, "vol").await;
    let va_name = format!("{}-lost", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-a"), &pv_name).await;
    wait_attached(&cluster, &va_name).await;
    attacher.stop().await;
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 1);

    let id = node_id(&cluster, &cluster.node("node-a")).await;
    lose_attachment(&cluster, &handle, &id).await;
    let attacher = cluster.start_attacher_via(csi, hour).await;
    cluster
        .eventually_async("the first reconcile published the volume again", || async {
            published_nodes(&cluster, &handle).await == [id.clone()]
        })
        .await;
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 2);
    detach(&cluster, &va_name).await;
    attacher.stop().await;
    cluster.stop().await;
}

/// Conflicts on every kind of write the attacher makes, and a driver that is briefly
/// unavailable: retried until attached and detached, with exactly one publish and one
/// unpublish reaching the driver.
#[tokio::test]
async fn attach_conflicts_and_driver_restarts_cause_no_duplicate_calls() {
    let options = Options {
        api_faults: true,
        ..options("a-conflict.io")
    };
    let cluster = Cluster::start_with("attach-conflicts", options).await;
    let faults = cluster.faults();
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let (pv_name, _) = static_volume(&cluster, "vol").await;
    faults.fail_next("PATCH", "persistentvolumes", StatusCode::CONFLICT, 2, None);
    faults.fail_next("PATCH", "volumeattachments", StatusCode::CONFLICT, 3, None);
    proxy.fail_with(Some((tonic::Code::Unavailable, "driver restarting")));
    let va_name = format!("{}-busy", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-a"), &pv_name).await;
    cluster
        .eventually("a publish refused by the restarting driver", || {
            proxy
                .calls()
                .iter()
                .any(|c| c.failed && c.path.ends_with("/ControllerPublishVolume"))
        })
        .await;
    proxy.fail_with(None);
    wait_attached(&cluster, &va_name).await;
    assert_eq!(proxy.forwarded("ControllerPublishVolume"), 1);

    faults.fail_next("PATCH", "volumeattachments", StatusCode::CONFLICT, 2, None);
    cluster
        .cluster_scoped::<VolumeAttachment>()
        .delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &va_name,
            "the VolumeAttachment detached",
        )
        .await;
    assert_eq!(publishes_and_unpublishes(&proxy), (1, 1));
    attacher.stop().await;
    cluster.stop().await;
}

/// Killed after the driver published but before the status says so: the next attacher
/// publishes again (idempotent) and marks the VolumeAttachment attached.
#[tokio::test]
async fn attach_converges_after_a_kill_between_publish_and_status() {
    let cluster = Cluster::start_with("attach-kill", options("a-kill.io")).await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    proxy.delay_responses(Some(("ControllerPublishVolume", Duration::from_secs(30))));
    let (pv_name, handle) = static_volume(&cluster, "vol").await;
    let va_name = format!("{}-killed", cluster.namespace);
    create_attachment(&cluster, &va_name, &cluster.node("node-a"), &pv_name).await;
    let id = node_id(&cluster, &cluster.node("node-a")).await;
    cluster
        .eventually_async("the driver published", || async {
            published_nodes(&cluster, &handle).await == [id.clone()]
        })
        .await;
    attacher.kill().await;
    let va = cluster
        .cluster_scoped::<VolumeAttachment>()
        .get(&va_name)
        .await
        .unwrap();
    assert!(!attached(&va), "killed before the status write");
    assert!(
        va.finalizers().contains(&finalizer(&cluster.driver_name)),
        "the finalizer went on before the publish"
    );

    proxy.delay_responses(None);
    let (proxy_after, restarted) = attacher_through_proxy(&cluster).await;
    wait_attached(&cluster, &va_name).await;
    assert_eq!(proxy_after.forwarded("ControllerPublishVolume"), 1);
    assert_eq!(published_nodes(&cluster, &handle).await, [id]);
    detach(&cluster, &va_name).await;
    restarted.stop().await;
    cluster.stop().await;
}

/// csi-attacher under a slow and failing API server: every request 50 ms late, its
/// VolumeAttachment writes throttled (429 with `Retry-After`) and failing (500, 503), PV writes
/// failing, and its watches cut, some resumes refused as expired (410 Gone, so it lists
/// again). Every VolumeAttachment is still attached with the volume published to its node,
/// then detached with the volume released and the finalizer gone; no volume stays published.
#[tokio::test]
async fn attach_survives_a_slow_and_failing_api_server() {
    const VOLUMES: usize = 6;
    let options = Options {
        api_faults: true,
        ..options("a-unreliable.io")
    };
    let cluster = Cluster::start_with("attach-unreliable", options).await;
    let (proxy, attacher) = attacher_through_proxy(&cluster).await;
    let node = cluster.node("node-a");
    let node_id = node_id(&cluster, &node).await;
    let mut volumes = Vec::new();
    for i in 0..VOLUMES {
        volumes.push(static_volume(&cluster, &format!("vol{i}")).await);
    }
    let faults = cluster.slow_and_failing_api(&[
        (
            "PATCH",
            "volumeattachments",
            StatusCode::TOO_MANY_REQUESTS,
            Some(1),
        ),
        (
            "PATCH",
            "volumeattachments",
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
        ),
        (
            "PATCH",
            "persistentvolumes",
            StatusCode::SERVICE_UNAVAILABLE,
            None,
        ),
    ]);
    let va_name = |i: usize| format!("{}-unreliable-{i}", cluster.namespace);
    for (i, (pv_name, _)) in volumes.iter().enumerate() {
        create_attachment(&cluster, &va_name(i), &node, pv_name).await;
        if i == VOLUMES / 2 {
            faults.expire_watch_resumes(2);
            faults.cut_watches();
        }
    }
    for i in 0..VOLUMES {
        wait_attached(&cluster, &va_name(i)).await;
    }
    for (_, handle) in &volumes {
        assert_eq!(
            published_nodes(&cluster, handle).await,
            std::slice::from_ref(&node_id)
        );
    }
    assert_eq!(faults.unspent(), [] as [String; 0], "every fault met");
    let (publishes, _) = publishes_and_unpublishes(&proxy);
    assert!(
        publishes >= VOLUMES,
        "every volume published: {publishes} calls"
    );

    faults.fail_next(
        "PATCH",
        "volumeattachments",
        StatusCode::INTERNAL_SERVER_ERROR,
        3,
        None,
    );
    faults.expire_watch_resumes(2);
    faults.cut_watches();
    let attachments = cluster.cluster_scoped::<VolumeAttachment>();
    for i in 0..VOLUMES {
        attachments
            .delete(&va_name(i), &DeleteParams::default())
            .await
            .unwrap();
    }
    for i in 0..VOLUMES {
        cluster
            .wait_gone(&attachments, &va_name(i), "the VolumeAttachment detached")
            .await;
    }
    for (_, handle) in &volumes {
        assert!(
            published_nodes(&cluster, handle).await.is_empty(),
            "{handle} released"
        );
    }
    assert_eq!(faults.unspent(), [] as [String; 0], "every fault met");
    let (_, unpublishes) = publishes_and_unpublishes(&proxy);
    assert!(unpublishes >= VOLUMES, "{unpublishes} unpublish calls");
    faults.set_latency(Duration::ZERO);
    attacher.stop().await;
    cluster.stop().await;
}
