//! The control-plane roles, each on its own against kube-sim, with nodes and heartbeats played
//! by the test: what kube-controller-manager and kube-scheduler do for storage stories.

use std::time::{Duration, Instant};

use csi_kinds::annotations::{SELECTED_NODE, STORAGE_PROVISIONER};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use kube_sim::ApiServer;
use kube_sim::roles::kubelet::{attachment_name, unique_volume_name};
use kube_sim::roles::{Role, Timing, start_control_plane};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

struct Sim {
    server: ApiServer,
    client: Client,
    shutdown: CancellationToken,
    _roles: JoinSet<()>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.server.stop();
    }
}

async fn sim(roles: &[Role]) -> Sim {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let shutdown = CancellationToken::new();
    let roles = start_control_plane(client.clone(), roles, Timing::fast(), shutdown.clone());
    Sim {
        server,
        client,
        shutdown,
        _roles: roles,
    }
}

async fn create<K>(api: &Api<K>, value: Value) -> K
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

/// Polls `api.get(name)` until `check` holds (or it is gone, for `None`).
async fn until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return object;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {object:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Ready node (the heartbeat is the test's: the Ready condition's lastHeartbeatTime).
fn node(name: &str, extra: Value) -> Value {
    let mut node = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {},
    });
    if let (Some(node), Some(extra)) = (node.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            node.insert(key.clone(), value.clone());
        }
    }
    node
}

async fn make_ready(client: &Client, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now), "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)}]}});
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// Ready, and without the not-ready taint its creation got: the node lifecycle controller's
/// part, for tests that do not run it.
async fn make_schedulable(client: &Client, name: &str) {
    make_ready(client, name).await;
    let nodes = Api::<Node>::all(client.clone());
    let taints: Vec<_> = nodes
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .collect();
    let lifted = json!({"spec": {"taints": taints}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(lifted))
        .await
        .unwrap();
}

fn phase_of_claim(claim: Option<&PersistentVolumeClaim>) -> Option<&str> {
    claim?.status.as_ref()?.phase.as_deref()
}

fn phase_of_volume(volume: Option<&PersistentVolume>) -> Option<&str> {
    volume?.status.as_ref()?.phase.as_deref()
}

fn csi_pv(name: &str, class: &str, claim: Option<&PersistentVolumeClaim>) -> Value {
    let mut pv = json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": "csi.example.com"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Delete", "csi": {"driver": "csi.example.com", "volumeHandle": format!("handle-{name}")}},
    });
    if let Some(claim) = claim {
        pv["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "namespace": claim.namespace(), "name": claim.name_any(), "uid": claim.uid()});
    }
    pv
}

fn claim(name: &str, class: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
}

fn pod_with_claim(name: &str, claim: &str, node_name: Option<&str>) -> Value {
    let mut pod = json!({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "app", "image": "pause"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }});
    if let Some(node) = node_name {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

#[tokio::test]
async fn pv_binder_hands_claims_to_the_external_provisioner_and_binds_its_volume() {
    let sim = sim(&[Role::PvBinder]).await;
    let client = &sim.client;
    create(
        &Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone()),
        json!({"metadata": {"name": "fast"}, "provisioner": "csi.example.com"}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let created: PersistentVolumeClaim = create(&claims, claim("data", "fast")).await;
    assert_eq!(
        created.finalizers(),
        ["kubernetes.io/pvc-protection"],
        "admission protects claims"
    );
    let annotated = until(&claims, "data", "provisioner annotations", |c| {
        c.is_some_and(|c| c.annotations().contains_key(STORAGE_PROVISIONER))
    })
    .await
    .unwrap();
    assert_eq!(
        annotated.annotations()[STORAGE_PROVISIONER],
        "csi.example.com"
    );
    assert_eq!(
        annotated.annotations()["volume.beta.kubernetes.io/storage-provisioner"],
        "csi.example.com"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.contains(&"ExternalProvisioning".to_string()),
        "{reasons:?}"
    );

    // The provisioner's PV, pre-bound to the claim, completes the binding.
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        csi_pv("pv-1", "fast", Some(&annotated)),
    )
    .await;
    let bound = until(&claims, "data", "claim Bound", |c| {
        phase_of_claim(c) == Some("Bound")
    })
    .await
    .unwrap();
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("pv-1")
    );
    assert_eq!(
        bound.annotations()["pv.kubernetes.io/bind-completed"],
        "yes"
    );
    assert!(
        !bound
            .annotations()
            .contains_key("pv.kubernetes.io/bound-by-controller"),
        "the provisioner chose the PV, not us"
    );
    assert_eq!(
        bound.status.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "1Gi"
    );
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    until(&volumes, "pv-1", "PV Bound", |v| {
        phase_of_volume(v) == Some("Bound")
    })
    .await;

    // Deleting the claim: protection lifts (no pod uses it), the PV is Released for its
    // provisioner to delete (reclaim policy Delete).
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    until(&claims, "data", "claim gone", |c| c.is_none()).await;
    let released = until(&volumes, "pv-1", "PV Released", |v| {
        phase_of_volume(v) == Some("Released")
    })
    .await
    .unwrap();
    assert_eq!(released.finalizers(), ["kubernetes.io/pv-protection"]);
    volumes
        .delete("pv-1", &DeleteParams::default())
        .await
        .unwrap();
    until(
        &volumes,
        "pv-1",
        "PV gone after pv-protection lifted",
        |v| v.is_none(),
    )
    .await;
}

#[tokio::test]
async fn pvc_protection_holds_while_a_pod_uses_the_claim_and_lost_claims_are_marked() {
    let sim = sim(&[Role::PvBinder]).await;
    let client = &sim.client;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        csi_pv("static", "", None),
    )
    .await;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default"),
        claim("data", ""),
    )
    .await;
    let bound = until(&claims, "data", "static binding", |c| {
        phase_of_claim(c) == Some("Bound")
    })
    .await
    .unwrap();
    assert_eq!(
        bound.annotations()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        pod_with_claim("user", "data", Some("n1")),
    )
    .await;
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let held = claims.get("data").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some()
            && held
                .finalizers()
                .contains(&"kubernetes.io/pvc-protection".to_string()),
        "kept while in use"
    );
    pods.delete(
        "user",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    until(&claims, "data", "claim gone once unused", |c| c.is_none()).await;

    create(
        &Api::<PersistentVolume>::all(client.clone()),
        csi_pv("doomed", "", None),
    )
    .await;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default"),
        claim("orphan", ""),
    )
    .await;
    until(&claims, "orphan", "bound", |c| {
        phase_of_claim(c) == Some("Bound")
    })
    .await;
    // Force the PV away (finalizer removed by hand) while bound: the claim is Lost.
    volumes
        .patch(
            "doomed",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    volumes
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    until(&claims, "orphan", "claim Lost", |c| {
        phase_of_claim(c) == Some("Lost")
    })
    .await;
}

#[tokio::test]
async fn scheduler_selects_a_node_for_wait_for_first_consumer_and_binds_once_provisioned() {
    let sim = sim(&[Role::PvBinder, Role::Scheduler]).await;
    let client = &sim.client;
    create(&Api::<Node>::all(client.clone()), node("n1", json!({}))).await;
    create(&Api::<Node>::all(client.clone()), node("n2", json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))).await;
    make_schedulable(client, "n1").await;
    make_schedulable(client, "n2").await;
    create(&Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone()), json!({"metadata": {"name": "local"}, "provisioner": "csi.example.com", "volumeBindingMode": "WaitForFirstConsumer"})).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default"),
        claim("data", "local"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = claims.get("data").await.unwrap();
    assert!(
        !waiting.annotations().contains_key(STORAGE_PROVISIONER),
        "no provisioning before a consumer exists"
    );

    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        pod_with_claim("app", "data", None),
    )
    .await;
    let selected = until(&claims, "data", "selected-node", |c| {
        c.is_some_and(|c| c.annotations().contains_key(SELECTED_NODE))
    })
    .await
    .unwrap();
    assert_eq!(
        selected.annotations()[SELECTED_NODE],
        "n1",
        "the tainted node is not feasible"
    );
    until(
        &claims,
        "data",
        "provisioner annotation after selection",
        |c| c.is_some_and(|c| c.annotations().contains_key(STORAGE_PROVISIONER)),
    )
    .await;
    assert!(
        pods.get("app")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "the pod waits for its volume"
    );

    // The provisioner gives up on n1 and removes selected-node: the scheduler selects again.
    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SELECTED_NODE: null}}})),
        )
        .await
        .unwrap();
    until(&claims, "data", "selected again", |c| {
        c.is_some_and(|c| c.annotations().contains_key(SELECTED_NODE))
    })
    .await;

    let claim_object = claims.get("data").await.unwrap();
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        csi_pv("pv-local", "local", Some(&claim_object)),
    )
    .await;
    let scheduled = until(&pods, "app", "pod bound to n1", |p| {
        p.and_then(|p| p.spec.as_ref()?.node_name.clone()).is_some()
    })
    .await
    .unwrap();
    assert_eq!(
        scheduled.spec.as_ref().unwrap().node_name.as_deref(),
        Some("n1")
    );
    let scheduled_condition = scheduled
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        scheduled_condition.status, "True",
        "the binding marks the pod scheduled"
    );
}

#[tokio::test]
async fn unschedulable_pods_say_why() {
    let sim = sim(&[Role::Scheduler]).await;
    let client = &sim.client;
    create(&Api::<Node>::all(client.clone()), node("n1", json!({}))).await;
    create(
        &Api::<Node>::all(client.clone()),
        node("n2", json!({"spec": {"unschedulable": true}})),
    )
    .await;
    make_schedulable(client, "n1").await;
    make_schedulable(client, "n2").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(&Api::<Pod>::namespaced(client.clone(), "default"), json!({"metadata": {"name": "picky"}, "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "c", "image": "pause"}]}})).await;
    let pod = until(&pods, "picky", "unschedulable condition", |p| {
        p.and_then(|p| {
            p.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled")
                .cloned()
        })
        .is_some()
    })
    .await
    .unwrap();
    let condition = pod
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    let message = condition.message.unwrap();
    assert!(message.starts_with("0/2 nodes are available"), "{message}");
    assert!(
        message.contains("1 node(s) didn't match Pod's node affinity/selector"),
        "{message}"
    );
    assert!(
        message.contains("1 node(s) were unschedulable"),
        "{message}"
    );
}

#[tokio::test]
async fn attach_detach_creates_volume_attachments_and_waits_for_unmount() {
    let sim = sim(&[Role::PvBinder, Role::AttachDetach]).await;
    let client = &sim.client;
    create(&Api::<Node>::all(client.clone()), node("n1", json!({}))).await;
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        csi_pv("pv-a", "", None),
    )
    .await;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default"),
        claim("data", ""),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    until(&claims, "data", "bound", |c| {
        phase_of_claim(c) == Some("Bound")
    })
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        pod_with_claim("app", "data", Some("n1")),
    )
    .await;

    let name = attachment_name("handle-pv-a", "csi.example.com", "n1");
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let va = until(&attachments, &name, "VolumeAttachment created", |v| {
        v.is_some()
    })
    .await
    .unwrap();
    assert_eq!(va.spec.attacher, "csi.example.com");
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-a")
    );

    // Attached: reported in the node's volumesAttached.
    attachments
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"attached": true}})),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let unique = unique_volume_name("csi.example.com", "handle-pv-a");
    until(&nodes, "n1", "volumesAttached", |n| {
        n.and_then(|n| n.status.as_ref()?.volumes_attached.clone())
            .is_some_and(|v| v.iter().any(|a| a.name == unique))
    })
    .await;

    // The kubelet still has it mounted: no detach after the pod goes.
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesInUse": [unique]}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete(
        "app",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        attachments.get_opt(&name).await.unwrap().is_some(),
        "no detach while the volume is in use"
    );
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesInUse": []}})),
        )
        .await
        .unwrap();
    until(&attachments, &name, "detached after unmount", |v| {
        v.is_none()
    })
    .await;

    // A driver with attachRequired=false gets no VolumeAttachment.
    create(
        &Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client.clone()),
        json!({"metadata": {"name": "csi.example.com"}, "spec": {"attachRequired": false}}),
    )
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        pod_with_claim("again", "data", Some("n1")),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(attachments.get_opt(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn node_lifecycle_taints_silent_nodes_evicts_after_toleration_and_collects_orphans() {
    let sim = sim(&[Role::NodeLifecycle]).await;
    let client = &sim.client;
    create(&Api::<Node>::all(client.clone()), node("n1", json!({}))).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let not_ready = |n: Option<&Node>| {
        n.and_then(|n| n.spec.as_ref()?.taints.clone())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == "node.kubernetes.io/not-ready" && t.effect == "NoSchedule")
            })
    };
    assert!(
        not_ready(Some(&nodes.get("n1").await.unwrap())),
        "a new node is not ready"
    );
    make_ready(client, "n1").await;
    until(&nodes, "n1", "the not-ready taint lifted", |n| {
        !not_ready(n)
    })
    .await;
    // A healthy second node of the zone: with every node of every zone down, the controller
    // would assume it is the one cut off and add no NoExecute taint.
    create(&Api::<Node>::all(client.clone()), node("n2", json!({}))).await;
    let healthy = tokio::spawn({
        let client = client.clone();
        async move {
            loop {
                make_ready(&client, "n2").await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    let short = json!({"metadata": {"name": "short"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}],
        "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]}});
    let forever = json!({"metadata": {"name": "forever"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}],
        "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]}});
    create(&Api::<Pod>::namespaced(client.clone(), "default"), short).await;
    create(&Api::<Pod>::namespaced(client.clone(), "default"), forever).await;
    let orphan = json!({"metadata": {"name": "orphan"}, "spec": {"nodeName": "ghost", "containers": [{"name": "c", "image": "pause"}]}});
    create(&Api::<Pod>::namespaced(client.clone(), "default"), orphan).await;

    // No heartbeat for the grace period (2 s in fast timing): Unknown and tainted.
    let tainted = until(&nodes, "n1", "unreachable taints", |n| {
        n.and_then(|n| n.spec.as_ref()?.taints.clone())
            .is_some_and(|t| {
                t.iter()
                    .filter(|t| t.key == "node.kubernetes.io/unreachable")
                    .count()
                    == 2
            })
    })
    .await
    .unwrap();
    let ready = tainted
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("Unknown", Some("NodeStatusUnknown"))
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let evicted = until(&pods, "short", "evicted after tolerationSeconds", |p| {
        p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    if let Some(pod) = evicted {
        let conditions = pod.status.unwrap().conditions.unwrap_or_default();
        assert!(conditions.iter().any(|c| c.type_ == "DisruptionTarget"
            && c.reason.as_deref() == Some("DeletionByTaintManager")));
    }
    until(&pods, "orphan", "pod of a missing node collected", |p| {
        p.is_none()
    })
    .await;
    let kept = pods.get("forever").await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "tolerating forever keeps the pod"
    );

    // Heartbeats again: Ready and untainted.
    make_ready(client, "n1").await;
    until(&nodes, "n1", "taints removed", |n| {
        n.and_then(|n| n.spec.as_ref()?.taints.clone())
            .is_none_or(|t| t.iter().all(|t| t.key != "node.kubernetes.io/unreachable"))
    })
    .await;
    healthy.abort();
}
