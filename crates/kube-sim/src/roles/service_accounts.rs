//! The service account controller of kube-controller-manager
//! (pkg/controller/serviceaccount/serviceaccounts_controller.go): every namespace that is not
//! being deleted gets a `default` ServiceAccount. Until it exists the ServiceAccount admission
//! plugin refuses the namespace's pods, so a client that creates a namespace and at once a pod
//! fails on kube-sim exactly as on a real cluster. (kube-sim serves Kubernetes 1.33, which mounts
//! projected tokens: no token Secret is made or needed, as since 1.24.)

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::{Informers, RoleError, Timing, is_benign, reconcile_loop};

/// The ServiceAccount every namespace gets.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

struct Caches {
    namespaces: Store<Namespace>,
    accounts: Store<ServiceAccount>,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let mut informers = Informers::new(&client, &shutdown);
    let caches = Arc::new(Caches {
        namespaces: informers.all(),
        accounts: informers.all(),
    });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    reconcile_loop("serviceaccounts", wake, timing.resync, shutdown, || {
        pass(client.clone(), caches.clone())
    })
    .await;
    Ok(())
}

async fn pass(client: Client, caches: Arc<Caches>) -> Result<(), RoleError> {
    let accounts = caches.accounts.state();
    for namespace in caches.namespaces.state() {
        let name = namespace.name_any();
        let has_default = accounts.iter().any(|account| {
            account.namespace().as_deref() == Some(name.as_str())
                && account.name_any() == DEFAULT_SERVICE_ACCOUNT
        });
        if has_default || namespace.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let account: ServiceAccount = serde_json::from_value(
            serde_json::json!({"metadata": {"name": DEFAULT_SERVICE_ACCOUNT}}),
        )
        .map_err(|e| RoleError::Invalid(e.to_string()))?;
        match api.create(&PostParams::default(), &account).await {
            Ok(_) => tracing::debug!(namespace = %name, "created the default ServiceAccount"),
            // Created meanwhile, or the namespace is going: the next pass sees it.
            Err(error) if is_benign(&error) => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
