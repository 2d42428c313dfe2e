//! The cluster parts that are not ours — PV controller, scheduler, attach/detach controller,
//! node lifecycle controller, service account and ClusterRole aggregation controllers, and a
//! kubelet per simulated node — each a task with a `kube::Client`, individually switchable.
//! They only use the public API, so they run against kube-sim and against a real
//! kube-apiserver alike (where only the kubelet role is needed).
//!
//! Every role follows one pattern: reflectors keep local caches of the objects it reads, any
//! change (or a periodic resync) wakes one reconcile pass over the whole cache, and the pass
//! writes with patches. Passes are idempotent, so a stale cache only costs a repeated, harmless
//! write (AlreadyExists/NotFound are tolerated where the real controllers tolerate them).

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

pub(crate) use csi_sidecar::informers::Informers;
pub(crate) use csi_sidecar::lock;
use tokio_util::sync::CancellationToken;

pub mod attach_detach;
pub mod cluster_role_aggregation;
pub mod kubelet;
pub mod node_lifecycle;
pub mod pv_binder;
pub mod scheduler;
pub mod scheduling;
pub mod service_accounts;

/// Field manager of every role's writes.
pub const FIELD_MANAGER: &str = "kube-sim";

#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
}

/// One switchable cluster part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Kubelet,
    PvBinder,
    Scheduler,
    AttachDetach,
    NodeLifecycle,
    ServiceAccounts,
    ClusterRoleAggregation,
}

impl Role {
    pub const ALL: [Role; 7] = [
        Role::Kubelet,
        Role::PvBinder,
        Role::Scheduler,
        Role::AttachDetach,
        Role::NodeLifecycle,
        Role::ServiceAccounts,
        Role::ClusterRoleAggregation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Kubelet => "kubelet",
            Role::PvBinder => "pv-binder",
            Role::Scheduler => "scheduler",
            Role::AttachDetach => "attach-detach",
            Role::NodeLifecycle => "node-lifecycle",
            Role::ServiceAccounts => "serviceaccounts",
            Role::ClusterRoleAggregation => "clusterrole-aggregation",
        }
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Role::ALL.iter().map(|r| r.name()).collect();
                format!("unknown role {s:?}; known roles: {}", known.join(", "))
            })
    }
}

/// Timings of the simulated cluster. The defaults are kube-controller-manager's and kubelet's;
/// tests shorten them.
#[derive(Clone, Debug)]
pub struct Timing {
    /// How often a kubelet renews its node Lease (kubelet: 10 s, a quarter of the lease).
    pub heartbeat_interval: Duration,
    /// How long a node may go without a heartbeat before it is Unknown and tainted
    /// unreachable (`--node-monitor-grace-period`, 40 s in kube-controller-manager).
    pub node_grace_period: Duration,
    /// Periodic reconcile pass of every role, on top of change-triggered passes.
    pub resync: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            node_grace_period: Duration::from_secs(40),
            resync: Duration::from_secs(1),
        }
    }
}

impl Timing {
    /// Timings for tests: a node is unreachable after about two seconds of silence.
    pub fn fast() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(250),
            node_grace_period: Duration::from_secs(2),
            resync: Duration::from_millis(250),
        }
    }
}

/// What `kube-sim roles` and `kube-sim up` run.
#[derive(Clone, Debug)]
pub struct RolesConfig {
    pub roles: Vec<Role>,
    /// Simulated nodes, one kubelet each.
    pub nodes: Vec<String>,
    /// Each kubelet's root is `<root>/<node>`.
    pub root: PathBuf,
    /// A driver endpoint each kubelet registers without a registration socket; `{node}` in it
    /// is replaced by the node name.
    pub driver_endpoint: Option<String>,
    pub timing: Timing,
}

/// Running roles; dropping it does not stop them (the shutdown token does).
#[derive(Debug)]
pub struct RunningRoles {
    pub kubelets: Vec<kubelet::Kubelet>,
    pub control_plane: tokio::task::JoinSet<()>,
}

/// Starts every role in `config`.
pub async fn start(
    client: kube::Client,
    config: &RolesConfig,
    shutdown: CancellationToken,
) -> Result<RunningRoles, RoleError> {
    let control_plane = start_control_plane(
        client.clone(),
        &config.roles,
        config.timing.clone(),
        shutdown.clone(),
    );
    let mut kubelets = Vec::new();
    if config.roles.contains(&Role::Kubelet) {
        for node in &config.nodes {
            let mut kubelet_config = kubelet::KubeletConfig::new(
                node.clone(),
                config.root.join(node),
                config.timing.clone(),
            );
            if let Some(endpoint) = &config.driver_endpoint {
                let endpoint =
                    csi_grpc::conn::Endpoint::parse(&endpoint.replace("{node}", node))
                        .map_err(|e| RoleError::Invalid(format!("--driver-endpoint: {e}")))?;
                kubelet_config.driver_endpoints.push(endpoint);
            }
            kubelets.push(
                kubelet::Kubelet::start(client.clone(), kubelet_config, shutdown.clone()).await?,
            );
        }
    }
    Ok(RunningRoles {
        kubelets,
        control_plane,
    })
}

/// Starts the control-plane roles among `roles` (everything but the kubelet, which runs per
/// node: see [`kubelet::Kubelet`]). Each runs until `shutdown`; a role that fails is logged and
/// restarted after a pause, as a crashed controller manager would be.
pub fn start_control_plane(
    client: kube::Client,
    roles: &[Role],
    timing: Timing,
    shutdown: CancellationToken,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for role in roles.iter().copied().filter(|r| *r != Role::Kubelet) {
        let client = client.clone();
        let timing = timing.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            while !shutdown.is_cancelled() {
                let client = client.clone();
                let timing = timing.clone();
                let token = shutdown.clone();
                let result = match role {
                    Role::PvBinder => pv_binder::run(client, timing, token).await,
                    Role::Scheduler => scheduler::run(client, timing, token).await,
                    Role::AttachDetach => attach_detach::run(client, timing, token).await,
                    Role::NodeLifecycle => node_lifecycle::run(client, timing, token).await,
                    Role::ServiceAccounts => service_accounts::run(client, timing, token).await,
                    Role::ClusterRoleAggregation => {
                        cluster_role_aggregation::run(client, timing, token).await
                    }
                    Role::Kubelet => Ok(()),
                };
                if let Err(error) = result {
                    tracing::error!(role = role.name(), %error, "role failed, restarting");
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        });
    }
    tasks
}

/// Runs `pass` whenever `wake` fires or `resync` elapses, until `shutdown`. A failed pass is
/// logged and retried on the next wake-up.
pub(crate) async fn reconcile_loop<F, Fut>(
    role: &str,
    wake: Arc<Notify>,
    resync: Duration,
    shutdown: CancellationToken,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), RoleError>>,
{
    loop {
        if let Err(error) = pass().await {
            tracing::warn!(role, %error, "reconcile pass failed, retrying");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(resync) => {}
        }
    }
}

/// Runs a role whose passes read the caches `caches` sets up: once they have synced, `pass`
/// runs on every change and resync until `shutdown`.
pub(crate) async fn run_with_caches<C, F, Fut>(
    role: &str,
    client: &kube::Client,
    timing: &Timing,
    shutdown: CancellationToken,
    caches: impl FnOnce(&mut Informers) -> C,
    mut pass: F,
) -> Result<(), RoleError>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = Result<(), RoleError>>,
{
    let mut informers = Informers::new(client, &shutdown);
    let caches = caches(&mut informers);
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    reconcile_loop(role, wake, timing.resync, shutdown, || pass(caches.clone())).await;
    Ok(())
}

/// A JSON merge patch by the kube-sim field manager.
pub(crate) async fn merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// Same, on the status subresource.
pub(crate) async fn merge_patch_status<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// True for "not found" and "already exists" answers, which a repeated idempotent write gets.
pub(crate) fn is_benign(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 409 && status.reason == "AlreadyExists")
}

/// Deletes a pod at once (grace 0), guarded by its UID so a new pod of the same name is never
/// hit — the kubelet's final delete and pod GC's. False when it was already gone or replaced.
pub(crate) async fn force_delete_pod(
    client: &kube::Client,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Result<bool, RoleError> {
    use kube::ResourceExt;
    let api: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let params = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Now, as the API's RFC 3339 timestamps.
pub(crate) fn now() -> String {
    crate::apiserver::objects::now_rfc3339()
}

/// Seconds since an RFC 3339 timestamp (0 when unparsable or in the future).
pub(crate) fn age_seconds(timestamp: &str) -> f64 {
    let Ok(then) = timestamp.parse::<k8s_openapi::jiff::Timestamp>() else {
        return 0.0;
    };
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(then);
    elapsed.as_secs_f64().max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(role.name().parse::<Role>(), Ok(role));
        }
        let error = "kubeproxy".parse::<Role>().unwrap_err();
        assert!(error.contains("pv-binder"), "{error}");
    }

    #[test]
    fn ages() {
        assert_eq!(age_seconds("garbage"), 0.0);
        assert_eq!(age_seconds("2999-01-01T00:00:00Z"), 0.0);
        assert!(age_seconds("2020-01-01T00:00:00Z") > 1e8);
    }
}
