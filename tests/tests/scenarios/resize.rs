//! csi-resizer with the provisioner, the attacher and kube-sim's kubelets: a claim asks for
//! more, the driver's ControllerExpandVolume grows the volume, the PV and the claim record it;
//! an ext4 volume is then grown on the node by kubelet (NodeExpandVolume) — online while a pod
//! uses it, or when a pod next mounts it; a size the driver cannot give is reported and a
//! smaller request afterwards recovers. A driver that can modify but not expand gets the modify
//! controller alone, and a claim asking it for more is left alone.
//!
//! The reference driver grows a mounted ext4 filesystem with EXT4_IOC_RESIZE_FS, which needs
//! CAP_SYS_RESOURCE. Where the tests run without it (containers often drop it, root or not),
//! the ext4 scenarios check the other half of the story instead: the refusal is reported on
//! the pod (`FileSystemResizeFailed`), the claim keeps waiting for the node at its old
//! capacity, and the pod keeps running.

use std::time::Duration;

use csi_hostpath::export::can_resize_online;
use csi_proto::csi::v1 as csi;
use csi_resizer::flags::ResizerArgs;
use csi_resizer::run::RunError;
use csi_suite_scenarios::fixtures::{bound, driver_state, is_running, pod};
use csi_suite_scenarios::{
    Cluster, Options, Sidecar, report_skip, skip_without_root, step_timeout,
};
use http::StatusCode;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube_sim_harness::{free_address, http_get};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::volume_attributes::{attributes_class, current_class, modify_status, request_class};

/// The sidecars an expansion needs (the attacher too: ext4 volumes are published to nodes).
struct Controllers {
    _provisioner: Sidecar,
    _attacher: Sidecar,
    _resizer: Sidecar,
}

async fn controllers(cluster: &Cluster) -> Controllers {
    Controllers {
        _provisioner: cluster.start_provisioner().await,
        _attacher: cluster.start_attacher().await,
        _resizer: cluster.start_resizer().await,
    }
}

/// An Immediate class of the scenario's driver that allows expansion.
async fn expandable_class(
    cluster: &Cluster,
    suffix: &str,
    parameters: serde_json::Value,
) -> String {
    let name = format!("{}-{suffix}", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": name}, "provisioner": cluster.driver_name,
                "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
                "allowVolumeExpansion": true, "parameters": parameters}),
        )
        .await;
    name
}

/// A bound claim `name` of `class` asking for `size`; returns the name of its PV.
async fn bound_claim(cluster: &Cluster, name: &str, class: &str, size: &str) -> String {
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            json!({"metadata": {"name": name}, "spec": {"storageClassName": class,
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}),
        )
        .await;
    let claim = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            name,
            "the claim Bound",
            bound,
        )
        .await;
    claim.spec.and_then(|s| s.volume_name).expect("a bound PV")
}

async fn request(cluster: &Cluster, claim: &str, size: &str) {
    try_request(cluster, claim, size)
        .await
        .expect("the new request");
}

async fn try_request(cluster: &Cluster, claim: &str, size: &str) -> Result<(), kube::Error> {
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
        )
        .await
        .map(drop)
}

fn storage(
    capacity: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> String {
    capacity
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

fn claim_capacity(claim: &PersistentVolumeClaim) -> String {
    storage(claim.status.as_ref().and_then(|s| s.capacity.as_ref()))
}

fn condition_types(claim: &PersistentVolumeClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect()
}

async fn wait_pv_capacity(cluster: &Cluster, pv: &str, size: &str) {
    let want = size.to_string();
    cluster
        .wait_for(
            &cluster.cluster_scoped::<PersistentVolume>(),
            pv,
            &format!("the PV grown to {size}"),
            move |pv| storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())) == want,
        )
        .await;
}

async fn wait_claim_capacity(cluster: &Cluster, claim: &str, size: &str) -> PersistentVolumeClaim {
    let want = size.to_string();
    cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim,
            &format!("the claim's capacity {size}, no resize conditions"),
            move |c| claim_capacity(c) == want && condition_types(c).is_empty(),
        )
        .await
}

/// The size of the filesystem the driver reports for the pod's mount of `pv` (statvfs).
async fn filesystem_bytes(cluster: &Cluster, node: &str, pod: &Pod, pv: &PersistentVolume) -> i64 {
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .expect("CSI")
        .volume_handle
        .clone();
    let root = cluster.kubelet(node).root().to_path_buf();
    let target = kube_sim::roles::kubelet::target_path(
        &root,
        &pod.uid().unwrap_or_default(),
        &pv.name_any(),
        false,
    );
    let stats = cluster
        .driver
        .node(node)
        .csi
        .node_get_volume_stats(
            csi::NodeGetVolumeStatsRequest {
                volume_id: handle,
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            },
            Duration::from_secs(10),
        )
        .await
        .expect("NodeGetVolumeStats");
    stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .map(|u| u.total)
        .expect("a byte count")
}

/// A bound 16Mi claim `data` of an expandable ext4 class; returns its PV's name.
async fn ext4_claim(cluster: &Cluster) -> String {
    let parameters = json!({"csi.storage.k8s.io/fstype": "ext4"});
    let class = expandable_class(cluster, "ext4", parameters).await;
    bound_claim(cluster, "data", &class, "16Mi").await
}

/// The pod `app` on `node` with the claim `data` (writing to it or not), once Running.
async fn running_app(cluster: &Cluster, node: &str, writes: bool) -> Pod {
    let pods = cluster.namespaced::<Pod>();
    cluster
        .create(&pods, pod("app", node, Some("data"), writes))
        .await;
    cluster
        .wait_for(&pods, "app", "the pod Running", is_running)
        .await
}

/// Without CAP_SYS_RESOURCE: the node's refusal is an Event on the pod naming the missing
/// privilege, and the claim still waits for the node at `capacity`.
async fn refused_on_the_node(cluster: &Cluster, capacity: &str) {
    cluster
        .wait_for_event("app", "FileSystemResizeFailed", "CAP_SYS_RESOURCE")
        .await;
    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("data")
        .await
        .unwrap();
    assert_eq!(claim_capacity(&claim), capacity, "not grown on the node");
    assert!(
        condition_types(&claim).contains(&"FileSystemResizePending".to_string()),
        "still waiting for the node: {:?}",
        condition_types(&claim)
    );
}

/// A directory volume needs nothing from the node: the controller's expansion finishes the
/// claim, with upstream's Events, and nothing is left pending.
#[tokio::test]
async fn a_volume_the_node_need_not_grow_is_finished_by_the_controller() {
    let cluster = Cluster::start("resize-controller-only").await;
    let _controllers = controllers(&cluster).await;
    let class = expandable_class(&cluster, "dirs", json!({})).await;
    let pv = bound_claim(&cluster, "data", &class, "2Mi").await;

    request(&cluster, "data", "4Mi").await;
    wait_pv_capacity(&cluster, &pv, "4Mi").await;
    wait_claim_capacity(&cluster, "data", "4Mi").await;
    cluster
        .wait_for_event("data", "Resizing", "External resizer is resizing volume")
        .await;
    cluster
        .wait_for_event("data", "VolumeResizeSuccessful", "")
        .await;
    cluster.stop().await;
}

/// An ext4 volume a running pod uses: ControllerExpandVolume grows the image, the claim waits
/// for the node (FileSystemResizePending), kubelet grows the mounted filesystem, and the pod
/// keeps running.
#[tokio::test]
async fn a_mounted_ext4_volume_grows_online_with_its_pod_running() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("resize-online").await;
    let _controllers = controllers(&cluster).await;
    let pv_name = ext4_claim(&cluster).await;
    let node = cluster.node("node-a");
    let running = running_app(&cluster, &node, true).await;
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    let before = filesystem_bytes(&cluster, &node, &running, &pv).await;

    request(&cluster, "data", "32Mi").await;
    wait_pv_capacity(&cluster, &pv_name, "32Mi").await;
    cluster
        .wait_for_event("data", "FileSystemResizeRequired", "")
        .await;
    if can_resize_online() {
        wait_claim_capacity(&cluster, "data", "32Mi").await;
        cluster
            .wait_for_event(
                "data",
                "FileSystemResizeSuccessful",
                "NodeExpandVolume succeeded",
            )
            .await;
        let pv = cluster
            .cluster_scoped::<PersistentVolume>()
            .get(&pv_name)
            .await
            .unwrap();
        let after = filesystem_bytes(&cluster, &node, &running, &pv).await;
        assert!(
            after > before + (8 << 20),
            "the mounted filesystem grew from {before} to {after} bytes"
        );
    } else {
        refused_on_the_node(&cluster, "16Mi").await;
    }
    let still = cluster.namespaced::<Pod>().get("app").await.unwrap();
    assert!(is_running(&still), "the pod kept running");
    assert_eq!(still.uid(), running.uid(), "the same pod");
    cluster.stop().await;
}

/// An ext4 volume no pod uses: the controller's part is done at once and the claim keeps
/// FileSystemResizePending until a pod mounts the volume; then kubelet grows it.
#[tokio::test]
async fn an_unused_ext4_volume_grows_on_the_node_when_a_pod_mounts_it() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("resize-offline").await;
    let _controllers = controllers(&cluster).await;
    let pv_name = ext4_claim(&cluster).await;

    request(&cluster, "data", "32Mi").await;
    wait_pv_capacity(&cluster, &pv_name, "32Mi").await;
    let pending = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the claim waiting for the node",
            |c| condition_types(c).contains(&"FileSystemResizePending".to_string()),
        )
        .await;
    assert_eq!(claim_capacity(&pending), "16Mi", "not grown on a node yet");

    let node = cluster.node("node-a");
    let running = running_app(&cluster, &node, false).await;
    if can_resize_online() {
        wait_claim_capacity(&cluster, "data", "32Mi").await;
        let pv = cluster
            .cluster_scoped::<PersistentVolume>()
            .get(&pv_name)
            .await
            .unwrap();
        let bytes = filesystem_bytes(&cluster, &node, &running, &pv).await;
        assert!(
            bytes > 24 << 20,
            "the filesystem has the new size: {bytes} bytes"
        );
    } else {
        refused_on_the_node(&cluster, "16Mi").await;
    }
    cluster.stop().await;
}

/// A size the driver cannot give is reported on the claim; asking for less afterwards
/// (RecoverVolumeExpansionFailure) expands to that.
#[tokio::test]
async fn an_infeasible_size_is_reported_and_a_smaller_request_recovers() {
    let cluster = Cluster::start("resize-infeasible").await;
    let _controllers = controllers(&cluster).await;
    let class = expandable_class(&cluster, "dirs", json!({})).await;
    let pv = bound_claim(&cluster, "data", &class, "2Mi").await;

    request(&cluster, "data", "2Pi").await;
    cluster
        .wait_for_event("data", "VolumeResizeFailed", "")
        .await;
    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("data")
        .await
        .unwrap();
    assert_eq!(claim_capacity(&claim), "2Mi", "nothing expanded");

    // Lowering a request needs RecoverVolumeExpansionFailure (beta, on, from Kubernetes 1.32):
    // older API servers refuse it.
    match try_request(&cluster, "data", "3Mi").await {
        Err(kube::Error::Api(status)) if status.code == 422 => {
            report_skip(
                "an_infeasible_size_is_reported_and_a_smaller_request_recovers (recovery)",
                &format!(
                    "the API server refuses a smaller request: {}",
                    status.message
                ),
            );
            cluster.stop().await;
            return;
        }
        result => result.expect("a smaller request"),
    }
    wait_pv_capacity(&cluster, &pv, "3Mi").await;
    wait_claim_capacity(&cluster, "data", "3Mi").await;
    cluster.stop().await;
}

/// The capacity in bytes the driver reports for `handle` (ListVolumes).
async fn driver_capacity(cluster: &Cluster, handle: &str) -> i64 {
    cluster
        .listed_volumes()
        .await
        .into_iter()
        .filter_map(|e| e.volume)
        .find(|v| v.volume_id == handle)
        .map(|v| v.capacity_bytes)
        .expect("the volume at the driver")
}

/// csi-resizer under a slow and failing API server: every request 50 ms late, claim status
/// writes throttled (429 with `Retry-After`) and failing (503), PV writes failing (500), and
/// the watches cut, some resumes refused as expired (410 Gone). Every claim still grows: the
/// volume at the driver, its PV and the claim's capacity, with no resize condition left.
#[tokio::test]
async fn expansion_survives_a_slow_and_failing_api_server() {
    const CLAIMS: usize = 4;
    let cluster = Cluster::start_with("resize-unreliable", Options::with_api_faults()).await;
    let _controllers = controllers(&cluster).await;
    let class = expandable_class(&cluster, "unreliable", json!({})).await;
    let mut pvs = Vec::new();
    for i in 0..CLAIMS {
        pvs.push(bound_claim(&cluster, &format!("d{i}"), &class, "2Mi").await);
    }

    let faults = cluster.slow_and_failing_api(&[
        (
            "PATCH",
            "persistentvolumeclaims",
            StatusCode::TOO_MANY_REQUESTS,
            Some(1),
        ),
        (
            "PATCH",
            "persistentvolumeclaims",
            StatusCode::SERVICE_UNAVAILABLE,
            None,
        ),
        (
            "PATCH",
            "persistentvolumes",
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
        ),
    ]);
    for i in 0..CLAIMS {
        // On kube-sim the faults meet every client, the scenario's own requests too.
        let claim = format!("d{i}");
        cluster
            .eventually_async("the larger request taken", || async {
                try_request(&cluster, &claim, "4Mi").await.is_ok()
            })
            .await;
        if i == CLAIMS / 2 {
            faults.expire_watch_resumes(2);
            faults.cut_watches();
        }
    }
    for (i, pv) in pvs.iter().enumerate() {
        wait_pv_capacity(&cluster, pv, "4Mi").await;
        wait_claim_capacity(&cluster, &format!("d{i}"), "4Mi").await;
        let handle = cluster
            .cluster_scoped::<PersistentVolume>()
            .get(pv)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle)
            .expect("a CSI PV");
        assert!(
            driver_capacity(&cluster, &handle).await >= 4 << 20,
            "{pv} grown at the driver"
        );
    }
    assert_eq!(faults.unspent(), [] as [String; 0], "every fault met");
    faults.set_latency(Duration::ZERO);
    cluster.stop().await;
}

/// Polls the diagnostics server at `addr` until `/healthz` answers 200; fails with the run's
/// error if the resizer exits first.
async fn wait_serving(
    addr: std::net::SocketAddr,
    resizer: &mut tokio::task::JoinHandle<Result<(), RunError>>,
) {
    let deadline = tokio::time::Instant::now() + step_timeout();
    loop {
        if resizer.is_finished() {
            panic!("csi-resizer exited: {:?}", resizer.await);
        }
        if http_get(addr, "/healthz").await == Some((200, "ok".to_string())) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "csi-resizer did not serve /healthz"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A driver that can modify volumes but not expand them (the proxy hides the plugin capability
/// VolumeExpansion and the controller and node EXPAND_VOLUME): csi-resizer, run as its binary
/// runs, starts, serves its health and metrics and stays up — with the modify controller alone
/// where the server serves storage.k8s.io/v1 VolumeAttributesClass (a class change reaches
/// ControllerModifyVolume), with no controller at all where it does not (the gate turned off by
/// discovery). Either way a claim asking for more is left as it is, as upstream leaves it with
/// no resize controller: no ControllerExpandVolume, no resize Event or condition, the old
/// capacity.
#[tokio::test]
async fn a_driver_that_modifies_but_cannot_expand_gets_the_modify_controller_alone() {
    let cluster = Cluster::start("resize-modify-only").await;
    let (proxy, _csi) = cluster.csi_proxy().await;
    proxy.hide_expansion(true);
    let _provisioner = cluster.start_provisioner().await;
    let addr = free_address();
    let mut argv = vec![
        "csi-resizer".to_string(),
        format!("--csi-address={}", proxy.socket.display()),
        format!("--http-endpoint={addr}"),
    ];
    argv.extend(cluster.kubeconfig_args());
    let args = csi_grpc::flags::try_parse_from::<ResizerArgs, _, _>(argv).expect("resizer flags");
    let shutdown = CancellationToken::new();
    let mut resizer = tokio::spawn(csi_resizer::run::run(args, shutdown.clone()));
    wait_serving(addr, &mut resizer).await;
    let (status, metrics) = http_get(addr, "/metrics").await.expect("the metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("csi_sidecar_operations_seconds")
            && metrics.contains("/csi.v1.Controller/ControllerGetCapabilities"),
        "the start-up calls in the metrics: {metrics}"
    );

    let class = expandable_class(&cluster, "modify-only", json!({})).await;
    let pv = bound_claim(&cluster, "data", &class, "2Mi").await;
    request(&cluster, "data", "4Mi").await;

    if csi_sidecar::vac::served(&cluster.client).await == Some(true) {
        let gold = format!("{}-gold", cluster.namespace);
        attributes_class(&cluster, &gold, &cluster.driver_name, "3000").await;
        request_class(&cluster, "data", &gold).await;
        let want = gold.clone();
        cluster
            .wait_for(
                &cluster.namespaced::<PersistentVolumeClaim>(),
                "data",
                "the claim's current class gold",
                move |c| current_class(c) == Some(want.as_str()) && modify_status(c).is_none(),
            )
            .await;
        cluster
            .wait_for_event("data", "VolumeModifySuccessful", "successfully")
            .await;
        let handle = cluster
            .cluster_scoped::<PersistentVolume>()
            .get(&pv)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.csi)
            .expect("a CSI volume")
            .volume_handle;
        assert_eq!(
            driver_state(&cluster).volumes[&handle].mutable_parameters["iops"],
            "3000",
            "ControllerModifyVolume got the class's parameters"
        );
    } else {
        report_skip(
            "a_driver_that_modifies_but_cannot_expand_gets_the_modify_controller_alone (modification)",
            "storage.k8s.io/v1 volumeattributesclasses not served",
        );
        // Time a resize controller would have had to act on the larger request.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("data")
        .await
        .unwrap();
    assert_eq!(
        claim_capacity(&claim),
        "2Mi",
        "the claim keeps its capacity"
    );
    assert!(
        condition_types(&claim).is_empty(),
        "no resize condition: {:?}",
        condition_types(&claim)
    );
    let volume = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv)
        .await
        .unwrap();
    assert_eq!(
        storage(volume.spec.as_ref().and_then(|s| s.capacity.as_ref())),
        "2Mi",
        "the PV keeps its capacity"
    );
    assert_eq!(
        proxy.forwarded("ControllerExpandVolume"),
        0,
        "nothing asked the driver to expand"
    );
    let resize_events: Vec<_> = cluster
        .events()
        .await
        .into_iter()
        .filter(|e| {
            e.reason.as_deref().is_some_and(|r| {
                [
                    "Resizing",
                    "VolumeResizeFailed",
                    "VolumeResizeSuccessful",
                    "FileSystemResizeRequired",
                ]
                .contains(&r)
            })
        })
        .map(|e| (e.reason, e.message))
        .collect();
    assert!(
        resize_events.is_empty(),
        "no resize Event: {resize_events:?}"
    );

    assert!(!resizer.is_finished(), "csi-resizer still runs");
    assert_eq!(
        http_get(addr, "/healthz").await,
        Some((200, "ok".to_string()))
    );
    shutdown.cancel();
    resizer
        .await
        .expect("the resizer task")
        .expect("csi-resizer stops cleanly");
    cluster.stop().await;
}
