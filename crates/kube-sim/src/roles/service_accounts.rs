//! The controllers of kube-controller-manager that give a namespace what its pods need to reach
//! the API server:
//! - the service account controller (pkg/controller/serviceaccount/serviceaccounts_controller.go):
//!   every namespace that is not being deleted gets a `default` ServiceAccount. Until it exists
//!   the ServiceAccount admission plugin refuses the namespace's pods, so a client that creates
//!   a namespace and at once a pod fails on kube-sim exactly as on a real cluster. (kube-sim
//!   serves Kubernetes 1.33, which mounts projected tokens: no token Secret is made or needed,
//!   as since 1.24.)
//! - the root CA publisher (pkg/controller/certificates/rootcacertpublisher, since 1.20): every
//!   such namespace holds the ConfigMap `kube-root-ca.crt`, put back when it is deleted. Its
//!   `ca.crt` is the CA data of the controller's own connection to the API server: kube-sim
//!   serves plain HTTP, so it is empty, as kube-controller-manager publishes it over a
//!   connection without one. A ConfigMap that exists is left as it is (on a real cluster, whose
//!   controller manager publishes the real bundle, the role must not replace it).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::{Informers, RoleError, Timing, is_benign, run_with_caches};

/// The ServiceAccount every namespace gets.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// The ConfigMap with the cluster's CA bundle every namespace gets.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
const ROOT_CA_KEY: &str = "ca.crt";
const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

struct Caches {
    namespaces: Store<Namespace>,
    accounts: Store<ServiceAccount>,
    config_maps: Store<ConfigMap>,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let caches = |informers: &mut Informers| {
        Arc::new(Caches {
            namespaces: informers.all(),
            accounts: informers.all(),
            config_maps: informers.all(),
        })
    };
    run_with_caches(
        "serviceaccounts",
        &client,
        &timing,
        shutdown,
        caches,
        |caches| pass(client.clone(), caches),
    )
    .await
}

/// The root CA ConfigMap as the publisher writes it.
pub fn root_ca_config_map() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": ROOT_CA_CONFIG_MAP,
            "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION},
        },
        "data": {ROOT_CA_KEY: ""},
    })
}

async fn pass(client: Client, caches: Arc<Caches>) -> Result<(), RoleError> {
    let accounts = caches.accounts.state();
    let config_maps = caches.config_maps.state();
    let published: ConfigMap = serde_json::from_value(root_ca_config_map())
        .map_err(|e| RoleError::Invalid(e.to_string()))?;
    for namespace in caches.namespaces.state() {
        if namespace.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = namespace.name_any();
        let in_namespace =
            |object_namespace: Option<String>| object_namespace.as_deref() == Some(&name);
        let has_default = accounts.iter().any(|account| {
            in_namespace(account.namespace()) && account.name_any() == DEFAULT_SERVICE_ACCOUNT
        });
        if !has_default {
            let account = ServiceAccount {
                metadata: kube::api::ObjectMeta {
                    name: Some(DEFAULT_SERVICE_ACCOUNT.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
            tolerate(api.create(&PostParams::default(), &account).await)?;
        }
        let published_here = config_maps.iter().any(|config_map| {
            in_namespace(config_map.namespace()) && config_map.name_any() == ROOT_CA_CONFIG_MAP
        });
        if !published_here {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
            tolerate(api.create(&PostParams::default(), &published).await)?;
        }
    }
    Ok(())
}

/// Created or changed meanwhile, or the namespace is going: the next pass sees it.
fn tolerate<T>(result: kube::Result<T>) -> Result<(), RoleError> {
    match result {
        Ok(_) => Ok(()),
        Err(error) if is_benign(&error) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}
