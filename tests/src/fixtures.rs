//! Objects the scenarios share: pre-provisioned ("static") volumes, PV/PVC/pod manifests,
//! claims, snapshots.

use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::step_timeout;

/// An administrator's pre-created volume: CreateVolume straight on the driver's controller.
pub async fn provision_static_volume(controller: &CsiConnection, name: &str, bytes: i64) -> String {
    csi_hostpath::local::create_plain_volume(controller, name, bytes, step_timeout())
        .await
        .unwrap_or_else(|status| panic!("CreateVolume {name}: {}", status.message()))
        .volume_id
}

/// A Retain PV for a pre-created CSI volume, with no storage class, reserved (`claimRef`) for
/// the claim `namespace/claim` when one is given, as an administrator reserves a volume: an
/// unreserved one is free for any class-less claim of the cluster.
pub fn static_pv(
    name: &str,
    driver: &str,
    handle: &str,
    size: &str,
    claim: Option<(&str, &str)>,
) -> Value {
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": driver, "volumeHandle": handle, "volumeAttributes": {"origin": "static"}},
        },
    });
    if let Some((namespace, claim)) = claim {
        pv["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": namespace, "name": claim});
    }
    pv
}

/// A claim with no storage class (`""`: it binds only to PVs without a class) for the PV
/// `volume`.
pub fn static_pvc(name: &str, size: &str, volume: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": size}},
        },
    })
}

/// A pod pinned to `node`, optionally with a claim mounted as volume `data` and a simulated
/// container writing to it.
pub fn pod(name: &str, node: &str, claim: Option<&str>, writes: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": 5,
        },
    });
    if let Some(claim) = claim {
        pod["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        pod["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "data", "mountPath": "/data"}]);
        if writes {
            pod["metadata"]["annotations"][kube_sim::roles::kubelet::WRITE_TO_ANNOTATION] =
                json!("data");
        }
    }
    pod
}

/// True when the pod is Running and Ready.
pub fn is_running(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let status = pod.status.clone().unwrap_or_default();
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A freshly pre-provisioned 1 MiB volume, its PV `<namespace>-<name>` and a claim `name`
/// bound to it; returns the PV name.
pub async fn static_claim(cluster: &crate::Cluster, name: &str) -> String {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let pv_name = format!("{}-{name}", cluster.namespace);
    let handle = provision_static_volume(&cluster.driver.controller.csi, &pv_name, 1 << 20).await;
    cluster
        .create(
            &cluster.cluster_scoped::<PersistentVolume>(),
            static_pv(
                &pv_name,
                &cluster.driver_name,
                &handle,
                "1Mi",
                Some((&cluster.namespace, name)),
            ),
        )
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            static_pvc(name, "1Mi", &pv_name),
        )
        .await;
    pv_name
}

/// A pod on `node` running with a freshly pre-provisioned static volume mounted as `data`
/// (and writing to it). Returns the pod, the PV name and the publish target path.
pub async fn running_pod_with_static_volume(
    cluster: &crate::Cluster,
    name: &str,
    node: &str,
    customize: impl FnOnce(&mut Value),
) -> (k8s_openapi::api::core::v1::Pod, String, std::path::PathBuf) {
    use k8s_openapi::api::core::v1::Pod;
    let pv_name = static_claim(cluster, name).await;
    let mut manifest = pod(name, node, Some(name), true);
    customize(&mut manifest);
    let created: Pod = cluster.create(&cluster.namespaced(), manifest).await;
    let running = cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            name,
            "the pod Running with its volume",
            is_running,
        )
        .await;
    let uid = created.uid().unwrap_or_default();
    let target = kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(node),
        &uid,
        &pv_name,
        false,
    );
    (running, pv_name, target)
}

/// Size of a file, 0 when missing.
pub fn file_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The effects of the node's taints with `key`, sorted.
pub fn taint_effects(node: &k8s_openapi::api::core::v1::Node, key: &str) -> Vec<String> {
    let mut effects: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == key)
        .map(|t| t.effect)
        .collect();
    effects.sort();
    effects
}

/// A 2Mi ReadWriteOnce claim of `class`.
pub fn claim(name: &str, class: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Mi"}}}})
}

pub fn bound(claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Serves snapshot.storage.k8s.io/v1 VolumeSnapshotClasses, VolumeSnapshots and
/// VolumeSnapshotContents, and the groupsnapshot.storage.k8s.io kinds, with the CRDs
/// csi-snapshotter generates (`manifests/crds/`); a real cluster that has them keeps its own.
pub async fn install_snapshot_crds(client: &Client) {
    for crd in [
        csi_kinds::snapshot::crds(),
        csi_kinds::groupsnapshot::crds(),
    ]
    .concat()
    {
        create_crd(client, crd).await;
    }
}

/// Serves COSI's objectstorage.k8s.io/v1alpha1 kinds with the CRDs the cosi crate generates
/// (`manifests/crds/`); a real cluster that has them keeps its own.
pub async fn install_cosi_crds(client: &Client) {
    for crd in csi_kinds::objectstorage::crds() {
        create_crd(client, crd).await;
    }
}

/// Serves cbt.storage.k8s.io/v1beta1 SnapshotMetadataServices with the CRD csi-kinds generates
/// (`manifests/crds/`); a real cluster that has it keeps its own.
pub async fn install_cbt_crds(client: &Client) {
    for crd in csi_kinds::cbt::crds() {
        create_crd(client, crd).await;
    }
}

/// Serves gateway.networking.k8s.io/v1beta1 ReferenceGrants (a real cluster that has the
/// Gateway API CRDs keeps its own).
pub async fn install_reference_grant_crd(client: &Client) {
    let crd = Crd {
        group: "gateway.networking.k8s.io",
        version: "v1beta1",
        kind: "ReferenceGrant",
        plural: "referencegrants",
        scope: "Namespaced",
        status: false,
        // The annotation of the Gateway API's own CRDs (a protected `*.k8s.io` group).
        approval: "https://github.com/kubernetes-sigs/gateway-api/pull/2466",
    };
    install_crd(client, &crd).await;
}

/// A CustomResourceDefinition of one version that keeps any fields.
struct Crd {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    scope: &'static str,
    status: bool,
    /// The `api-approved.kubernetes.io` annotation.
    approval: &'static str,
}

/// Creates `crd` as a one-version CRD that keeps any fields.
async fn install_crd(client: &Client, crd: &Crd) {
    let Crd {
        group,
        version,
        kind,
        plural,
        scope,
        ..
    } = *crd;
    let name = format!("{plural}.{group}");
    let mut served = json!({"name": version, "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    if crd.status {
        served["subresources"] = json!({"status": {}});
    }
    let object = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"api-approved.kubernetes.io": crd.approval}},
        "spec": {"group": group, "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [served]}
    }))
    .expect("a CRD");
    create_crd(client, object).await;
}

/// Creates `crd` (unless it exists) and waits until it is Established.
async fn create_crd(
    client: &Client,
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    match crds.create(&Default::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("creating the {name} CRD: {error}"),
    }
    let deadline = std::time::Instant::now() + step_timeout();
    while !crds.get(&name).await.is_ok_and(|crd| established(&crd)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the {name} CRD is not Established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the API server serves a CRD's resources yet.
fn established(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// A VolumeSnapshot `name` of `claim` in `namespace`, cut through the real pipeline (the
/// scenario must run the snapshot-controller and csi-snapshotter: see
/// [`crate::Cluster::start_snapshot_controller`]) with a default VolumeSnapshotClass of the
/// scenario's driver (made on first use, deleted with the scenario); returns the name of its
/// content once it is ready to use.
pub async fn cut_snapshot(
    cluster: &crate::Cluster,
    namespace: &str,
    name: &str,
    claim: &str,
) -> String {
    use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass};
    let classes: Api<VolumeSnapshotClass> = Api::all(cluster.client.clone());
    let class = format!("{}-snapshots", cluster.namespace);
    if classes
        .get_opt(&class)
        .await
        .expect("reading the class")
        .is_none()
    {
        cluster.delete_at_cleanup::<VolumeSnapshotClass>(None, &class);
        classes
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": class, "annotations": {
                        "snapshot.storage.kubernetes.io/is-default-class": "true"}},
                    "driver": cluster.driver_name, "deletionPolicy": "Delete"}))
                .expect("a VolumeSnapshotClass"),
            )
            .await
            .expect("creating the VolumeSnapshotClass");
    }
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(cluster.client.clone(), namespace);
    snapshots
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
                "spec": {"source": {"persistentVolumeClaimName": claim}}}))
            .expect("a VolumeSnapshot"),
        )
        .await
        .expect("creating the VolumeSnapshot");
    let ready = cluster
        .wait_for(&snapshots, name, "the snapshot ready to use", |s| {
            s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
        })
        .await;
    ready
        .status
        .and_then(|s| s.bound_volume_snapshot_content_name)
        .expect("a ready snapshot names its content")
}

/// A Secret with one `password` entry in the scenario's namespace.
pub async fn secret(cluster: &crate::Cluster, name: &str, password: &str) {
    cluster
        .create(
            &cluster.namespaced::<k8s_openapi::api::core::v1::Secret>(),
            json!({"metadata": {"name": name}, "stringData": {"password": password}}),
        )
        .await;
}

/// The node-affinity values of the PV bound to `claim` (the nodes it is reachable from).
pub async fn pv_nodes(
    cluster: &crate::Cluster,
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
) -> Vec<String> {
    let name = claim.spec.clone().unwrap().volume_name.unwrap();
    let pv = cluster
        .cluster_scoped::<k8s_openapi::api::core::v1::PersistentVolume>()
        .get(&name)
        .await
        .unwrap();
    let terms = pv
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    terms
        .into_iter()
        .flat_map(|t| t.match_expressions.unwrap_or_default())
        .flat_map(|e| e.values.unwrap_or_default())
        .collect()
}

/// Waits until the claim `name` of `claims` is Bound (`what` says which claim) and returns
/// the spec of its PV.
pub async fn bound_volume(
    cluster: &crate::Cluster,
    claims: &Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    name: &str,
    what: &str,
) -> k8s_openapi::api::core::v1::PersistentVolumeSpec {
    let claim = cluster.wait_for(claims, name, what, bound).await;
    let volume = claim.spec.unwrap().volume_name.unwrap();
    cluster
        .cluster_scoped::<k8s_openapi::api::core::v1::PersistentVolume>()
        .get(&volume)
        .await
        .unwrap_or_else(|error| panic!("the PV {volume}: {error}"))
        .spec
        .unwrap_or_default()
}

/// The reference driver's state: what it made of each CSI call.
pub fn driver_state(cluster: &crate::Cluster) -> std::sync::Arc<csi_hostpath::state::State> {
    csi_hostpath::state::Store::open(&cluster.driver.state_dir)
        .and_then(|store| store.read())
        .expect("the driver's state")
}

/// Runs a writer pod on `claim` until it has written, then removes it; returns the PV name.
pub async fn write_records(cluster: &crate::Cluster, claim: &str) -> String {
    let pods = cluster.namespaced::<k8s_openapi::api::core::v1::Pod>();
    let writer: k8s_openapi::api::core::v1::Pod = cluster
        .create(
            &pods,
            pod("writer", &cluster.node("node-a"), Some(claim), true),
        )
        .await;
    cluster
        .wait_for(&pods, "writer", "the writer Running", is_running)
        .await;
    let volume = volume_of(cluster, claim).await;
    let target = kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(&cluster.node("node-a")),
        &kube::ResourceExt::uid(&writer).unwrap(),
        &volume,
        false,
    );
    cluster
        .eventually("records written", || {
            std::fs::metadata(target.join("writer.log")).is_ok_and(|m| m.len() > 0)
        })
        .await;
    cluster
        .delete_and_wait(&pods, "writer", "the writer gone")
        .await;
    volume
}

/// Runs a reader pod on `claim` (on another node) and returns the records it finds.
pub async fn read_records(cluster: &crate::Cluster, claim: &str) -> String {
    let pods = cluster.namespaced::<k8s_openapi::api::core::v1::Pod>();
    let reader: k8s_openapi::api::core::v1::Pod = cluster
        .create(
            &pods,
            pod("reader", &cluster.node("node-b"), Some(claim), false),
        )
        .await;
    cluster
        .wait_for(&pods, "reader", "the reader Running", is_running)
        .await;
    let target = kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(&cluster.node("node-b")),
        &kube::ResourceExt::uid(&reader).unwrap(),
        &volume_of(cluster, claim).await,
        false,
    );
    let records = std::fs::read_to_string(target.join("writer.log")).unwrap_or_default();
    cluster
        .delete_and_wait(&pods, "reader", "the reader gone")
        .await;
    records
}

/// The driver's volume id of PV `volume`.
pub async fn handle_of(cluster: &crate::Cluster, volume: &str) -> String {
    let pv = cluster
        .cluster_scoped::<k8s_openapi::api::core::v1::PersistentVolume>()
        .get(volume)
        .await;
    pv.unwrap().spec.unwrap().csi.unwrap().volume_handle
}

/// The PV bound to `claim`.
pub async fn volume_of(cluster: &crate::Cluster, claim: &str) -> String {
    cluster
        .namespaced::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get(claim)
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap()
}
