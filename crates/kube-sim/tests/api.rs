//! kube-apiserver semantics, black-box through `kube::Client`. By default against a fresh
//! kube-sim; with `KUBE_SIM_COMPARE_KUBECONFIG=/path` the same tests run against a real
//! cluster (tests that need kube-sim's fault injection then skip with a reason). Each test uses
//! its own namespace.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, SubjectAccessReview, SubjectAccessReviewStatus,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::rbac::v1 as rbac_v1;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use kube_sim::ApiServer;
use kube_sim::roles::service_accounts::ROOT_CA_CONFIG_MAP;
use kube_sim::roles::{Role, Timing};
use kube_sim_harness::{admits_pods, eventually, server_under_test};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Cluster {
    client: Client,
    sim: Option<ApiServer>,
    namespace: String,
    /// The ConfigMaps the cluster keeps in every namespace (from 1.20, the root CA's), which
    /// the namespace's lists hold beside the test's own.
    system_config_maps: Vec<String>,
    /// kube-sim's service account controller (its tasks end with the test).
    _controller_manager: Option<tokio::task::JoinSet<()>>,
}

async fn cluster(test: &str) -> Cluster {
    let (client, sim) = server_under_test().await;
    // A real cluster's controller manager gives every namespace its default ServiceAccount,
    // without which pods are refused; on kube-sim, the role that does it.
    let controller_manager = sim.as_ref().map(|_| {
        kube_sim::roles::start_control_plane(
            client.clone(),
            &[Role::ServiceAccounts],
            Timing::fast(),
            CancellationToken::new(),
        )
    });
    let namespace = format!("{test}-{}", &uuid_suffix());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    eventually("the namespace admitting pods", || async {
        admits_pods(&client, &namespace)
            .await
            .unwrap()
            .then_some(())
    })
    .await;
    let version = client.apiserver_version().await.unwrap();
    let system_config_maps = if version.minor.trim_end_matches('+').parse::<u32>().unwrap() >= 20 {
        vec![ROOT_CA_CONFIG_MAP.to_string()]
    } else {
        Vec::new()
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for name in &system_config_maps {
        eventually("the namespace's system ConfigMaps", || async {
            config_maps.get_opt(name).await.unwrap().map(|_| ())
        })
        .await;
    }
    Cluster {
        client,
        sim,
        namespace,
        system_config_maps,
        _controller_manager: controller_manager,
    }
}

fn uuid_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

fn configmap(name: &str, data: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"key": data}})).unwrap()
}

fn code<T>(result: kube::Result<T>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("not an API error: {other}"),
    }
}

/// The names a list returns, in the server's order (namespace, then name).
async fn names<K>(api: &Api<K>, params: &ListParams) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(params)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect()
}

impl Cluster {
    /// The names a list of the namespace's ConfigMaps holds when the test made `ours`: those and
    /// the cluster's own, in name order.
    fn config_maps_with(&self, ours: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = ours.iter().map(ToString::to_string).collect();
        all.extend(self.system_config_maps.iter().cloned());
        all.sort();
        all
    }

    /// The server's minor version (kube-sim's is the Kubernetes it models).
    async fn minor(&self) -> u32 {
        let version = self.client.apiserver_version().await.unwrap();
        version.minor.trim_end_matches('+').parse().unwrap()
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

// Create, get, generateName, AlreadyExists, Invalid names, missing namespace
// (k8s.io/apiserver/pkg/registry/generic/registry/store.go Create; names per
// k8s.io/apimachinery/pkg/api/validation/objectmeta.go).
#[tokio::test]
async fn create_and_get() {
    let c = cluster("create").await;
    let api: Api<ConfigMap> = c.api();
    let created = api
        .create(&PostParams::default(), &configmap("a", "1"))
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert!(created.creation_timestamp().is_some());
    assert!(created.resource_version().is_some());
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["key"], "1");
    assert_eq!(
        code(
            api.create(&PostParams::default(), &configmap("a", "2"))
                .await
        ),
        409
    );
    assert_eq!(
        code(
            api.create(&PostParams::default(), &configmap("Not_Valid", "2"))
                .await
        ),
        422
    );
    assert_eq!(code(api.get("missing").await), 404);
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let generated = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(generated.name_any().starts_with("gen-") && generated.name_any().len() > 4);
    let elsewhere: Api<ConfigMap> = Api::namespaced(c.client.clone(), "no-such-namespace-here");
    assert_eq!(
        code(
            elsewhere
                .create(&PostParams::default(), &configmap("a", "1"))
                .await
        ),
        404
    );
}

// Optimistic concurrency: a stale resourceVersion is 409 Conflict; an update that changes
// nothing keeps the resourceVersion (registry/generic/registry/store.go GuaranteedUpdate).
#[tokio::test]
async fn update_conflicts_and_no_op_writes() {
    let c = cluster("update").await;
    let api: Api<ConfigMap> = c.api();
    let first = api
        .create(&PostParams::default(), &configmap("u", "1"))
        .await
        .unwrap();
    let mut changed = first.clone();
    changed.data = Some([("key".to_string(), "2".to_string())].into());
    let second = api
        .replace("u", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(second.resource_version(), first.resource_version());
    let mut stale = first.clone();
    stale.data = Some([("key".to_string(), "3".to_string())].into());
    assert_eq!(
        code(api.replace("u", &PostParams::default(), &stale).await),
        409
    );
    let same = api
        .replace("u", &PostParams::default(), &second)
        .await
        .unwrap();
    assert_eq!(
        same.resource_version(),
        second.resource_version(),
        "a no-op update is not a write"
    );
}

// Status subresource: status is ignored on the main resource, the spec on a claim's /status
// (its status strategy resets only the spec: metadata sent there is kept, which csi-resizer's
// node-expansion-not-required annotation relies on); a claim has no generation (its strategy
// sets none, unlike most kinds with a spec).
#[tokio::test]
async fn status_subresource_and_generation() {
    let c = cluster("status").await;
    let api: Api<PersistentVolumeClaim> = c.api();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &pvc).await.unwrap();
    assert_eq!(created.metadata.generation, None);
    let patch = json!({"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Bound"}});
    let patched = api
        .patch("claim", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        patched.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "status ignored on the main resource"
    );
    assert_eq!(patched.metadata.labels.unwrap()["a"], "b");
    let status = json!({"status": {"phase": "Bound"}, "spec": {"volumeName": "ignored"},
        "metadata": {"annotations": {"through": "status"}}});
    let patched = api
        .patch_status("claim", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(patched.annotations()["through"], "status", "metadata kept");
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(
        patched.spec.unwrap().volume_name,
        None,
        "spec ignored on /status"
    );
    let spec = json!({"spec": {"volumeName": "pv-1"}});
    let patched = api
        .patch("claim", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().volume_name.as_deref(), Some("pv-1"));
    assert_eq!(patched.metadata.generation, None);
}

// A claim's request may change only once it is Bound (validation: 422), and grow only when its
// class allows expansion (PersistentVolumeClaimResize admission: 403).
#[tokio::test]
async fn claim_expansion_needs_a_bound_claim_of_an_expandable_class() {
    let c = cluster("resize").await;
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(c.client.clone());
    let api: Api<PersistentVolumeClaim> = c.api();
    for (suffix, expandable) in [("fixed", false), ("grows", true)] {
        let class = format!("{}-{suffix}", c.namespace);
        let object = json!({"metadata": {"name": class}, "provisioner": "resize.kube-sim.test",
            "allowVolumeExpansion": expandable});
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(object).unwrap(),
            )
            .await
            .unwrap();
        let claim = json!({"metadata": {"name": suffix}, "spec": {"storageClassName": class,
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        api.create(
            &PostParams::default(),
            &serde_json::from_value(claim).unwrap(),
        )
        .await
        .unwrap();
    }
    let grow = |size: &str| json!({"spec": {"resources": {"requests": {"storage": size}}}});
    let params = PatchParams::default();
    let pending = api
        .patch("grows", &params, &Patch::Merge(grow("2Gi")))
        .await;
    assert_eq!(code(pending), 422, "a Pending claim");
    let bound = json!({"status": {"phase": "Bound"}});
    for name in ["fixed", "grows"] {
        api.patch_status(name, &params, &Patch::Merge(&bound))
            .await
            .unwrap();
    }
    let fixed = api
        .patch("fixed", &params, &Patch::Merge(grow("2Gi")))
        .await;
    assert_eq!(code(fixed), 403, "a class without allowVolumeExpansion");
    let grown = api
        .patch("grows", &params, &Patch::Merge(grow("2Gi")))
        .await
        .unwrap();
    assert_eq!(
        grown.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
        "2Gi"
    );
    for suffix in ["fixed", "grows"] {
        classes
            .delete(
                &format!("{}-{suffix}", c.namespace),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
}

// JSON patch with a failing `test` is rejected (422) and changes nothing.
#[tokio::test]
async fn json_patch_test_guards() {
    let c = cluster("jsonpatch").await;
    let api: Api<ConfigMap> = c.api();
    api.create(&PostParams::default(), &configmap("j", "1"))
        .await
        .unwrap();
    let guarded: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/key", "value": "1"},
        {"op": "replace", "path": "/data/key", "value": "2"},
    ]))
    .unwrap();
    api.patch(
        "j",
        &PatchParams::default(),
        &Patch::Json::<()>(guarded.clone()),
    )
    .await
    .unwrap();
    // A failed test, a missing path, an unknown operation: apimachinery's generic 422.
    let path = format!("/api/v1/namespaces/{}/configmaps/j", c.namespace);
    let send = |body: serde_json::Value| {
        let request = http::Request::patch(path.clone())
            .header("content-type", "application/json-patch+json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        let client = c.client.clone();
        async move {
            match client.request_text(request).await {
                Err(kube::Error::Api(status)) => (status.code, status.reason, status.message),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    };
    let not_applied = (
        422,
        "Invalid".to_string(),
        "the server rejected our request due to an error in our request".to_string(),
    );
    let missing = json!([{"op": "replace", "path": "/data/nokey/x", "value": "3"}]);
    let unknown = json!([{"op": "bogus", "path": "/data/key", "value": "3"}]);
    for refused in [serde_json::to_value(&guarded).unwrap(), missing, unknown] {
        assert_eq!(send(refused.clone()).await, not_applied, "{refused}");
    }
    // A body that is no list of operations is 400 (v1.19 names the library's type, later
    // servers their handler's: "error decoding patch: … []handlers.jsonPatchOp").
    let (code, reason, message) = send(json!({"not": "a list"})).await;
    assert_eq!((code, reason.as_str()), (400, "BadRequest"), "{message}");
    assert!(
        message.contains("json: cannot unmarshal object into Go value of type "),
        "{message}"
    );
    assert_eq!(api.get("j").await.unwrap().data.unwrap()["key"], "2");
}

// Server-side apply creates, then merges; re-applying the same object is a no-op.
#[tokio::test]
async fn apply_is_idempotent() {
    let c = cluster("apply").await;
    let api: Api<ConfigMap> = c.api();
    let params = PatchParams::apply("kube-sim-test");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"key": "1"}});
    let first = api
        .patch("ssa", &params, &Patch::Apply(&applied))
        .await
        .unwrap();
    let again = api
        .patch("ssa", &params, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(again.resource_version(), first.resource_version());
    let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"key": "2"}});
    let second = api
        .patch("ssa", &params, &Patch::Apply(&changed))
        .await
        .unwrap();
    assert_eq!(second.data.unwrap()["key"], "2");
}

// Finalizers keep a deleted object (with deletionTimestamp) until the last one is removed
// (registry/generic/registry/store.go Delete / updateForGracefulDeletionAndFinalizers).
#[tokio::test]
async fn finalizers_hold_deletion() {
    let c = cluster("finalizers").await;
    let api: Api<ConfigMap> = c.api();
    let mut held = configmap("held", "1");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    // No new finalizer on an object being deleted: 422 Invalid, the new ones sorted.
    let more = json!({"metadata": {"finalizers": ["z.example.com/b", "example.com/hold", "a.example.com/a"]}});
    match api
        .patch("held", &PatchParams::default(), &Patch::Merge(&more))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
            assert_eq!(
                status.message,
                "ConfigMap \"held\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"a.example.com/a\", \"z.example.com/b\"}"
            );
        }
        other => panic!("a new finalizer on a deleting object: {other:?}"),
    }
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert_eq!(code(api.get("held").await), 404);
}

// A claim's status strategy keeps the metadata it is sent, so `/status` cannot add a
// finalizer to a claim being deleted either; it can still write an annotation.
#[tokio::test]
async fn a_deleting_claim_takes_no_new_finalizer_through_its_status() {
    let c = cluster("claimfinalizers").await;
    let api: Api<PersistentVolumeClaim> = c.api();
    let claim = json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]},
        "spec": {"storageClassName": "none", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(claim).unwrap(),
    )
    .await
    .unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let params = PatchParams::default();
    let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/late"]}});
    assert_eq!(
        code(
            api.patch_status("held", &params, &Patch::Merge(&more))
                .await
        ),
        422
    );
    let annotated = json!({"metadata": {"annotations": {"example.com/note": "kept"}}});
    let written = api
        .patch_status("held", &params, &Patch::Merge(&annotated))
        .await
        .unwrap();
    assert_eq!(written.annotations()["example.com/note"], "kept");
    assert!(!written.finalizers().iter().any(|f| f == "example.com/late"));
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("held", &params, &Patch::Merge(&release))
        .await
        .unwrap();
}

/// The 422 an API call answered: its message (which must name the object as invalid).
fn invalid<T: std::fmt::Debug>(result: kube::Result<T>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 && status.reason == "Invalid" => {
            status.message
        }
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

// Finalizer names are qualified names, and a built-in kind's without a domain must be a
// standard one (k8s.io/apimachinery ValidateFinalizers; pkg/apis/core/validation).
#[tokio::test]
async fn finalizer_names_are_validated() {
    let c = cluster("finalizernames").await;
    let api: Api<ConfigMap> = c.api();
    let with = |name: &str, finalizer: &str| {
        let mut object = configmap(name, "1");
        object.metadata.finalizers = Some(vec![finalizer.into()]);
        object
    };
    let post = PostParams::default();
    assert_eq!(
        invalid(api.create(&post, &with("bare", "hold")).await),
        "ConfigMap \"bare\" is invalid: metadata.finalizers[0]: Invalid value: \"hold\": name is neither a standard finalizer name nor is it fully qualified"
    );
    assert!(
        invalid(api.create(&post, &with("spaced", "example.com/a b")).await).starts_with(
            "ConfigMap \"spaced\" is invalid: metadata.finalizers: Invalid value: \"example.com/a b\": name part must consist of alphanumeric characters"
        )
    );
    api.create(&post, &with("standard", "kubernetes"))
        .await
        .unwrap();
    let bare = json!({"metadata": {"finalizers": ["kubernetes", "hold"]}});
    assert!(
        invalid(
            api.patch("standard", &PatchParams::default(), &Patch::Merge(&bare))
                .await
        )
        .ends_with("metadata.finalizers[1]: Invalid value: \"hold\": name is neither a standard finalizer name nor is it fully qualified")
    );
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("standard", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
}

// A PersistentVolume's spec is validated on create (access modes, capacity, exactly one
// source, the CSI source's driver and handle), defaulted (volume mode, reclaim policy), and its
// source and volume mode cannot change (pkg/apis/core/validation ValidatePersistentVolume*).
#[tokio::test]
async fn persistent_volumes_are_validated_and_defaulted() {
    let c = cluster("pvvalidation").await;
    let api: Api<PersistentVolume> = Api::all(c.client.clone());
    let name = |suffix: &str| format!("{}-{suffix}", c.namespace);
    let volume = |suffix: &str, spec: serde_json::Value| -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name(suffix)}, "spec": spec})).unwrap()
    };
    let csi = json!({"driver": "validation.example.com", "volumeHandle": "h"});
    let post = PostParams::default();
    // ReadWriteOncePod is on by default from 1.27.
    let read_write_once_pod = c.minor().await >= 27;
    let bad_mode = format!(
        "spec.accessModes: Unsupported value: \"ReadWriteSometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\"{}",
        if read_write_once_pod {
            ", \"ReadWriteOncePod\""
        } else {
            ""
        }
    );
    let mut refusals = vec![
        (
            "nocapacity",
            json!({"accessModes": ["ReadWriteOnce"], "csi": csi}),
            "[spec.capacity: Required value, spec.capacity: Unsupported value: core.ResourceList(nil): supported values: \"storage\"]",
        ),
        (
            "nosource",
            json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}),
            "spec: Required value: must specify a volume type",
        ),
        (
            "twosources",
            json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                "hostPath": {"path": "/tmp"}, "csi": csi}),
            "spec.csi: Forbidden: may not specify more than 1 volume type",
        ),
        (
            "nohandle",
            json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                "csi": {"driver": "validation.example.com"}}),
            "spec.csi.volumeHandle: Required value",
        ),
        (
            "badmode",
            json!({"accessModes": ["ReadWriteSometimes"], "capacity": {"storage": "1Gi"}, "csi": csi}),
            &bad_mode,
        ),
        (
            "badpolicy",
            json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": csi,
                "persistentVolumeReclaimPolicy": "Keep"}),
            "spec.persistentVolumeReclaimPolicy: Unsupported value: \"Keep\": supported values: \"Delete\", \"Recycle\", \"Retain\"",
        ),
    ];
    if read_write_once_pod {
        refusals.push((
            "podandnode",
            json!({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "csi": csi}),
            "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
        ));
    }
    for (suffix, spec, why) in refusals {
        let message = invalid(api.create(&post, &volume(suffix, spec)).await);
        let name = name(suffix);
        assert_eq!(
            message,
            format!("PersistentVolume \"{name}\" is invalid: {why}")
        );
    }
    let spec = json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
        "csi": csi, "storageClassName": name("none")});
    let created = api.create(&post, &volume("good", spec)).await.unwrap();
    let defaults = created.spec.unwrap();
    assert_eq!(
        (
            defaults.volume_mode.as_deref(),
            defaults.persistent_volume_reclaim_policy.as_deref()
        ),
        (Some("Filesystem"), Some("Retain"))
    );
    let params = PatchParams::default();
    let good = name("good");
    let grown = json!({"spec": {"capacity": {"storage": "2Gi"}}});
    api.patch(&good, &params, &Patch::Merge(&grown))
        .await
        .unwrap();
    let handle = json!({"spec": {"csi": {"volumeHandle": "other"}}});
    assert!(
        invalid(api.patch(&good, &params, &Patch::Merge(&handle)).await).starts_with(&format!(
            "PersistentVolume \"{good}\" is invalid: spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
        ))
    );
    let block = json!({"spec": {"volumeMode": "Block"}});
    assert_eq!(
        invalid(api.patch(&good, &params, &Patch::Merge(&block)).await),
        format!(
            "PersistentVolume \"{good}\" is invalid: volumeMode: Invalid value: \"Block\": field is immutable"
        )
    );
    api.delete(&good, &DeleteParams::default()).await.unwrap();
}

// The storage objects our components and the cluster's roles write are validated on create as
// kube-apiserver validates them (pkg/apis/{core,storage,coordination}/validation).
#[tokio::test]
async fn storage_objects_are_validated_on_create() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("objvalidation").await;
    let ns = c.namespace.clone();
    let cluster_name = |suffix: &str| format!("{ns}-{suffix}");
    let cases = [
        (
            ("storage.k8s.io", "v1", "VolumeAttachment"),
            json!({"metadata": {"name": cluster_name("va")}, "spec": {"attacher": "a.example.com",
                "nodeName": "n1", "source": {}}}),
            "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName",
        ),
        (
            ("storage.k8s.io", "v1", "StorageClass"),
            json!({"metadata": {"name": cluster_name("sc")}, "provisioner": "a.example.com",
                "volumeBindingMode": "Later"}),
            "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
        ),
        (
            ("storage.k8s.io", "v1", "CSINode"),
            json!({"metadata": {"name": cluster_name("node")}, "spec": {"drivers": [
                {"name": "a.example.com", "nodeID": "x"}, {"name": "a.example.com", "nodeID": "y"}]}}),
            "spec.drivers[1].name: Duplicate value: \"a.example.com\"",
        ),
        (
            ("", "v1", "Node"),
            json!({"metadata": {"name": cluster_name("node")}, "spec": {"taints": [
                {"key": "a", "effect": "Sometimes"}]}}),
            "metadata.taints[0].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
        ),
        (
            ("coordination.k8s.io", "v1", "Lease"),
            json!({"metadata": {"name": "lease", "namespace": ns}, "spec": {"leaseDurationSeconds": -1}}),
            "spec.leaseDurationSeconds: Invalid value: -1: must be greater than 0",
        ),
        (
            ("", "v1", "Event"),
            json!({"metadata": {"name": "event", "namespace": ns}, "reason": "R", "message": "m",
                "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}}),
            "involvedObject.namespace: Invalid value: \"default\": does not match event.namespace",
        ),
        (
            ("", "v1", "PersistentVolumeClaim"),
            json!({"metadata": {"name": "claim", "namespace": ns},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
            "spec.accessModes: Required value: at least 1 access mode is required",
        ),
    ];
    for ((group, version, kind), object, why) in cases {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let namespaced = object["metadata"]["namespace"].is_string();
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(c.client.clone(), &ns, &resource)
        } else {
            Api::all_with(c.client.clone(), &resource)
        };
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        let mut object: DynamicObject = serde_json::from_value(object).unwrap();
        object.types = Some(kube::api::TypeMeta {
            api_version: resource.api_version.clone(),
            kind: kind.into(),
        });
        let message = invalid(api.create(&PostParams::default(), &object).await);
        // The kind qualified by its group, as `schema.GroupKind` prints.
        let qualified = [kind, group].join(".");
        let qualified = qualified.trim_end_matches('.');
        assert_eq!(message, format!("{qualified} \"{name}\" is invalid: {why}"));
    }
    // A cluster-scoped object's Events go to "default".
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    let event = json!({"metadata": {"name": cluster_name("event")}, "reason": "R", "message": "m",
        "involvedObject": {"kind": "Node", "name": "n1"}});
    events
        .create(
            &PostParams::default(),
            &serde_json::from_value(event).unwrap(),
        )
        .await
        .unwrap();
    events
        .delete(&cluster_name("event"), &DeleteParams::default())
        .await
        .unwrap();
}

// A VolumeAttachment's spec is immutable, and a Node's taints are unique by key and effect
// (ValidateVolumeAttachmentUpdate, validateNodeTaints).
#[tokio::test]
async fn attachment_specs_are_immutable_and_node_taints_unique() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let c = cluster("updatevalidation").await;
    let name = format!("{}-a", c.namespace);
    let attachments: Api<VolumeAttachment> = Api::all(c.client.clone());
    let attachment = json!({"metadata": {"name": name}, "spec": {"attacher": "a.example.com",
        "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}}});
    attachments
        .create(
            &PostParams::default(),
            &serde_json::from_value(attachment).unwrap(),
        )
        .await
        .unwrap();
    let params = PatchParams::default();
    let moved = json!({"spec": {"nodeName": "n2"}});
    let message = invalid(
        attachments
            .patch(&name, &params, &Patch::Merge(&moved))
            .await,
    );
    assert!(
        message.starts_with(&format!(
            "VolumeAttachment.storage.k8s.io \"{name}\" is invalid: spec: Invalid value: "
        )) && message.ends_with(": field is immutable"),
        "{message}"
    );
    attachments
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    let taint = json!({"key": "example.com/a", "effect": "NoExecute"});
    let twice = json!({"spec": {"taints": [taint, taint]}});
    assert_eq!(
        invalid(nodes.patch(&name, &params, &Patch::Merge(&twice)).await),
        format!(
            "Node \"{name}\" is invalid: metadata.taints[1]: Duplicate value: core.Taint{{Key:\"example.com/a\", Value:\"\", Effect:\"NoExecute\", TimeAdded:<nil>}}: taints must be unique by key and effect pair"
        )
    );
    let other_effect = json!({"key": "example.com/a", "effect": "NoSchedule"});
    let both = json!({"spec": {"taints": [taint, other_effect]}});
    nodes
        .patch(&name, &params, &Patch::Merge(&both))
        .await
        .unwrap();
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}

// A claim's spec is immutable but for its volume name, set once, and a Bound claim's request;
// its volume mode is defaulted (ValidatePersistentVolumeClaimUpdate, SetDefaults_*).
#[tokio::test]
async fn claim_specs_are_immutable_but_for_the_volume_name() {
    let c = cluster("claimspec").await;
    let api: Api<PersistentVolumeClaim> = c.api();
    let class = format!("{}-none", c.namespace);
    let claim = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": class,
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(claim).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        created.spec.unwrap().volume_mode.as_deref(),
        Some("Filesystem")
    );
    let params = PatchParams::default();
    let other_class = json!({"spec": {"storageClassName": format!("{class}-other")}});
    assert!(
        invalid(api.patch("c", &params, &Patch::Merge(&other_class)).await).starts_with(
            "PersistentVolumeClaim \"c\" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests"
        )
    );
    let same_size = json!({"spec": {"resources": {"requests": {"storage": "1073741824"}}}});
    api.patch("c", &params, &Patch::Merge(&same_size))
        .await
        .unwrap();
    let volume = json!({"spec": {"volumeName": format!("{}-pv", c.namespace)}});
    api.patch("c", &params, &Patch::Merge(&volume))
        .await
        .unwrap();
    let another = json!({"spec": {"volumeName": format!("{}-other", c.namespace)}});
    invalid(api.patch("c", &params, &Patch::Merge(&another)).await);
}

// A new claim's data sources (the claim strategy's PrepareForCreate): a populator named in
// `dataSource` is dropped; from v1.24 on (AnyVolumeDataSource) `dataSource` and `dataSourceRef`
// are filled from each other, before that `dataSourceRef` is dropped too.
#[tokio::test]
async fn claim_data_sources_are_normalized() {
    let c = cluster("datasources").await;
    let api: Api<PersistentVolumeClaim> = c.api();
    let any_volume_data_source = c.minor().await >= 24;
    let claim_source = json!({"kind": "PersistentVolumeClaim", "name": "src"});
    let populator = json!({"apiGroup": "populators.example.com", "kind": "Sample", "name": "p"});
    let stored = |name: &'static str, field: &'static str, source: &serde_json::Value| {
        let claim = json!({"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}},
            "storageClassName": format!("{}-none", c.namespace), field: source}});
        let api = api.clone();
        async move {
            let created = api
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(claim).unwrap(),
                )
                .await
                .unwrap();
            let spec = serde_json::to_value(created.spec.unwrap()).unwrap();
            (
                spec.get("dataSource").cloned(),
                spec.get("dataSourceRef").cloned(),
            )
        }
    };
    let (source, reference) = stored("clone", "dataSource", &claim_source).await;
    assert_eq!(source.as_ref(), Some(&claim_source));
    assert_eq!(
        reference,
        any_volume_data_source.then(|| claim_source.clone())
    );
    assert_eq!(
        stored("populated", "dataSource", &populator).await,
        (None, None)
    );
    let expected = any_volume_data_source.then(|| populator.clone());
    assert_eq!(
        stored("referenced", "dataSourceRef", &populator).await,
        (expected.clone(), expected)
    );
}

// Delete preconditions (uid, resourceVersion) answer 409 when they do not hold.
#[tokio::test]
async fn delete_preconditions() {
    let c = cluster("preconditions").await;
    let api: Api<ConfigMap> = c.api();
    let created = api
        .create(&PostParams::default(), &configmap("p", "1"))
        .await
        .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(code(api.delete("p", &wrong).await), 409);
    let right = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: created.uid(),
            resource_version: created.resource_version(),
        }),
        ..Default::default()
    };
    api.delete("p", &right).await.unwrap();
    assert_eq!(code(api.get("p").await), 404);
}

// Label selectors, field selectors and limit/continue paging on list.
#[tokio::test]
async fn list_selectors_and_paging() {
    let c = cluster("list").await;
    let api: Api<ConfigMap> = c.api();
    for i in 0..5 {
        let mut cm = configmap(&format!("cm-{i}"), "x");
        cm.metadata.labels = Some(
            [(
                "parity".to_string(),
                if i % 2 == 0 { "even" } else { "odd" }.to_string(),
            )]
            .into(),
        );
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let even = api
        .list(&ListParams::default().labels("parity=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 3);
    // A malformed selector is a 400 in the parser's own words (labels/selector.go).
    for (selector, message) in [
        (
            "parity in (even",
            "unable to parse requirement: found '', expected: ',' or ')'",
        ),
        (
            "=even",
            "found '=', expected: !, identifier, or 'end of string'",
        ),
    ] {
        match api.list(&ListParams::default().labels(selector)).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!((status.code, status.message.as_str()), (400, message));
            }
            other => panic!("{selector:?} listed: {other:?}"),
        }
    }
    let not_even = api
        .list(&ListParams::default().labels("parity!=even"))
        .await
        .unwrap();
    // Objects without the label match too.
    assert_eq!(not_even.items.len(), 2 + c.system_config_maps.len());
    let in_set = api
        .list(&ListParams::default().labels("parity in (odd,other)"))
        .await
        .unwrap();
    assert_eq!(in_set.items.len(), 2);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=cm-3"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let mut paged = Vec::new();
    let mut params = ListParams::default().limit(2);
    loop {
        let page = api.list(&params).await.unwrap();
        assert!(page.items.len() <= 2);
        paged.extend(page.items.iter().map(ResourceExt::name_any));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(
        paged,
        c.config_maps_with(&["cm-0", "cm-1", "cm-2", "cm-3", "cm-4"])
    );
    // With a selector the pages hold matching objects only, and no remainingItemCount.
    let first = api
        .list(&ListParams::default().labels("parity=even").limit(2))
        .await
        .unwrap();
    assert_eq!(first.metadata.remaining_item_count, None);
    let token = first.metadata.continue_.unwrap();
    let second = ListParams::default()
        .labels("parity=even")
        .limit(2)
        .continue_token(&token);
    assert_eq!(
        first
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["cm-0", "cm-2"]
    );
    assert_eq!(names(&api, &second).await, ["cm-4"]);
}

// Pods: spec.nodeName field selector, binding, graceful deletion of scheduled pods
// (pkg/registry/core/pod/strategy.go, pkg/registry/core/pod/storage/storage.go).
#[tokio::test]
async fn pods_binding_and_graceful_deletion() {
    let c = cluster("pods").await;
    let api: Api<Pod> = c.api();
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let unscheduled = api
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .unwrap();
    assert_eq!(unscheduled.items.len(), 1);
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web"}, "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}});
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{}/pods/web/binding",
        c.namespace
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&binding).unwrap())
    .unwrap();
    c.client.request_text(request).await.unwrap();
    assert_eq!(
        api.get("web")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("node-1")
    );
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let terminating = api.get("web").await.unwrap();
    assert!(
        terminating.metadata.deletion_timestamp.is_some(),
        "a scheduled pod waits for its kubelet"
    );
    let finalizer = json!({"metadata": {"finalizers": ["example.com/late"]}});
    assert_eq!(
        code(
            api.patch("web", &PatchParams::default(), &Patch::Merge(&finalizer))
                .await
        ),
        422,
        "a pod in its grace period takes no new finalizer"
    );
    api.delete(
        "web",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(code(api.get("web").await), 404);
}

// Watch: ordered events, resumption from a resourceVersion, selector moves as ADDED/DELETED.
#[tokio::test]
async fn watch_order_resume_and_selector_moves() {
    let c = cluster("watch").await;
    let api: Api<ConfigMap> = c.api();
    let start = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut a = configmap("w", "1");
    a.metadata.labels = Some([("watched".to_string(), "yes".to_string())].into());
    api.create(&PostParams::default(), &a).await.unwrap();
    let patch = json!({"data": {"key": "2"}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let unlabel = json!({"metadata": {"labels": {"watched": null}}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();

    let all: Vec<String> = collect(&api, &WatchParams::default().timeout(2), &start, 4).await;
    assert_eq!(all, ["ADDED w", "MODIFIED w", "MODIFIED w", "DELETED w"]);
    let labelled: Vec<String> = collect(
        &api,
        &WatchParams::default().labels("watched=yes").timeout(2),
        &start,
        3,
    )
    .await;
    assert_eq!(
        labelled,
        ["ADDED w", "MODIFIED w", "DELETED w"],
        "leaving the selector is a DELETED"
    );
}

async fn collect(
    api: &Api<ConfigMap>,
    params: &WatchParams,
    from: &str,
    count: usize,
) -> Vec<String> {
    let stream = api.watch(params, from).await.unwrap().boxed();
    let events: Vec<WatchEvent<ConfigMap>> = stream.take(count).try_collect().await.unwrap();
    events
        .into_iter()
        .map(|event| match event {
            WatchEvent::Added(o) => format!("ADDED {}", o.name_any()),
            WatchEvent::Modified(o) => format!("MODIFIED {}", o.name_any()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.name_any()),
            WatchEvent::Bookmark(_) => "BOOKMARK".into(),
            WatchEvent::Error(e) => format!("ERROR {}", e.code),
        })
        .collect()
}

// A watch from a compacted resourceVersion gets an ERROR event with 410 Gone; resuming after
// a dropped connection from the last seen version loses nothing.
#[tokio::test]
async fn watch_gone_and_resume_after_drop() {
    let c = cluster("gone").await;
    let Some(sim) = &c.sim else {
        eprintln!("skipping watch_gone_and_resume_after_drop: needs kube-sim's restart hook");
        return;
    };
    let api: Api<ConfigMap> = c.api();
    let start = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &configmap("r1", "1"))
        .await
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    let first = stream.try_next().await.unwrap().unwrap();
    let WatchEvent::Added(object) = first else {
        panic!("expected ADDED")
    };
    let seen = object.resource_version().unwrap();
    sim.drop_watches();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none(),
        "dropped"
    );
    api.create(&PostParams::default(), &configmap("r2", "1"))
        .await
        .unwrap();
    let resumed = collect(&api, &WatchParams::default().timeout(2), &seen, 1).await;
    assert_eq!(resumed, ["ADDED r2"]);
    sim.restart_keeping_state();
    let gone = collect(&api, &WatchParams::default().timeout(2), &start, 1).await;
    assert_eq!(gone, ["ERROR 410"]);
}

// Garbage collection: dependents of a deleted owner are deleted (background propagation).
#[tokio::test]
async fn owner_references_are_collected() {
    let c = cluster("gc").await;
    let api: Api<ConfigMap> = c.api();
    owner_and_dependent(&api, "owner", "dependent").await;
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    until(
        || async { code(api.get("dependent").await) == 404 },
        "the dependent was not garbage collected",
    )
    .await;
}

/// Creates ConfigMap `owner` and ConfigMap `dependent` with an ownerReference to it.
async fn owner_and_dependent(api: &Api<ConfigMap>, owner: &str, dependent: &str) {
    let created = api
        .create(&PostParams::default(), &configmap(owner, "1"))
        .await
        .unwrap();
    let mut object = configmap(dependent, "1");
    object.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.into(),
            uid: created.uid().unwrap(),
            ..Default::default()
        },
    ]);
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// Polls `done` for up to 10 s (the garbage collector works in the background).
async fn until<F, Fut>(done: F, failure: &str)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{failure}");
}

// Orphan propagation strips the owner reference and keeps the dependent; foreground deletion
// removes the dependents before the owner
// (https://kubernetes.io/docs/concepts/architecture/garbage-collection/).
#[tokio::test]
async fn orphan_and_foreground_propagation() {
    let c = cluster("propagation").await;
    let api: Api<ConfigMap> = c.api();
    owner_and_dependent(&api, "kept-owner", "kept").await;
    api.delete("kept-owner", &DeleteParams::orphan())
        .await
        .unwrap();
    until(
        || async {
            api.get("kept")
                .await
                .unwrap()
                .metadata
                .owner_references
                .unwrap_or_default()
                .is_empty()
        },
        "the orphan kept its owner reference",
    )
    .await;
    owner_and_dependent(&api, "fg-owner", "fg").await;
    api.delete("fg-owner", &DeleteParams::foreground())
        .await
        .unwrap();
    until(
        || async { code(api.get("fg").await) == 404 && code(api.get("fg-owner").await) == 404 },
        "foreground deletion did not finish",
    )
    .await;
    assert_eq!(code(api.get("kept-owner").await), 404);
}

// 429 with Retry-After is retried by the client (kube's default retry policy).
#[tokio::test]
async fn injected_throttling_is_retried() {
    let c = cluster("faults").await;
    let Some(sim) = &c.sim else {
        eprintln!("skipping injected_throttling_is_retried: needs kube-sim's fault injection");
        return;
    };
    let api: Api<ConfigMap> = c.api();
    api.create(&PostParams::default(), &configmap("t", "1"))
        .await
        .unwrap();
    sim.faults().fail_next(
        "GET",
        "configmaps",
        http::StatusCode::TOO_MANY_REQUESTS,
        2,
        Some(1),
    );
    let started = std::time::Instant::now();
    api.get("t").await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
}

// Creating a CustomResourceDefinition serves its resource (created without the status it may
// carry, when it has a status subresource); deleting it stops serving it
// (apiextensions-apiserver).
#[tokio::test]
async fn custom_resources_are_served_from_crds() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("crd").await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let group = format!("{}.example.com", c.namespace);
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                          "subresources": {"status": {}}}],
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.namespace, &resource);
    let mut widget = DynamicObject::new("w1", &resource);
    // The status given at create is dropped: it comes through `/status` only.
    widget.data = json!({"spec": {"size": 3}, "status": {"ready": true}});
    let created = create_once_served(&widgets, &widget).await;
    assert_eq!(created.data["spec"]["size"], 3);
    assert_eq!(created.data.get("status"), None, "{:?}", created.data);
    // A custom resource's body must name its kind (nothing defaults it, unlike built-ins).
    let mut bare = DynamicObject::new("w2", &resource);
    bare.types = None;
    assert_eq!(
        code(widgets.create(&PostParams::default(), &bare).await),
        400
    );
    assert_eq!(
        widgets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    crds.delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}

// A custom resource is pruned to its CRD's structural schema and validated against it:
// required fields, types and enums, each violation one cause of a 422 Invalid
// (apiextensions-apiserver). A preserved part keeps anything.
#[tokio::test]
async fn custom_resources_follow_their_schema() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("crd-schema").await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let group = format!("{}.example.com", c.namespace);
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("gizmos.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["size", "mode"], "properties": {
                        "size": {"type": "integer"},
                        "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}},
            }],
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Gizmo"), "gizmos");
    let gizmos: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.namespace, &resource);
    let gizmo = |name: &str, spec: serde_json::Value| {
        let mut object = DynamicObject::new(name, &resource);
        object.data = json!({"spec": spec, "unknown": 1});
        object
    };
    let object = gizmo(
        "g1",
        json!({"size": 1, "mode": "Fast", "extra": true, "free": {"any": {"thing": 1}}}),
    );
    let created = create_once_served(&gizmos, &object).await;
    assert_eq!(
        created.data,
        json!({"spec": {"size": 1, "mode": "Fast", "free": {"any": {"thing": 1}}}}),
        "unknown fields pruned, the preserved part kept"
    );
    let refused = gizmos
        .create(
            &PostParams::default(),
            &gizmo("g2", json!({"mode": "Medium"})),
        )
        .await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        format!(
            "Gizmo.{group} \"g2\" is invalid: [spec.mode: Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\", spec.size: Required value]"
        )
    );
    let typed = gizmos
        .create(
            &PostParams::default(),
            &gizmo("g3", json!({"size": "big", "mode": "Slow"})),
        )
        .await;
    let Err(kube::Error::Api(status)) = typed else {
        panic!("expected a refusal, got {typed:?}");
    };
    assert_eq!(
        status.message,
        format!(
            "Gizmo.{group} \"g3\" is invalid: spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
        )
    );
    crds.delete(&format!("gizmos.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}

/// Creates `object` as soon as the API server serves its kind: a real one needs a moment to
/// establish a new CRD (until then it answers 404).
async fn create_once_served<K>(api: &Api<K>, object: &K) -> K
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..50 {
        match api.create(&PostParams::default(), object).await {
            Ok(created) => return created,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("creating {object:?}: {error}"),
        }
    }
    panic!("the CRD of {object:?} is not served");
}

/// Says that `test` (or a part of it) did not run because the server lacks `what`: on stderr
/// and, when `CSI_SUITE_SKIPS` names a file, as a line appended to it, as the scenario suite
/// reports its skips (`make test-real` counts those lines and prints them).
fn skip(test: &str, what: &str) {
    let line = format!("skipped {test}: {what}");
    eprintln!("{line}");
    if let Some(file) = std::env::var_os("CSI_SUITE_SKIPS") {
        use std::io::Write;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(error) = appended {
            panic!("recording the skip in {}: {error}", file.to_string_lossy());
        }
    }
}

/// A refusal as the Status says it: code, reason, message, and each cause's field, reason
/// and message.
fn refusal<T: std::fmt::Debug>(
    result: kube::Result<T>,
) -> (u16, String, String, Vec<(String, String, String)>) {
    let Err(kube::Error::Api(status)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    let causes = status
        .details
        .map(|d| d.causes)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.field, c.reason, c.message))
        .collect();
    (status.code, status.reason, status.message, causes)
}

// The CEL rules of a CRD's schema (`x-kubernetes-validations`, v1.25+) as the group snapshot
// CRDs write them: a field immutable once set (a transition rule, `self == oldSelf`: not run
// on create nor where the old object has no value), exactly one of two fields, a property
// named by a CEL reserved word (`__namespace__`), a list's size, and a status field that may
// not go back; each broken rule is one field error of a 422 Invalid at the rule's node,
// `Invalid value: "<schema type>": <message or failed rule>`. A rule that does not compile
// refuses the CRD (apiextensions-apiserver pkg/apiserver/schema/cel).
#[tokio::test]
async fn custom_resources_follow_their_cel_rules() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("crd-cel").await;
    if c.minor().await < 25 {
        // v1.19 prunes `x-kubernetes-validations` from the CRD: its rules would never run.
        skip(
            "custom_resources_follow_their_cel_rules",
            "CRD validation rules (x-kubernetes-validations) need Kubernetes 1.25",
        );
        return;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let group = format!("{}.example.com", c.namespace);
    // Every string and list is bounded: kube-apiserver refuses rules whose estimated cost
    // over unbounded values exceeds its budget.
    let string = json!({"type": "string", "maxLength": 63});
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object",
            "x-kubernetes-validations": [{
                "rule": "(has(self.a) && !has(self.b)) || (!has(self.a) && has(self.b))",
                "message": "exactly one of a and b must be set"}],
            "properties": {
                "driver": {"type": "string", "maxLength": 63, "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "driver is immutable once set"}]},
                "a": string,
                "b": string,
                "source": {"type": "object",
                    "x-kubernetes-validations": [{"rule": "has(self.name) && has(self.__namespace__)"}],
                    "properties": {"name": string, "namespace": string}},
                "members": {"type": "array", "maxItems": 8, "items": string,
                    "x-kubernetes-validations": [{"rule": "size(self) > 0", "message": "members must not be empty"}]}}},
        "status": {"type": "object", "properties": {
            "readyToUse": {"type": "boolean", "x-kubernetes-validations": [
                {"rule": "!oldSelf || self", "message": "readyToUse cannot go back to false"}]}}}}});
    let crd = |name: &str, schema: &serde_json::Value| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{name}s.{group}")},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": format!("{name}s"), "singular": name, "kind": "SnapshotGroup"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": schema}, "subresources": {"status": {}}}],
            }
        }))
        .unwrap()
    };
    // A rule that does not compile refuses the CRD; the cause names the rule (real servers
    // print it as a Go struct, kube-sim as JSON) and gives the parser's message.
    let broken = json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [{"rule": "self.a +"}]}}});
    let (code, reason, _, causes) = refusal(
        crds.create(&PostParams::default(), &crd("broken", &broken))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(causes.len(), 1, "{causes:?}");
    let (field, reason, message) = &causes[0];
    assert_eq!(
        (field.as_str(), reason.as_str()),
        (
            "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule",
            "FieldValueInvalid"
        )
    );
    assert!(
        message.ends_with(": compilation failed: ERROR: <input>:1:9: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | self.a +\n | ........^"),
        "{message}"
    );

    crds.create(&PostParams::default(), &crd("snapshotgroup", &schema))
        .await
        .unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "SnapshotGroup"),
        "snapshotgroups",
    );
    let groups: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), &c.namespace, &resource);
    let object = |name: &str, spec: serde_json::Value| {
        let mut object = DynamicObject::new(name, &resource);
        object.data = json!({"spec": spec});
        object
    };
    let post = PostParams::default();
    let valid = json!({"driver": "csi.example.com", "a": "x",
        "source": {"name": "claim", "namespace": "ns"}, "members": ["m1"]});
    let created = create_once_served(&groups, &object("g1", valid)).await;
    let kind = format!("SnapshotGroup.{group}");
    // (case, spec, the refusal's field and message after the path).
    let refused_creates = [
        (
            "both of a and b",
            json!({"a": "x", "b": "y"}),
            "spec",
            "Invalid value: \"object\": exactly one of a and b must be set",
        ),
        (
            "neither a nor b",
            json!({"driver": "csi.example.com"}),
            "spec",
            "Invalid value: \"object\": exactly one of a and b must be set",
        ),
        (
            "a reserved word's property absent",
            json!({"a": "x", "source": {"name": "claim"}}),
            "spec.source",
            "Invalid value: \"object\": failed rule: has(self.name) && has(self.__namespace__)",
        ),
        (
            "an empty list",
            json!({"a": "x", "members": []}),
            "spec.members",
            "Invalid value: \"array\": members must not be empty",
        ),
    ];
    for (i, (case, spec, field, detail)) in refused_creates.into_iter().enumerate() {
        let name = format!("refused-{i}");
        let (code, reason, message, causes) =
            refusal(groups.create(&post, &object(&name, spec)).await);
        assert_eq!((code, reason.as_str()), (422, "Invalid"), "{case}");
        assert_eq!(
            message,
            format!("{kind} \"{name}\" is invalid: {field}: {detail}"),
            "{case}"
        );
        assert_eq!(
            causes,
            [(field.into(), "FieldValueInvalid".into(), detail.into())],
            "{case}"
        );
    }

    // A type error blocks the rules: one cause stands for them all.
    let (code, _, message, causes) = refusal(
        groups
            .create(&post, &object("typed", json!({"a": 1, "b": "y"})))
            .await,
    );
    assert_eq!(
        (code, message),
        (
            422,
            format!(
                "{kind} \"typed\" is invalid: [spec.a: Invalid value: \"integer\": spec.a in body must be of type string: \"integer\", <nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]"
            )
        )
    );
    assert_eq!(
        causes
            .iter()
            .map(|(field, reason, _)| (field.as_str(), reason.as_str()))
            .collect::<Vec<_>>(),
        [
            ("spec.a", "FieldValueTypeInvalid"),
            ("<nil>", "FieldValueInvalid")
        ]
    );

    // Updates: the transition rule compares with the stored object.
    let mut changed = created.clone();
    changed.data["spec"]["driver"] = json!("other.example.com");
    let immutable = "Invalid value: \"string\": driver is immutable once set";
    let (code, reason, message, causes) = refusal(groups.replace("g1", &post, &changed).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        format!("{kind} \"g1\" is invalid: spec.driver: {immutable}")
    );
    assert_eq!(
        causes,
        [(
            "spec.driver".into(),
            "FieldValueInvalid".into(),
            immutable.into()
        )]
    );
    let patch = json!({"spec": {"driver": "other.example.com"}});
    let (code, _, message, _) = refusal(
        groups
            .patch("g1", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(
        (code, message),
        (
            422,
            format!("{kind} \"g1\" is invalid: spec.driver: {immutable}")
        )
    );
    // Switching from a to b keeps exactly one, and the same driver passes its rule.
    let switch = json!({"spec": {"a": null, "b": "y"}});
    let switched = groups
        .patch("g1", &PatchParams::default(), &Patch::Merge(&switch))
        .await
        .unwrap();
    assert_eq!(switched.data["spec"]["b"], "y");
    // An object without a driver may set one: the old object has no value to compare.
    groups
        .create(&post, &object("g2", json!({"a": "x"})))
        .await
        .unwrap();
    let set_driver = json!({"spec": {"driver": "csi.example.com"}});
    groups
        .patch("g2", &PatchParams::default(), &Patch::Merge(&set_driver))
        .await
        .unwrap();

    // The status subresource: readyToUse may become true, never false again.
    let ready = |value: bool| json!({"status": {"readyToUse": value}});
    groups
        .patch_status("g1", &PatchParams::default(), &Patch::Merge(&ready(true)))
        .await
        .unwrap();
    let back = "Invalid value: \"boolean\": readyToUse cannot go back to false";
    let (code, reason, message, causes) = refusal(
        groups
            .patch_status("g1", &PatchParams::default(), &Patch::Merge(&ready(false)))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        format!("{kind} \"g1\" is invalid: status.readyToUse: {back}")
    );
    assert_eq!(
        causes,
        [(
            "status.readyToUse".into(),
            "FieldValueInvalid".into(),
            back.into()
        )]
    );
    crds.delete(&format!("snapshotgroups.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}

/// A 422 Invalid refusal of `object` (`Kind.group "name"`) with one field error, `field:
/// detail`, as kube-apiserver gives a broken CEL rule.
fn assert_invalid<T: std::fmt::Debug>(
    result: kube::Result<T>,
    object: &str,
    field: &str,
    detail: &str,
) {
    let (code, reason, message, causes) = refusal(result);
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert_eq!(message, format!("{object} is invalid: {field}: {detail}"));
    assert_eq!(
        causes,
        [(field.into(), "FieldValueInvalid".into(), detail.into())]
    );
}

// The snapshot CRDs csi-snapshotter generates carry upstream external-snapshotter's CEL rules,
// which servers from 1.25 enforce (older ones drop `x-kubernetes-validations` from a CRD: the
// test reads the CRD back to know): a VolumeSnapshot's source may neither change nor switch
// kinds nor name both, its class name may not be empty; a content names its snapshot's name and
// namespace, and keeps its source and its sourceVolumeMode. Each refusal is upstream's message
// in kube-apiserver's 422.
#[tokio::test]
async fn snapshot_crds_enforce_upstreams_cel_rules() {
    use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let c = cluster("snapshot-cel").await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let generated = csi_kinds::snapshot::crds();
    let has_rules = |versions: &[_]| {
        serde_json::to_string(versions)
            .unwrap()
            .contains("x-kubernetes-validations")
    };
    assert!(
        generated.iter().any(|crd| has_rules(&crd.spec.versions)),
        "the generated snapshot CRDs carry no CEL rules"
    );
    // The CRDs are cluster-wide: a real cluster's own are replaced by the current ones.
    for mut crd in generated {
        let name = crd.name_any();
        match crds.get_opt(&name).await.unwrap() {
            None => crds.create(&PostParams::default(), &crd).await.unwrap(),
            Some(existing) => {
                crd.metadata.resource_version = existing.metadata.resource_version;
                crds.replace(&name, &PostParams::default(), &crd)
                    .await
                    .unwrap()
            }
        };
    }
    let served = crds
        .get("volumesnapshots.snapshot.storage.k8s.io")
        .await
        .unwrap();
    if !has_rules(&served.spec.versions) {
        skip(
            "snapshot_crds_enforce_upstreams_cel_rules",
            "the server dropped the CRDs' x-kubernetes-validations (CEL rules need Kubernetes 1.25)",
        );
        return;
    }

    let snapshots: Api<VolumeSnapshot> = Api::namespaced(c.client.clone(), &c.namespace);
    let snapshot = |name: &str, spec: serde_json::Value| -> VolumeSnapshot {
        serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    let post = PostParams::default();
    let merge = |patch: serde_json::Value| Patch::Merge(patch);
    let created = create_once_served(
        &snapshots,
        &snapshot(
            "s1",
            json!({"source": {"persistentVolumeClaimName": "claim-a"}}),
        ),
    )
    .await;
    let s1 = "VolumeSnapshot.snapshot.storage.k8s.io \"s1\"";
    let mut changed = created.clone();
    changed.spec.source.persistent_volume_claim_name = Some("claim-b".into());
    assert_invalid(
        snapshots.replace("s1", &post, &changed).await,
        s1,
        "spec.source.persistentVolumeClaimName",
        "Invalid value: \"string\": persistentVolumeClaimName is immutable",
    );
    // The content name is new (its own transition rule does not run), the claim is gone.
    let switch = json!({"spec": {"source": {"persistentVolumeClaimName": null,
        "volumeSnapshotContentName": "content"}}});
    assert_invalid(
        snapshots
            .patch("s1", &PatchParams::default(), &merge(switch))
            .await,
        s1,
        "spec.source",
        "Invalid value: \"object\": persistentVolumeClaimName is required once set",
    );
    // What the rules leave alone: a label, and a class named later.
    let labelled = json!({"metadata": {"labels": {"a": "b"}},
        "spec": {"volumeSnapshotClassName": "class"}});
    snapshots
        .patch("s1", &PatchParams::default(), &merge(labelled))
        .await
        .unwrap();
    assert_invalid(
        snapshots
            .create(
                &post,
                &snapshot(
                    "both",
                    json!({"source": {"persistentVolumeClaimName": "claim-a",
                        "volumeSnapshotContentName": "content"}}),
                ),
            )
            .await,
        "VolumeSnapshot.snapshot.storage.k8s.io \"both\"",
        "spec.source",
        "Invalid value: \"object\": exactly one of volumeSnapshotContentName and persistentVolumeClaimName must be set",
    );
    assert_invalid(
        snapshots
            .create(
                &post,
                &snapshot(
                    "empty-class",
                    json!({"source": {"persistentVolumeClaimName": "claim-a"},
                        "volumeSnapshotClassName": ""}),
                ),
            )
            .await,
        "VolumeSnapshot.snapshot.storage.k8s.io \"empty-class\"",
        "spec.volumeSnapshotClassName",
        "Invalid value: \"string\": volumeSnapshotClassName must not be the empty string when set",
    );

    let contents: Api<VolumeSnapshotContent> = Api::all(c.client.clone());
    let content = |name: &str, reference: serde_json::Value| -> VolumeSnapshotContent {
        serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": name},
            "spec": {"volumeSnapshotRef": reference, "deletionPolicy": "Retain",
                "driver": "hostpath.csi.k8s.io", "source": {"volumeHandle": "vol-1"},
                "sourceVolumeMode": "Filesystem"}}))
        .unwrap()
    };
    let unnamespaced = format!("{}-unnamespaced", c.namespace);
    assert_invalid(
        contents
            .create(&post, &content(&unnamespaced, json!({"name": "s1"})))
            .await,
        &format!("VolumeSnapshotContent.snapshot.storage.k8s.io \"{unnamespaced}\""),
        "spec.volumeSnapshotRef",
        "Invalid value: \"object\": both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set",
    );
    let name = format!("{}-content", c.namespace);
    contents
        .create(
            &post,
            &content(&name, json!({"name": "s1", "namespace": c.namespace})),
        )
        .await
        .unwrap();
    let object = format!("VolumeSnapshotContent.snapshot.storage.k8s.io \"{name}\"");
    // (patch of the spec, the refusal's field and detail).
    let refused_updates = [
        (
            json!({"sourceVolumeMode": "Block"}),
            "spec.sourceVolumeMode",
            "Invalid value: \"string\": sourceVolumeMode is immutable",
        ),
        (
            json!({"sourceVolumeMode": null}),
            "spec",
            "Invalid value: \"object\": sourceVolumeMode is required once set",
        ),
        (
            json!({"source": {"volumeHandle": "vol-2"}}),
            "spec.source.volumeHandle",
            "Invalid value: \"string\": volumeHandle is immutable",
        ),
    ];
    for (spec, field, detail) in refused_updates {
        assert_invalid(
            contents
                .patch(
                    &name,
                    &PatchParams::default(),
                    &merge(json!({"spec": spec})),
                )
                .await,
            &object,
            field,
            detail,
        );
    }
    contents
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

// A watch asking for its initial events (the streaming list of newer client-go informers,
// sendInitialEvents) is refused as a server without the WatchList feature refuses it; the
// informer then falls back to list and watch.
#[tokio::test]
async fn a_watch_with_resource_version_match_is_refused() {
    let c = cluster("watch-list").await;
    let path = format!(
        "/api/v1/namespaces/{}/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=",
        c.namespace
    );
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    let refused = c.client.request_text(request).await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert_eq!(status.code, 422);
    // Since 1.27 a watch may carry sendInitialEvents; the WatchList gate decides.
    let refusal = if c.minor().await >= 27 {
        "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    } else {
        "[resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch, resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided]"
    };
    assert_eq!(
        status.message,
        format!("ListOptions.meta.k8s.io \"\" is invalid: {refusal}")
    );
}

// Deleting a namespace deletes its content, then the namespace (namespace controller).
#[tokio::test]
async fn namespace_deletion_removes_content() {
    let c = cluster("nsdelete").await;
    let api: Api<ConfigMap> = c.api();
    api.create(&PostParams::default(), &configmap("inside", "1"))
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    namespaces
        .delete(&c.namespace, &DeleteParams::default())
        .await
        .unwrap();
    for _ in 0..200 {
        if code(namespaces.get(&c.namespace).await) == 404 {
            assert_eq!(code(api.get("inside").await), 404);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("namespace not deleted");
}

// deletecollection honours label selectors.
#[tokio::test]
async fn delete_collection_by_label() {
    let c = cluster("deletecollection").await;
    let api: Api<ConfigMap> = c.api();
    for (name, label) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut cm = configmap(name, "1");
        cm.metadata.labels = Some([("group".to_string(), label.to_string())].into());
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("group=x"),
    )
    .await
    .unwrap();
    assert_eq!(
        names(&api, &ListParams::default()).await,
        c.config_maps_with(&["c"])
    );
}

// Strategic merge patch on built-in kinds: metadata.finalizers merge as a set, containers
// merge by name; custom resources answer 415 (apimachinery/pkg/util/strategicpatch).
#[tokio::test]
async fn strategic_merge_patch() {
    let c = cluster("strategic").await;
    let api: Api<Pod> = c.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sm", "finalizers": ["example.com/a"]},
        "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "side", "image": "side:1"}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let patch = json!({
        "metadata": {"finalizers": ["example.com/b"]},
        "spec": {"containers": [{"name": "app", "image": "app:2"}]},
    });
    let patched = api
        .patch("sm", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let mut finalizers = patched.metadata.finalizers.clone().unwrap();
    finalizers.sort();
    assert_eq!(finalizers, ["example.com/a", "example.com/b"]);
    let images: Vec<(String, String)> = patched
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| (c.name, c.image.unwrap_or_default()))
        .collect();
    assert!(
        images.contains(&("app".into(), "app:2".into()))
            && images.contains(&("side".into(), "side:1".into())),
        "{images:?}"
    );
    let remove = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a", "example.com/b"]}});
    let patched = api
        .patch("sm", &PatchParams::default(), &Patch::Strategic(&remove))
        .await
        .unwrap();
    assert!(patched.metadata.finalizers.unwrap_or_default().is_empty());
}

// Watches that allow bookmarks receive BOOKMARK events carrying a resourceVersion to resume
// from (k8s.io/apiserver/pkg/storage/cacher, watch bookmarks).
#[tokio::test]
async fn watch_bookmarks() {
    let c = cluster("bookmarks").await;
    let Some(sim) = &c.sim else {
        eprintln!("skipping watch_bookmarks: a real apiserver sends bookmarks about once a minute");
        return;
    };
    sim.set_bookmark_interval(Duration::from_millis(100));
    let api: Api<ConfigMap> = c.api();
    api.create(&PostParams::default(), &configmap("b", "1"))
        .await
        .unwrap();
    let listed: u64 = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    let mut params = WatchParams::default().timeout(2);
    params.bookmarks = true;
    let mut stream = api
        .watch(&params, &listed.to_string())
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(2), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let WatchEvent::Bookmark(bookmark) = event else {
        panic!("expected a bookmark")
    };
    let version: u64 = bookmark.metadata.resource_version.parse().unwrap();
    assert!(version >= listed);
}

// Apply bodies may be YAML, as kubectl sends them.
#[tokio::test]
async fn apply_accepts_yaml() {
    let c = cluster("yaml").await;
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\n  namespace: {}\ndata:\n  key: value\n",
        c.namespace
    );
    let request = http::Request::patch(format!(
        "/api/v1/namespaces/{}/configmaps/from-yaml?fieldManager=kubectl",
        c.namespace
    ))
    .header("content-type", "application/apply-patch+yaml")
    .body(yaml.into_bytes())
    .unwrap();
    c.client.request_text(request).await.unwrap();
    let api: Api<ConfigMap> = c.api();
    assert_eq!(
        api.get("from-yaml").await.unwrap().data.unwrap()["key"],
        "value"
    );
}

// Fault injection: a restart on an empty store loses every object but the built-in
// namespaces, and resourceVersions keep increasing.
#[tokio::test]
async fn restart_losing_state() {
    let c = cluster("wipe").await;
    let Some(sim) = &c.sim else {
        eprintln!("skipping restart_losing_state: needs kube-sim's restart hook");
        return;
    };
    let api: Api<ConfigMap> = c.api();
    let before: u64 = api
        .create(&PostParams::default(), &configmap("gone", "1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    sim.restart_losing_state();
    let defaults: Api<ConfigMap> = Api::namespaced(c.client.clone(), "default");
    assert_eq!(code(api.get("gone").await), 404);
    let after: u64 = defaults
        .create(&PostParams::default(), &configmap("new", "1"))
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    assert!(after > before);
}

// core/v1 and events.k8s.io/v1 Events are one storage: an Event written through either group
// is read, listed and watched through both, with the fields converted as
// pkg/apis/events/v1/conversion.go does (involvedObject ⇔ regarding, source ⇔
// deprecatedSource, message ⇔ note, count/firstTimestamp/lastTimestamp ⇔ deprecated*,
// reportingComponent ⇔ reportingController).
#[tokio::test]
async fn events_are_shared_between_core_and_events_group() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    let c = cluster("events").await;
    let core: Api<CoreEvent> = c.api();
    let new: Api<NewEvent> = c.api();
    let listed = new.list(&ListParams::default()).await.unwrap();
    let start = listed.metadata.resource_version.unwrap();
    let mut watch = new
        .watch(&WatchParams::default().timeout(10), &start)
        .await
        .unwrap()
        .boxed();

    let legacy: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "legacy"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": c.namespace, "apiVersion": "v1"},
        "reason": "Started", "message": "started container", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:05Z",
        "count": 3,
    }))
    .unwrap();
    core.create(&PostParams::default(), &legacy).await.unwrap();
    let seen = new.get("legacy").await.unwrap();
    assert_eq!(
        seen.regarding.as_ref().unwrap().name.as_deref(),
        Some("web")
    );
    assert_eq!(seen.note.as_deref(), Some("started container"));
    assert_eq!(seen.reason.as_deref(), Some("Started"));
    assert_eq!(seen.type_.as_deref(), Some("Normal"));
    let source = seen.deprecated_source.clone().unwrap();
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some("node-1"));
    assert_eq!(seen.deprecated_count, Some(3));
    assert_eq!(
        seen.deprecated_first_timestamp.unwrap().0.to_string(),
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(
        seen.deprecated_last_timestamp.unwrap().0.to_string(),
        "2026-01-01T00:00:05Z"
    );
    let Some(WatchEvent::Added(added)) = watch.try_next().await.unwrap() else {
        panic!("expected ADDED through events.k8s.io")
    };
    assert_eq!(added.note.as_deref(), Some("started container"));

    let modern: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "modern"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "example.com/attacher", "reportingInstance": "attacher-0",
        "action": "Attach", "reason": "Attached", "type": "Warning", "note": "attach failed",
        "regarding": {"kind": "Pod", "name": "web", "namespace": c.namespace, "apiVersion": "v1"},
        "related": {"kind": "Node", "name": "node-1", "apiVersion": "v1"},
        "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:03.000000Z"},
    }))
    .unwrap();
    new.create(&PostParams::default(), &modern).await.unwrap();
    let seen = core.get("modern").await.unwrap();
    assert_eq!(seen.involved_object.name.as_deref(), Some("web"));
    assert_eq!(seen.message.as_deref(), Some("attach failed"));
    assert_eq!(
        seen.reporting_component.as_deref(),
        Some("example.com/attacher")
    );
    assert_eq!(seen.reporting_instance.as_deref(), Some("attacher-0"));
    assert_eq!(seen.action.as_deref(), Some("Attach"));
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(seen.related.unwrap().name.as_deref(), Some("node-1"));
    assert_eq!(seen.series.unwrap().count, Some(2));
    assert!(seen.event_time.is_some());
    let Some(WatchEvent::Added(added)) = watch.try_next().await.unwrap() else {
        panic!("expected ADDED through events.k8s.io")
    };
    assert_eq!(
        added.reporting_controller.as_deref(),
        Some("example.com/attacher")
    );

    // A patch through one group changes what the other reads.
    let patch = json!({"message": "restarted container"});
    core.patch("legacy", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        new.get("legacy").await.unwrap().note.as_deref(),
        Some("restarted container")
    );
    assert_eq!(
        names(&core, &ListParams::default()).await,
        ["legacy", "modern"]
    );
    let by_controller = new
        .list(&ListParams::default().fields("reportingController=example.com/attacher"))
        .await
        .unwrap();
    assert_eq!(by_controller.items.len(), 1);
    new.delete("legacy", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(core.get("legacy").await), 404);
}

/// One plain HTTP/1.1 GET, for the parts of a response `kube::Client` does not expose (the
/// Status body of an error).
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: kube-sim\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}

async fn configmaps(api: &Api<ConfigMap>, names: &[&str]) {
    for name in names {
        api.create(&PostParams::default(), &configmap(name, "1"))
            .await
            .unwrap();
    }
}

// Every page of a paged list comes from the snapshot of the first page (etcd reads at the
// first page's revision): later creations stay invisible, later deletions still appear,
// changed objects show their old state (https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks).
#[tokio::test]
async fn list_pages_are_one_snapshot() {
    let c = cluster("snapshot").await;
    let api: Api<ConfigMap> = c.api();
    configmaps(&api, &["a", "b", "c", "d"]).await;
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let snapshot = first.metadata.resource_version.clone().unwrap();
    let system = c.system_config_maps.len() as i64;
    assert_eq!(first.metadata.remaining_item_count, Some(2 + system));
    api.create(&PostParams::default(), &configmap("e", "1"))
        .await
        .unwrap();
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"key": "2"}})),
    )
    .await
    .unwrap();
    api.delete("d", &DeleteParams::default()).await.unwrap();
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut page = first;
    loop {
        assert_eq!(page.metadata.resource_version.as_deref(), Some(&*snapshot));
        seen.extend(
            page.items
                .iter()
                .filter(|o| !c.system_config_maps.contains(&o.name_any()))
                .map(|o| (o.name_any(), o.data.clone().unwrap()["key"].clone())),
        );
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => {
                page = api
                    .list(&ListParams::default().limit(2).continue_token(&token))
                    .await
                    .unwrap();
            }
            None => break,
        }
    }
    let expected: Vec<(String, String)> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| (n.to_string(), "1".to_string()))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(
        names(&api, &ListParams::default()).await,
        c.config_maps_with(&["a", "b", "c", "e"])
    );
}

// A continue token whose snapshot is no longer in the history answers 410 Expired with
// kube-apiserver's message and a token that continues, inconsistently, on the latest state
// (k8s.io/apiserver/pkg/storage/etcd3/store.go handleCompactedErrorForPaging).
#[tokio::test]
async fn expired_continue_token_is_gone() {
    let c = cluster("expired").await;
    let Some(sim) = &c.sim else {
        eprintln!("skipping expired_continue_token_is_gone: needs kube-sim's compaction hook");
        return;
    };
    let api: Api<ConfigMap> = c.api();
    configmaps(&api, &["a", "b", "c"]).await;
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    configmaps(&api, &["d"]).await;
    sim.restart_keeping_state();
    let path = format!(
        "/api/v1/namespaces/{}/configmaps?limit=1&continue={token}",
        c.namespace
    );
    let (status, body) = raw_get(sim.addr, &path).await;
    assert_eq!(status, 410);
    assert_eq!(body["reason"], "Expired");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old"),
        "{body}"
    );
    let latest = body["metadata"]["continue"].as_str().unwrap();
    assert_eq!(
        names(&api, &ListParams::default().continue_token(latest)).await,
        c.config_maps_with(&["b", "c", "d"]),
        "the latest state"
    );
    assert_eq!(
        code(
            api.list(&ListParams::default().continue_token("bm90LWEtdG9rZW4"))
                .await
        ),
        400
    );
}

// resourceVersion and resourceVersionMatch on list
// (https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list):
// Exact reads that revision, NotOlderThan the latest, a legacy resourceVersion with a limit
// is Exact, "0" is served whole from the watch cache (limit ignored), a version the server
// has not reached is 504 after a wait (checked on kube-sim, whose address the test has), and
// invalid combinations are 422.
#[tokio::test]
async fn list_resource_version_semantics() {
    use kube::api::VersionMatch;
    use kube::core::ObjectList;
    let c = cluster("listrv").await;
    let api: Api<ConfigMap> = c.api();
    configmaps(&api, &["a", "b"]).await;
    let before = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    configmaps(&api, &["c"]).await;
    let exact = ListParams::default()
        .at(&before)
        .matching(VersionMatch::Exact);
    assert_eq!(names(&api, &exact).await, c.config_maps_with(&["a", "b"]));
    let legacy_paged = ListParams::default().at(&before).limit(10);
    assert_eq!(
        names(&api, &legacy_paged).await,
        c.config_maps_with(&["a", "b"])
    );
    let not_older = ListParams::default()
        .at(&before)
        .matching(VersionMatch::NotOlderThan);
    // Served from the watch cache, which servers before 1.2x do not keep in key order.
    let mut newer = names(&api, &not_older).await;
    newer.sort();
    assert_eq!(newer, c.config_maps_with(&["a", "b", "c"]));
    let any: ObjectList<ConfigMap> = c
        .client
        .request(
            http::Request::get(format!(
                "/api/v1/namespaces/{}/configmaps?resourceVersion=0&limit=1",
                c.namespace
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        any.items.len(),
        3 + c.system_config_maps.len(),
        "limit is ignored for resourceVersion=0"
    );
    // kube::Client retries 504 (15 times), so this one goes out as a single request.
    if let Some(sim) = &c.sim {
        let future: u64 = before.parse::<u64>().unwrap() + 1_000_000;
        let path = format!(
            "/api/v1/namespaces/{}/configmaps?resourceVersion={future}&resourceVersionMatch=NotOlderThan",
            c.namespace
        );
        let (status, body) = raw_get(sim.addr, &path).await;
        assert_eq!(status, 504);
        assert_eq!(
            body["details"]["causes"][0]["reason"],
            "ResourceVersionTooLarge"
        );
    }
    let forbidden = c
        .client
        .request::<ObjectList<ConfigMap>>(
            http::Request::get(format!(
                "/api/v1/namespaces/{}/configmaps?resourceVersionMatch=Exact",
                c.namespace
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await;
    let Err(kube::Error::Api(status)) = forbidden else {
        panic!("expected 422, got {forbidden:?}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .contains("resourceVersionMatch is forbidden unless resourceVersion is provided"),
        "{}",
        status.message
    );
    if let Some(sim) = &c.sim {
        sim.restart_keeping_state();
        assert_eq!(code(api.list(&exact).await), 410, "compacted");
    }
}

/// The body of a chunked HTTP/1.1 response, without the chunk framing.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap().trim(), 16).unwrap();
        raw = &raw[end + 2..];
        if size == 0 || raw.len() < size {
            break;
        }
        body.extend_from_slice(&raw[..size]);
        raw = &raw[(size + 2).min(raw.len())..];
    }
    body
}

// A watcher that does not read is disconnected once it falls its buffer behind, while writers
// go on without waiting for it (k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go: a
// watcher whose buffer stays full is terminated).
#[tokio::test]
async fn slow_watcher_is_disconnected_and_writers_never_block() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = cluster("slowwatch").await;
    let Some(sim) = &c.sim else {
        eprintln!(
            "skipping slow_watcher_is_disconnected_and_writers_never_block: needs kube-sim's watch buffer setting"
        );
        return;
    };
    sim.set_watch_buffer(10);
    let api: Api<ConfigMap> = c.api();
    let mut watch = tokio::net::TcpStream::connect(sim.addr).await.unwrap();
    let request = format!(
        "GET /api/v1/namespaces/{}/configmaps?watch=true HTTP/1.1\r\nHost: kube-sim\r\nConnection: close\r\n\r\n",
        c.namespace
    );
    watch.write_all(request.as_bytes()).await.unwrap();
    // The response head arrives once the watch is registered; after it, nothing is read.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(watch.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));

    // Far more than the buffer, the HTTP channel and the socket buffers together hold.
    let written = 200;
    let payload = "x".repeat(128 * 1024);
    let writes = async {
        for i in 0..written {
            api.create(
                &PostParams::default(),
                &configmap(&format!("big-{i}"), &payload),
            )
            .await
            .unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(300), writes)
        .await
        .expect("writers were held up by a watcher that does not read");

    // The server ended the watch: reading now reaches the end of the stream (a live watch
    // would stay open for its 30-minute timeout) with fewer events than were written.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), watch.read_to_end(&mut rest))
        .await
        .expect("the slow watcher was not disconnected")
        .unwrap();
    let body = dechunk(&rest);
    let received = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert!(received > 0, "the watcher got the events it kept up with");
    assert!(
        received < written,
        "the watcher was cut off ({received} of {written} events)"
    );
    // Watches opened afterwards work as usual.
    let latest = collect(&api, &WatchParams::default().timeout(2), "0", 1).await;
    assert_eq!(latest.len(), 1);
}

/// The Kubernetes project's own API groups are protected: a CRD there needs the
/// `api-approved.kubernetes.io` annotation, or it is Invalid.
#[tokio::test]
async fn crds_of_protected_groups_need_api_approval() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let c = cluster("crd-approval").await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let group = format!("{}.storage.k8s.io", c.namespace);
    let crd = |annotations: serde_json::Value| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": format!("gadgets.{group}"), "annotations": annotations},
            "spec": {
                "group": group,
                "scope": "Cluster",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            }
        }))
        .unwrap()
    };
    let refused = crds.create(&PostParams::default(), &crd(json!({}))).await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("a protected group's CRD without approval was accepted: {refused:?}");
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("api-approved.kubernetes.io"),
        "{}",
        status.message
    );
    let approved = json!({"api-approved.kubernetes.io": "https://github.com/kubernetes-csi/external-snapshotter/pull/419"});
    crds.create(&PostParams::default(), &crd(approved))
        .await
        .unwrap();
    crds.delete(&format!("gadgets.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}

/// The ServiceAccount admission plugin refuses a pod whose ServiceAccount does not exist (in a
/// new namespace, until kube-controller-manager made `default`), and admits it once it does.
#[tokio::test]
async fn pods_need_their_service_account() {
    let c = cluster("service-account").await;
    let pods: Api<Pod> = c.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"serviceAccountName": "runner", "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &pod).await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("a pod of a missing ServiceAccount was admitted: {refused:?}");
    };
    assert_eq!(status.code, 403);
    assert!(
        status
            .message
            .contains("serviceaccount \"runner\" not found"),
        "{}",
        status.message
    );
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = c.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "runner"}})).unwrap(),
        )
        .await
        .unwrap();
    let admitted = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(
        admitted.spec.unwrap().service_account_name.as_deref(),
        Some("runner")
    );
}

/// The node's taints with `key`, as `key:effect`.
fn taints_of(node: &Node, key: &str) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == key)
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Polls `check` on `node` until it holds; kube-controller-manager needs its node grace period
/// (40 s by default) plus a monitor period to notice a silent node, so this waits up to 3 min.
async fn until_node(nodes: &Api<Node>, node: &str, what: &str, check: impl Fn(&Node) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let current = nodes.get(node).await.unwrap();
        if check(&current) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?} {:?}",
            current.spec.map(|s| s.taints),
            current.status.map(|s| s.conditions)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn silent_nodes_are_tainted_as_their_zone_allows() {
    const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
    let c = cluster("zone-disruption").await;
    // On kube-sim, the role that plays kube-controller-manager's node lifecycle controller.
    let _node_lifecycle = c.sim.as_ref().map(|_| {
        kube_sim::roles::start_control_plane(
            c.client.clone(),
            &[Role::NodeLifecycle],
            Timing::fast(),
            CancellationToken::new(),
        )
    });
    let zone = c.namespace.clone();
    let names = [format!("{zone}-1"), format!("{zone}-2")];
    let nodes: Api<Node> = Api::all(c.client.clone());
    for name in &names {
        let node =
            json!({"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}});
        let created = nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(node).unwrap(),
            )
            .await
            .unwrap();
        // A Node's spec is a struct value: stored as {} when none was sent, so the JSON patch
        // that adds /spec/taints finds its parent.
        assert!(created.spec.is_some(), "a Node always has a spec");
    }
    // The test is the kubelet of both nodes: Ready heartbeats until a node is "stopped".
    let alive = std::sync::Arc::new(std::sync::Mutex::new(names.to_vec()));
    let heartbeats = tokio::spawn({
        let nodes = nodes.clone();
        let alive = alive.clone();
        async move {
            loop {
                let beating = alive.lock().unwrap().clone();
                for name in beating {
                    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    );
                    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                        "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
                    let _ = nodes
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    for name in &names {
        until_node(&nodes, name, "the node Ready", is_ready).await;
    }

    // One of the zone's two nodes goes silent: a normal zone, so NoSchedule and NoExecute.
    alive.lock().unwrap().retain(|n| *n != names[0]);
    until_node(&nodes, &names[0], "NoExecute on the silent node", |n| {
        taints_of(n, UNREACHABLE).contains(&format!("{UNREACHABLE}:NoExecute"))
    })
    .await;

    // The whole zone goes silent. With a Ready node elsewhere, the zone is evicted as usual;
    // with none, the controller assumes it is the one cut off and lifts every NoExecute taint.
    alive.lock().unwrap().clear();
    until_node(&nodes, &names[1], "NoSchedule on the second node", |n| {
        taints_of(n, UNREACHABLE).contains(&format!("{UNREACHABLE}:NoSchedule"))
    })
    .await;
    let ready_elsewhere = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|n| !names.contains(&n.name_any()) && is_ready(n));
    if ready_elsewhere {
        until_node(
            &nodes,
            &names[1],
            "NoExecute in a fully disrupted zone",
            |n| taints_of(n, UNREACHABLE).contains(&format!("{UNREACHABLE}:NoExecute")),
        )
        .await;
    } else {
        for name in &names {
            until_node(
                &nodes,
                name,
                "only NoSchedule once every zone is down",
                |n| taints_of(n, UNREACHABLE) == [format!("{UNREACHABLE}:NoSchedule")],
            )
            .await;
        }
    }
    heartbeats.abort();
    for name in &names {
        nodes.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

// storage.k8s.io/v1 VolumeAttributesClass (GA in 1.34): served cluster-wide, with its
// driverName and parameters at the top level (no spec), as csi-provisioner reads them.
#[tokio::test]
async fn volume_attributes_classes_are_cluster_scoped() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("vac").await;
    let discovered = c
        .client
        .list_api_group_resources("storage.k8s.io/v1")
        .await
        .unwrap();
    let Some(entry) = discovered
        .resources
        .iter()
        .find(|r| r.name == "volumeattributesclasses")
    else {
        assert!(c.sim.is_none(), "kube-sim serves VolumeAttributesClass");
        eprintln!(
            "skipping volume_attributes_classes_are_cluster_scoped: storage.k8s.io/v1 volumeattributesclasses not served"
        );
        return;
    };
    assert_eq!(
        (entry.kind.as_str(), entry.namespaced),
        ("VolumeAttributesClass", false)
    );
    assert!(
        entry.verbs.iter().any(|v| v == "watch"),
        "{:?}",
        entry.verbs
    );
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("storage.k8s.io", "v1", "VolumeAttributesClass"),
        "volumeattributesclasses",
    );
    let classes: Api<DynamicObject> = Api::all_with(c.client.clone(), &resource);
    let name = format!("{}-gold", c.namespace);
    let mut class = DynamicObject::new(&name, &resource);
    class.data = json!({"driverName": "csi.example.com", "parameters": {"iops": "3000"}});
    let created = classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace, None);
    let read = classes.get(&name).await.unwrap();
    assert_eq!(read.data["driverName"], "csi.example.com");
    assert_eq!(read.data["parameters"]["iops"], "3000");
    assert!(
        names(&classes, &ListParams::default())
            .await
            .contains(&name)
    );
    classes
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(classes.get(&name).await), 404);
}

// The decoding step of a write: a value its Go type cannot hold refuses a create or update
// with 400 ("cannot be handled as a <Kind>") and a patch with 422 on the field `patch`;
// MicroTime takes exactly six fractional digits, Secret data is base64, quantities parse
// (k8s.io/apiserver/pkg/endpoints/handlers/create.go, update.go, patch.go).
#[tokio::test]
async fn writes_their_types_cannot_hold_are_refused() {
    let c = cluster("decode").await;
    let ns = c.namespace.clone();
    let send = |method: http::Method, path: String, content_type: &str, body: serde_json::Value| {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        let client = c.client.clone();
        async move {
            match client.request_text(request).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) => Err(*status),
                Err(other) => panic!("not an API error: {other}"),
            }
        }
    };
    let refused = |result: Result<(), kube::core::Status>, code: u16, prefix: &str, field: &str| {
        let status = result.expect_err("the write is refused");
        assert_eq!(status.code, code, "{}", status.message);
        assert!(status.message.starts_with(prefix), "{}", status.message);
        assert!(
            status.message.to_lowercase().contains(field),
            "{field}: {}",
            status.message
        );
    };
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
    let lease = |renew: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"renewTime": renew}});
    let cannot_handle_lease = "Lease in version \"v1\" cannot be handled as a Lease: ";
    for renew in ["2026-12-02T04:00:00Z", "2026-12-02T04:00:00.123Z"] {
        let created = send(
            http::Method::POST,
            leases.clone(),
            "application/json",
            lease(renew),
        )
        .await;
        // Go's parse error; servers before 1.23 (jsoniter) put the field's path before it.
        let parse_error = format!("parsing time {renew:?}").to_lowercase();
        refused(created, 400, cannot_handle_lease, &parse_error);
    }
    let micro = "2026-12-02T04:00:00.123456Z";
    send(
        http::Method::POST,
        leases.clone(),
        "application/json",
        lease(micro),
    )
    .await
    .unwrap();
    let lease_path = format!("{leases}/l");
    let bad = json!({"spec": {"renewTime": "2026-12-02T04:00:01Z"}});
    for content_type in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let patched = send(
            http::Method::PATCH,
            lease_path.clone(),
            content_type,
            bad.clone(),
        )
        .await;
        refused(
            patched,
            422,
            " \"\" is invalid: patch: Invalid value: ",
            "parsing time \"2026-12-02t04:00:01z\"",
        );
    }
    let operations =
        json!([{"op": "replace", "path": "/spec/renewTime", "value": "2026-12-02T04:00:01Z"}]);
    let patched = send(
        http::Method::PATCH,
        lease_path.clone(),
        "application/json-patch+json",
        operations,
    )
    .await;
    refused(
        patched,
        422,
        " \"\" is invalid: patch: Invalid value: ",
        "parsing time \"2026-12-02t04:00:01z\"",
    );
    let mut wrong_type = lease(micro);
    wrong_type["spec"]["leaseDurationSeconds"] = json!("15");
    let updated = send(
        http::Method::PUT,
        lease_path.clone(),
        "application/json",
        wrong_type,
    )
    .await;
    refused(updated, 400, cannot_handle_lease, "leasedurationseconds");
    let stored: k8s_openapi::api::coordination::v1::Lease = Api::namespaced(c.client.clone(), &ns)
        .get("l")
        .await
        .unwrap();
    let renewed = stored.spec.unwrap().renew_time.unwrap();
    assert_eq!(serde_json::to_value(renewed).unwrap(), micro);

    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"key": "YWI"}});
    let created = send(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/secrets"),
        "application/json",
        secret,
    )
    .await;
    refused(
        created,
        400,
        "Secret in version \"v1\" cannot be handled as a Secret: ",
        "base64",
    );
    let labelled = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "labels": {"a": 1}}});
    let created = send(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/configmaps"),
        "application/json",
        labelled,
    )
    .await;
    refused(
        created,
        400,
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: ",
        "labels",
    );
    // Times are kept as Go encodes them: in UTC, a Time in whole seconds.
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "ConfigMap", "namespace": ns, "name": "m"},
        "reason": "Probe", "message": "times", "type": "Normal", "lastTimestamp": "2026-12-02T04:00:00.7+01:00"});
    send(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/events"),
        "application/json",
        event,
    )
    .await
    .unwrap();
    let offset = json!({"spec": {"acquireTime": "2026-12-02T04:00:00.000120-00:30"}});
    send(
        http::Method::PATCH,
        lease_path.clone(),
        "application/merge-patch+json",
        offset,
    )
    .await
    .unwrap();

    // Fields the type lacks have nowhere to go: dropped, on create and on a patch.
    let unknown = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "u", "bar": 1}, "foo": 2, "data": {"a": "b"}});
    send(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/configmaps"),
        "application/json",
        unknown,
    )
    .await
    .unwrap();
    let typo = json!({"spec": {"holderIdentity": "x", "holder": "y"}, "status": {"a": 1}});
    send(
        http::Method::PATCH,
        lease_path.clone(),
        "application/merge-patch+json",
        typo,
    )
    .await
    .unwrap();
    let read = |path: String| {
        let client = c.client.clone();
        async move {
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            let text = client.request_text(request).await.unwrap();
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        }
    };
    let stored = read(format!("/api/v1/namespaces/{ns}/configmaps/u")).await;
    assert!(
        stored.get("foo").is_none() && stored["metadata"].get("bar").is_none(),
        "{stored}"
    );
    assert_eq!(stored["data"], json!({"a": "b"}));
    let stored = read(lease_path.clone()).await;
    assert!(
        stored.get("status").is_none() && stored["spec"].get("holder").is_none(),
        "{stored}"
    );
    assert_eq!(stored["spec"]["holderIdentity"], "x");
    assert_eq!(stored["spec"]["acquireTime"], "2026-12-02T04:30:00.000120Z");
    let stored = read(format!("/api/v1/namespaces/{ns}/events/e")).await;
    assert_eq!(stored["lastTimestamp"], "2026-12-02T03:00:00Z");

    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "abc"}}}});
    let created = send(
        http::Method::POST,
        format!("/api/v1/namespaces/{ns}/persistentvolumeclaims"),
        "application/json",
        claim,
    )
    .await;
    refused(
        created,
        400,
        "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: ",
        "quantities must match the regular expression",
    );
}

// TaintNodesByCondition (plugin/pkg/admission/nodetaint): a new Node is created with the
// not-ready NoSchedule taint after its own, once; the node lifecycle controller lifts it.
#[tokio::test]
async fn a_new_node_is_not_ready_until_the_controller_says_so() {
    let c = cluster("nodetaint").await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let keys = |node: &Node| -> Vec<(String, String)> {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.key, t.effect))
            .collect()
    };
    let not_ready = (
        "node.kubernetes.io/not-ready".to_string(),
        "NoSchedule".to_string(),
    );
    let own = (
        "example.com/dedicated".to_string(),
        "NoSchedule".to_string(),
    );
    let first = format!("{}-a", c.namespace);
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": first}, "spec": {"taints": [{"key": own.0, "effect": own.1}]}}),
    )
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(keys(&created), [own.clone(), not_ready.clone()]);
    let second = format!("{}-b", c.namespace);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": second}, "spec": {"taints": [{"key": not_ready.0, "effect": not_ready.1}]}})).unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(keys(&created), [not_ready]);
    for name in [first, second] {
        nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    }
}

// A custom resource of a CRD that serves two versions with conversion None reads through
// either: the API server rewrites `apiVersion` to the version asked for, and each version's
// schema prunes the fields it does not declare from what it serves (the stored object keeps
// them: read back through its own version, they are there).
#[tokio::test]
async fn a_custom_resource_reads_through_every_served_version() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = cluster("crd-versions").await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let group = format!("{}.example.com", c.namespace);
    let version = |name: &str, field: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    field: {"type": "string"}, "both": {"type": "string"}}}}}}})
    };
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [version("v1", "a", true), version("v2", "b", false)],
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let api = |version: &str| -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&group, version, "Widget"),
            "widgets",
        );
        Api::namespaced_with(c.client.clone(), &c.namespace, &resource)
    };
    // A new CRD's versions are served a moment after it is created.
    for version in ["v1", "v2"] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Err(error) = api(version).list(&Default::default()).await {
            assert!(
                std::time::Instant::now() < deadline,
                "widgets not served at {version}: {error}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w"}, "spec": {"a": "1", "both": "x"}}))
    .unwrap();
    api("v1")
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let through_v2 = serde_json::to_value(api("v2").get("w").await.unwrap()).unwrap();
    assert_eq!(through_v2["apiVersion"], format!("{group}/v2"));
    assert_eq!(
        through_v2["spec"],
        json!({"both": "x"}),
        "v2 prunes v1's field"
    );
    let listed = serde_json::to_value(api("v2").list(&Default::default()).await.unwrap()).unwrap();
    assert_eq!(listed["items"][0]["apiVersion"], format!("{group}/v2"));
    assert_eq!(listed["items"][0]["spec"], json!({"both": "x"}));
    let through_v1 = serde_json::to_value(api("v1").get("w").await.unwrap()).unwrap();
    assert_eq!(through_v1["apiVersion"], format!("{group}/v1"));
    assert_eq!(
        through_v1["spec"],
        json!({"a": "1", "both": "x"}),
        "stored whole"
    );
    crds.delete(&format!("widgets.{group}"), &Default::default())
        .await
        .unwrap();
}

/// The issuer a token requested without audiences is for, and the audience a review without
/// audiences asks for: the real control planes' `--api-audiences`, kube-sim's own.
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

impl Cluster {
    /// A new ServiceAccount of the test's namespace and its uid.
    async fn service_account(&self, name: &str) -> String {
        let accounts: Api<ServiceAccount> = self.api();
        let created = accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        created.uid().unwrap()
    }

    async fn token(&self, account: &str, spec: serde_json::Value) -> kube::Result<TokenRequest> {
        let accounts: Api<ServiceAccount> = self.api();
        accounts
            .create_token_request(
                account,
                &PostParams::default(),
                &serde_json::from_value(json!({"spec": spec})).unwrap(),
            )
            .await
    }

    async fn review_token(&self, token: &str, audiences: &[&str]) -> TokenReviewStatus {
        let review = json!({"spec": {"token": token, "audiences": audiences}});
        answer::<TokenReview>(&self.client, review)
            .await
            .status
            .unwrap()
    }

    /// Whether the server lists `plural` with the verb `create` in `group_version` (and
    /// `kind`), as kube-apiserver lists its review APIs and serviceaccounts/token.
    async fn serves_create(&self, group_version: &str, plural: &str, kind: &str) -> bool {
        let resources = if group_version == "v1" {
            self.client.list_core_api_resources("v1").await
        } else {
            self.client.list_api_group_resources(group_version).await
        };
        let Ok(resources) = resources else {
            return false;
        };
        resources
            .resources
            .iter()
            .any(|r| r.name == plural && r.kind == kind && r.verbs.iter().any(|v| v == "create"))
    }
}

fn expiration(request: &TokenRequest) -> i64 {
    request
        .status
        .as_ref()
        .unwrap()
        .expiration_timestamp
        .0
        .as_second()
}

// TokenRequest (`serviceaccounts/<name>/token`): a token of an existing ServiceAccount, for the
// API audience and an hour unless asked otherwise; a missing ServiceAccount is 404, a lifetime
// under 10 minutes 422 (pkg/registry/core/serviceaccount/storage/token.go).
#[tokio::test]
async fn token_requests_issue_tokens_of_service_accounts() {
    let c = cluster("token-request").await;
    if !c
        .serves_create("v1", "serviceaccounts/token", "TokenRequest")
        .await
    {
        assert!(c.sim.is_none(), "kube-sim serves serviceaccounts/token");
        skip(
            "token_requests_issue_tokens_of_service_accounts",
            "serviceaccounts/token not served",
        );
        return;
    }
    c.service_account("backup").await;
    let before = k8s_openapi::jiff::Timestamp::now().as_second();
    let default = c.token("backup", json!({})).await.unwrap();
    let after = k8s_openapi::jiff::Timestamp::now().as_second();
    let spec = &default.spec;
    assert_eq!(spec.audiences, [API_AUDIENCE]);
    assert_eq!(spec.expiration_seconds, Some(3600));
    assert!(!default.status.as_ref().unwrap().token.is_empty());
    // The expiry is the request's time plus the lifetime (whole seconds on the server).
    assert!((before + 3600..=after + 3601).contains(&expiration(&default)));
    let short = c
        .token(
            "backup",
            json!({"audiences": ["cbt.example.com"], "expirationSeconds": 600}),
        )
        .await
        .unwrap();
    assert_eq!(short.spec.audiences, ["cbt.example.com"]);
    assert!(
        (before + 600..=k8s_openapi::jiff::Timestamp::now().as_second() + 601)
            .contains(&expiration(&short))
    );
    assert_ne!(
        short.status.as_ref().unwrap().token,
        default.status.as_ref().unwrap().token
    );
    let (code, reason, message, _) = refusal(c.token("missing", json!({})).await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", r#"serviceaccounts "missing" not found"#)
    );
    let (code, reason, message, causes) =
        refusal(c.token("backup", json!({"expirationSeconds": 599})).await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            422,
            "Invalid",
            r#"TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"#
        )
    );
    assert_eq!(causes.len(), 1);
}

// TokenReview: a token authenticates as its ServiceAccount when the review asks for one of
// its audiences (status.audiences: those both have); another audience, a string that is no
// token, and a token whose ServiceAccount is gone do not, each with the real server's
// status.error (pkg/registry/authentication/tokenreview/storage.go, pkg/serviceaccount).
#[tokio::test]
async fn token_reviews_authenticate_service_account_tokens() {
    let c = cluster("token-review").await;
    let served = c
        .serves_create("authentication.k8s.io/v1", "tokenreviews", "TokenReview")
        .await
        && c.serves_create("v1", "serviceaccounts/token", "TokenRequest")
            .await;
    if !served {
        assert!(c.sim.is_none(), "kube-sim serves tokenreviews");
        skip(
            "token_reviews_authenticate_service_account_tokens",
            "authentication.k8s.io/v1 tokenreviews or serviceaccounts/token not served",
        );
        return;
    }
    let uid = c.service_account("backup").await;
    let token = |request: TokenRequest| request.status.unwrap().token;
    let issued = token(
        c.token("backup", json!({"audiences": ["aud-a", "aud-b"]}))
            .await
            .unwrap(),
    );

    let good = c.review_token(&issued, &["aud-b", "aud-c"]).await;
    assert_eq!(good.authenticated, Some(true), "{good:?}");
    assert_eq!(good.audiences.as_deref(), Some(&["aud-b".to_string()][..]));
    let user = good.user.unwrap();
    let namespace = &c.namespace;
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{namespace}:backup").as_str())
    );
    assert_eq!(user.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(
        user.groups.unwrap(),
        [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_string(),
        ]
    );

    let wrong = c.review_token(&issued, &["aud-z"]).await;
    assert_ne!(wrong.authenticated, Some(true));
    assert_eq!(
        wrong.error.as_deref(),
        Some(
            r#"[invalid bearer token, token audiences ["aud-a" "aud-b"] is invalid for the target audiences ["aud-z"]]"#
        )
    );
    // Without audiences, the review asks for the API audience, which this token is not for.
    let unasked = c.review_token(&issued, &[]).await;
    assert_eq!(
        unasked.error,
        Some(format!(
            r#"[invalid bearer token, token audiences ["aud-a" "aud-b"] is invalid for the target audiences ["{API_AUDIENCE}"]]"#
        ))
    );

    let garbage = c.review_token("not-a-token", &["aud-a"]).await;
    assert_ne!(garbage.authenticated, Some(true));
    assert_eq!(garbage.error.as_deref(), Some("invalid bearer token"));

    // Reviewed for the first time once its ServiceAccount is gone (a real server caches a
    // review's answer for a few seconds).
    let orphan = token(
        c.token("backup", json!({"audiences": ["aud-a"]}))
            .await
            .unwrap(),
    );
    let accounts: Api<ServiceAccount> = c.api();
    accounts
        .delete("backup", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = c.review_token(&orphan, &["aud-a"]).await;
    assert_ne!(deleted.authenticated, Some(true));
    assert_eq!(
        deleted.error.as_deref(),
        Some(r#"[invalid bearer token, serviceaccounts "backup" not found]"#)
    );
}

/// RBAC objects a test makes, the cluster-scoped ones deleted by [`RbacObjects::delete`].
struct RbacObjects {
    client: Client,
    cluster_roles: Vec<String>,
    cluster_role_bindings: Vec<String>,
}

impl RbacObjects {
    async fn create<K>(&mut self, api: &Api<K>, object: serde_json::Value)
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let object: K = serde_json::from_value(object).unwrap();
        let name = object.meta().name.clone().unwrap();
        match K::kind(&Default::default()).as_ref() {
            "ClusterRole" => self.cluster_roles.push(name),
            "ClusterRoleBinding" => self.cluster_role_bindings.push(name),
            _ => {}
        }
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    async fn delete(self) {
        let roles: Api<rbac_v1::ClusterRole> = Api::all(self.client.clone());
        for name in &self.cluster_roles {
            roles.delete(name, &DeleteParams::default()).await.unwrap();
        }
        let bindings: Api<rbac_v1::ClusterRoleBinding> = Api::all(self.client.clone());
        for name in &self.cluster_role_bindings {
            bindings
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
}

/// A SubjectAccessReview's answer for `user` (and `groups`) asking `verb` on
/// `resource[/subresource]` of `group` in `namespace`, optionally by name.
async fn access(
    client: &Client,
    user: &str,
    groups: &[&str],
    attributes: serde_json::Value,
) -> SubjectAccessReviewStatus {
    let review =
        json!({"spec": {"user": user, "groups": groups, "resourceAttributes": attributes}});
    answer::<SubjectAccessReview>(client, review)
        .await
        .status
        .unwrap()
}

/// The server's answer to a review (a cluster-scoped create-only kind).
async fn answer<K>(client: &Client, review: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let reviews: Api<K> = Api::all(client.clone());
    reviews
        .create(
            &PostParams::default(),
            &serde_json::from_value(review).unwrap(),
        )
        .await
        .unwrap()
}

// SubjectAccessReview under RBAC: allowed by a RoleBinding (its ServiceAccount subject of the
// binding's namespace) or a ClusterRoleBinding, with the reason naming binding, role and
// subject; a RoleBinding to a ClusterRole with a subresource and resourceNames; refused
// otherwise, with no reason; system:masters always (plugin/pkg/auth/authorizer/rbac/rbac.go).
#[tokio::test]
async fn subject_access_reviews_follow_rbac() {
    let c = cluster("access-review").await;
    let served = c
        .serves_create(
            "authorization.k8s.io/v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
        )
        .await;
    if !served {
        assert!(c.sim.is_none(), "kube-sim serves subjectaccessreviews");
        skip(
            "subject_access_reviews_follow_rbac",
            "authorization.k8s.io/v1 subjectaccessreviews not served",
        );
        return;
    }
    let ns = c.namespace.clone();
    let rbac = "rbac.authorization.k8s.io";
    let mut objects = RbacObjects {
        client: c.client.clone(),
        cluster_roles: Vec::new(),
        cluster_role_bindings: Vec::new(),
    };
    let roles: Api<rbac_v1::Role> = c.api();
    let role_bindings: Api<rbac_v1::RoleBinding> = c.api();
    let cluster_roles: Api<rbac_v1::ClusterRole> = Api::all(c.client.clone());
    let cluster_role_bindings: Api<rbac_v1::ClusterRoleBinding> = Api::all(c.client.clone());
    objects
        .create(
            &roles,
            json!({"metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
        )
        .await;
    objects
        .create(
            &role_bindings,
            json!({"metadata": {"name": "backup-reads-pods"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "backup"}]}),
        )
        .await;
    let snapshots = format!("{ns}-snapshots");
    objects.create(&cluster_roles, json!({"metadata": {"name": snapshots},
        "rules": [{"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": ["get"]}]})).await;
    let alice = format!("{ns}-alice");
    objects
        .create(
            &cluster_role_bindings,
            json!({"metadata": {"name": snapshots},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": snapshots},
        "subjects": [{"kind": "User", "apiGroup": rbac, "name": alice}]}),
        )
        .await;
    let logs = format!("{ns}-logs-of-p1");
    objects.create(&cluster_roles, json!({"metadata": {"name": logs},
        "rules": [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"], "resourceNames": ["p1"]}]})).await;
    let readers = format!("{ns}-readers");
    objects
        .create(
            &role_bindings,
            json!({"metadata": {"name": "log-readers"},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": logs},
        "subjects": [{"kind": "Group", "apiGroup": rbac, "name": readers}]}),
        )
        .await;

    let backup = format!("system:serviceaccount:{ns}:backup");
    let pods = |verb: &str, namespace: &str| json!({"namespace": namespace, "verb": verb, "resource": "pods"});
    // A real server's RBAC reads its bindings from a cache that follows the writes closely.
    let allowed = eventually("the RoleBinding in force", || async {
        let status = access(&c.client, &backup, &[], pods("get", &ns)).await;
        status.allowed.then_some(status)
    })
    .await;
    assert_eq!(
        allowed.reason,
        Some(format!(
            r#"RBAC: allowed by RoleBinding "backup-reads-pods/{ns}" of Role "pod-reader" to ServiceAccount "backup/{ns}""#
        ))
    );
    let other_namespace = access(&c.client, &backup, &[], pods("get", "default")).await;
    assert!(!other_namespace.allowed);
    assert_eq!(other_namespace.reason.unwrap_or_default(), "");
    assert!(
        !access(&c.client, &backup, &[], pods("delete", &ns))
            .await
            .allowed
    );

    let snapshot = |namespace: &str, verb: &str| {
        json!({"namespace": namespace, "verb": verb,
        "group": "snapshot.storage.k8s.io", "resource": "volumesnapshots", "name": "s"})
    };
    let allowed = eventually("the ClusterRoleBinding in force", || async {
        let status = access(&c.client, &alice, &[], snapshot("elsewhere", "get")).await;
        status.allowed.then_some(status)
    })
    .await;
    assert_eq!(
        allowed.reason,
        Some(format!(
            r#"RBAC: allowed by ClusterRoleBinding "{snapshots}" of ClusterRole "{snapshots}" to User "{alice}""#
        ))
    );
    let denied = access(&c.client, &alice, &[], snapshot("elsewhere", "delete")).await;
    assert!(!denied.allowed);
    assert_ne!(
        denied.denied,
        Some(true),
        "RBAC has no opinion, it never denies"
    );
    assert_eq!(denied.reason.unwrap_or_default(), "");

    let log = |name: &str| {
        json!({"namespace": ns, "verb": "get", "resource": "pods",
        "subresource": "log", "name": name})
    };
    let allowed = eventually("the group's RoleBinding in force", || async {
        let status = access(&c.client, "bob", &[&readers], log("p1")).await;
        status.allowed.then_some(status)
    })
    .await;
    assert_eq!(
        allowed.reason,
        Some(format!(
            r#"RBAC: allowed by RoleBinding "log-readers/{ns}" of ClusterRole "{logs}" to Group "{readers}""#
        ))
    );
    assert!(
        !access(&c.client, "bob", &[&readers], log("p2"))
            .await
            .allowed
    );
    assert!(!access(&c.client, "bob", &[&readers], log("")).await.allowed);
    let p1 = json!({"namespace": ns, "verb": "get", "resource": "pods", "name": "p1"});
    assert!(!access(&c.client, "bob", &[&readers], p1).await.allowed);

    let masters = access(&c.client, "root", &["system:masters"], pods("delete", &ns)).await;
    assert!(masters.allowed);
    assert_eq!(masters.reason.unwrap_or_default(), "");

    // LocalSubjectAccessReview: the same, for its own namespace only.
    let local: Api<LocalSubjectAccessReview> = c.api();
    let review = |namespace: &str| {
        serde_json::from_value::<LocalSubjectAccessReview>(json!({
            "metadata": {"namespace": ns},
            "spec": {"user": backup, "resourceAttributes": pods("get", namespace)}}))
        .unwrap()
    };
    let answered = local
        .create(&PostParams::default(), &review(&ns))
        .await
        .unwrap();
    assert!(answered.status.unwrap().allowed);
    let (code, _, message, _) = refusal(
        local
            .create(&PostParams::default(), &review("default"))
            .await,
    );
    assert_eq!(
        (code, message.as_str()),
        (
            422,
            r#".authorization.k8s.io "" is invalid: spec.resourceAttributes.namespace: Invalid value: "default": must match metadata.namespace"#
        )
    );
    objects.delete().await;
}

// A review without attributes or subject is refused with every reason at once.
#[tokio::test]
async fn subject_access_reviews_need_attributes_and_a_subject() {
    let c = cluster("access-review-invalid").await;
    let reviews: Api<SubjectAccessReview> = Api::all(c.client.clone());
    let empty = serde_json::from_value(json!({"spec": {}})).unwrap();
    let (code, reason, message, causes) =
        refusal(reviews.create(&PostParams::default(), &empty).await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            422,
            "Invalid",
            r#".authorization.k8s.io "" is invalid: [spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: "": at least one of user or group must be specified]"#
        )
    );
    let fields: Vec<&str> = causes.iter().map(|(f, _, _)| f.as_str()).collect();
    assert_eq!(fields, ["spec.resourceAttributes", "spec.user"]);
}

// The RBAC objects: a binding's roleRef and User subjects default to the RBAC group, its
// roleRef never changes, and a rule needs verbs and API groups and resources (or non-resource
// URLs, never in a Role) (pkg/apis/rbac/v1/defaults.go, pkg/apis/rbac/validation).
#[tokio::test]
async fn rbac_objects_are_defaulted_and_validated() {
    let c = cluster("rbac-objects").await;
    let roles: Api<rbac_v1::Role> = c.api();
    let bindings: Api<rbac_v1::RoleBinding> = c.api();
    let binding = serde_json::from_value(json!({"metadata": {"name": "readers"},
        "roleRef": {"kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "backup"}]}))
    .unwrap();
    let created = bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(created.role_ref.api_group, "rbac.authorization.k8s.io");
    let subjects = created.subjects.unwrap();
    assert_eq!(
        subjects[0].api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(subjects[1].api_group.as_deref().unwrap_or_default(), "");
    let changed = bindings
        .patch(
            "readers",
            &PatchParams::default(),
            &Patch::Merge(json!({"roleRef": {"name": "other"}})),
        )
        .await;
    let (code, reason, message, _) = refusal(changed);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            422,
            "Invalid",
            r#"RoleBinding.rbac.authorization.k8s.io "readers" is invalid: roleRef: Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"Role", Name:"other"}: cannot change roleRef"#
        )
    );
    let role = serde_json::from_value(json!({"metadata": {"name": "bad"}, "rules": [
        {"nonResourceURLs": ["/healthz"], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""]}]}))
    .unwrap();
    let (code, _, message, causes) = refusal(roles.create(&PostParams::default(), &role).await);
    assert_eq!(
        (code, message.as_str()),
        (
            422,
            r#"Role.rbac.authorization.k8s.io "bad" is invalid: [rules[0].nonResourceURLs: Invalid value: []string{"/healthz"}: namespaced rules cannot apply to non-resource URLs, rules[0].nonResourceURLs: Invalid value: []string{"/healthz"}: rules cannot apply to both regular resources and non-resource URLs, rules[1].verbs: Required value: verbs must contain at least one value, rules[1].resources: Required value: resource rules must supply at least one resource]"#
        )
    );
    assert_eq!(causes.len(), 4);
}

// A token bound to a Pod or a Secret: the Pod runs as the ServiceAccount, a pod-bound token's
// user carries the pod's name and uid, and either token stops authenticating once its object
// is gone (pkg/serviceaccount/claims.go; v1.19 words it "Token has been invalidated").
#[tokio::test]
async fn bound_tokens_live_as_long_as_their_object() {
    use k8s_openapi::api::core::v1::Secret;
    let c = cluster("bound-token").await;
    if !c
        .serves_create("v1", "serviceaccounts/token", "TokenRequest")
        .await
    {
        assert!(c.sim.is_none(), "kube-sim serves serviceaccounts/token");
        skip(
            "bound_tokens_live_as_long_as_their_object",
            "serviceaccounts/token not served",
        );
        return;
    }
    c.service_account("backup").await;
    let pods: Api<Pod> = c.api();
    let runner: Pod = serde_json::from_value(json!({"metadata": {"name": "runner"}, "spec": {
        "serviceAccountName": "backup", "containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    // Before 1.24 a pod waits for its ServiceAccount's token Secret (a 500 meanwhile).
    let pod = eventually("the pod admitted", || async {
        pods.create(&PostParams::default(), &runner).await.ok()
    })
    .await;
    let secrets: Api<Secret> = c.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "anchor"}})).unwrap(),
        )
        .await
        .unwrap();
    let bound = |kind: &str, name: &str| {
        json!({"audiences": ["aud-a", "aud-b"],
            "boundObjectRef": {"apiVersion": "v1", "kind": kind, "name": name}})
    };
    let token = |request: TokenRequest| request.status.unwrap().token;
    let of_pod = token(c.token("backup", bound("Pod", "runner")).await.unwrap());
    let of_secret = token(c.token("backup", bound("Secret", "anchor")).await.unwrap());

    let reviewed = c.review_token(&of_pod, &["aud-a"]).await;
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    let extra = reviewed.user.unwrap().extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["runner".to_string()])
    );
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![pod.uid().unwrap()])
    );
    let reviewed = c.review_token(&of_secret, &["aud-a"]).await;
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    assert!(reviewed.user.unwrap().extra.unwrap_or_default().is_empty());

    let refused = c
        .token(
            "default",
            json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "runner"}}),
        )
        .await;
    let (code, _, message, _) = refusal(refused);
    assert_eq!(
        (code, message.as_str()),
        (
            400,
            r#"cannot bind token for serviceaccount "default" to pod running with different serviceaccount name."#
        )
    );
    let unbindable = c
        .token(
            "backup",
            json!({"boundObjectRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x"}}),
        )
        .await;
    let (code, _, message, _) = refusal(unbindable);
    assert_eq!(
        (code, message.as_str()),
        (
            400,
            "cannot bind token to object of type /v1, Kind=ConfigMap"
        )
    );

    pods.delete("runner", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    secrets
        .delete("anchor", &DeleteParams::default())
        .await
        .unwrap();
    // Reviewed for other audiences than before: a real server caches answers for a while.
    for token in [&of_pod, &of_secret] {
        let gone = c.review_token(token, &["aud-b"]).await;
        assert_ne!(gone.authenticated, Some(true));
        let error = gone.error.unwrap_or_default();
        assert!(
            error.starts_with("[invalid bearer token, ")
                && error.ends_with("has been invalidated]"),
            "{error}"
        );
    }
}

// An aggregated ClusterRole: kube-controller-manager's aggregation controller (kube-sim's
// `clusterrole-aggregation` role) copies in the rules of the ClusterRoles its selector matches,
// and RBAC grants them through it (pkg/controller/clusterroleaggregation).
#[tokio::test]
async fn aggregated_cluster_roles_grant_their_parts_rules() {
    let c = cluster("aggregation").await;
    let _aggregation = c.sim.as_ref().map(|_| {
        kube_sim::roles::start_control_plane(
            c.client.clone(),
            &[Role::ClusterRoleAggregation],
            Timing::fast(),
            CancellationToken::new(),
        )
    });
    let ns = c.namespace.clone();
    let label = format!("example.com/aggregate-to-{ns}");
    let mut objects = RbacObjects {
        client: c.client.clone(),
        cluster_roles: Vec::new(),
        cluster_role_bindings: Vec::new(),
    };
    let cluster_roles: Api<rbac_v1::ClusterRole> = Api::all(c.client.clone());
    let part = format!("{ns}-part");
    let snapshots = json!({"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": ["get"]});
    objects
        .create(
            &cluster_roles,
            json!({"metadata": {"name": part, "labels": {&label: "true"}}, "rules": [snapshots]}),
        )
        .await;
    let aggregate = format!("{ns}-aggregate");
    objects
        .create(
            &cluster_roles,
            json!({"metadata": {"name": aggregate},
                "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {&label: "true"}}]}}),
        )
        .await;
    let bindings: Api<rbac_v1::RoleBinding> = c.api();
    objects
        .create(
            &bindings,
            json!({"metadata": {"name": "aggregated"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": aggregate},
                "subjects": [{"kind": "User", "name": "carol"}]}),
        )
        .await;
    let rules = eventually("the aggregated rules", || async {
        let role = cluster_roles.get(&aggregate).await.unwrap();
        role.rules.filter(|r| !r.is_empty())
    })
    .await;
    assert_eq!(serde_json::to_value(&rules).unwrap(), json!([snapshots]));
    let attributes = json!({"namespace": ns, "verb": "get", "group": "snapshot.storage.k8s.io",
        "resource": "volumesnapshots"});
    let allowed = eventually("the aggregated role in force", || async {
        let status = access(&c.client, "carol", &[], attributes.clone()).await;
        status.allowed.then_some(status)
    })
    .await;
    assert_eq!(
        allowed.reason,
        Some(format!(
            r#"RBAC: allowed by RoleBinding "aggregated/{ns}" of ClusterRole "{aggregate}" to User "carol""#
        ))
    );
    objects.delete().await;
}
