//! The startup every controller sidecar shares (csi-lib-utils' `connection.Connect`,
//! `rpc.ProbeForever`, the HTTP server and `leaderelection.NewLeaderElection`): connect to the
//! driver and learn what it is, serve metrics and health, then run the controller — under
//! leader election when `--leader-election` asks for it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::flags::SidecarArgs;
use crate::informers::CacheSyncHealth;
use crate::leader::{LeaderElectionError, LeaderStatus};
pub use csi_grpc::conn::ConnError;
use csi_grpc::conn::{
    CsiConnection, DEFAULT_CONNECT_WAIT, DriverInfo, Services, StartupOrder, connect,
};
use csi_grpc::flags::CsiArgs;
use csi_grpc::http::HealthCheck;
pub use csi_grpc::http::HttpError;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_grpc::metrics::process::{ProcessCollector, ProcessFamilies};

/// What stops a controller at start-up or while it runs, whichever controller it is: the
/// Kubernetes client, the driver connection, the HTTP endpoint, leader election, the feature
/// gates. Each binary's `RunError` wraps it beside its own reasons, and
/// [`startup_error_conversions!`](crate::startup_error_conversions) lets `?` lift the parts
/// straight into that.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeClientError),
    #[error(transparent)]
    Csi(#[from] ConnError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    LeaderElection(#[from] LeaderElectionError),
    #[error("{0}")]
    FeatureGates(String),
}

/// `From` each part of [`StartupError`] for a binary's error type, whose variant
/// `Startup(StartupError)` carries them.
#[macro_export]
macro_rules! startup_error_conversions {
    ($error:ty) => {
        $crate::startup_error_conversions!(@from $error: $crate::kube::KubeClientError, $crate::startup::ConnError, $crate::startup::HttpError, $crate::leader::LeaderElectionError);
    };
    (@from $error:ty: $($part:ty),*) => {
        $(
            impl From<$part> for $error {
                fn from(error: $part) -> Self {
                    Self::Startup($crate::startup::StartupError::from(error))
                }
            }
        )*
    };
}

/// Connects (waiting a bounded time for the socket), exits the process when the connection is
/// later lost, calls Probe until the driver is ready and discovers its name and capabilities,
/// in the `order` of the upstream binary.
pub async fn connect_driver(
    args: &CsiArgs,
    metrics: CsiOperationMetrics,
    services: Services,
    order: StartupOrder,
) -> Result<(CsiConnection, DriverInfo), ConnError> {
    let endpoint = args.endpoint()?;
    let csi = connect(&endpoint, DEFAULT_CONNECT_WAIT, metrics).await?;
    csi.exit_on_loss();
    let driver = DriverInfo::start(&csi, args.timeout, services, order).await?;
    tracing::info!(driver = %driver.name, "detected CSI driver");
    Ok((csi, driver))
}

/// Which registries the Go binary's `/metrics` gathers besides its own metrics, and so which
/// of their families ours serves as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoRegistries {
    /// component-base's legacy registry (csi-provisioner): every `process_*` family and
    /// `leader_election_master_status`.
    Legacy,
    /// csi-lib-utils' metrics-manager registry, then the legacy one (attacher, resizer,
    /// csi-snapshotter): the same, with the manager's `process_start_time_seconds`.
    ManagerThenLegacy,
    /// The metrics-manager registry alone (snapshot-controller): `process_start_time_seconds`
    /// only, and no leader gauge although it elects.
    Manager,
}

impl GoRegistries {
    fn process_families(self) -> ProcessFamilies {
        match self {
            Self::Legacy => ProcessFamilies::All,
            Self::ManagerThenLegacy => ProcessFamilies::AllWithManagerStartTime,
            Self::Manager => ProcessFamilies::StartTime,
        }
    }
}

/// Serves `registry` and the health checks on `--http-endpoint` (or `--metrics-address`),
/// with `/healthz/leader-election` when electing; returns the leader status the election
/// keeps up to date.
pub async fn serve_http(
    sidecar: &SidecarArgs,
    registry: Registry,
    go_registries: GoRegistries,
    shutdown: CancellationToken,
) -> Result<Arc<LeaderStatus>, HttpError> {
    serve_checks(sidecar, registry, go_registries, Vec::new(), shutdown).await
}

/// [`serve_http`] with `/healthz/informer-sync` (as kube-controller-manager's check is named):
/// unhealthy while a cache of the controller has no initial list after `grace`. Returns the
/// [`CacheSyncHealth`] the controller's informers report to.
pub async fn serve_http_with_caches(
    sidecar: &SidecarArgs,
    registry: Registry,
    go_registries: GoRegistries,
    grace: Duration,
    shutdown: CancellationToken,
) -> Result<(Arc<LeaderStatus>, Arc<CacheSyncHealth>), HttpError> {
    let caches = CacheSyncHealth::new(grace);
    let check = caches.clone();
    let checks: Vec<(String, HealthCheck)> =
        vec![("informer-sync".to_string(), Arc::new(move || check.check()))];
    let status = serve_checks(sidecar, registry, go_registries, checks, shutdown).await?;
    Ok((status, caches))
}

/// Also serves what the Go binary's other registries add to its own metrics.
async fn serve_checks(
    sidecar: &SidecarArgs,
    mut registry: Registry,
    go_registries: GoRegistries,
    mut checks: Vec<(String, HealthCheck)>,
    shutdown: CancellationToken,
) -> Result<Arc<LeaderStatus>, HttpError> {
    let status = LeaderStatus::new(sidecar.leader_election.leader_election_lease_duration);
    add_go_families(&mut registry, go_registries, &status);
    if sidecar.leader_election.leader_election {
        let status = status.clone();
        checks.push((
            "leader-election".to_string(),
            Arc::new(move || status.check()),
        ));
    }
    csi_grpc::http::start(&sidecar.http, Arc::new(registry), checks, shutdown).await?;
    Ok(status)
}

/// Adds the families of the Go binary's other registries: the `process_*` families and, with
/// the legacy registry, `leader_election_master_status`.
fn add_go_families(registry: &mut Registry, go_registries: GoRegistries, status: &LeaderStatus) {
    if go_registries != GoRegistries::Manager {
        status.register(registry);
    }
    registry.register_collector(Box::new(ProcessCollector::new(
        go_registries.process_families(),
    )));
}

/// Runs `work` until `shutdown` — directly, or while holding the Lease `lock_name` (sanitized)
/// when `--leader-election` is set. The outer error is a lost Lease (exit non-zero, as
/// upstream); the inner one is the controller's own.
pub async fn run_controller<W, F, E>(
    client: Client,
    sidecar: &SidecarArgs,
    lock_name: &str,
    release_on_exit: bool,
    status: Arc<LeaderStatus>,
    shutdown: CancellationToken,
    work: W,
) -> Result<Result<(), E>, LeaderElectionError>
where
    W: FnOnce(CancellationToken) -> F,
    F: Future<Output = Result<(), E>>,
{
    if !sidecar.leader_election.leader_election {
        return Ok(work(shutdown).await);
    }
    let election = sidecar.leader_election.config(lock_name, release_on_exit);
    let mut outcome = Ok(());
    crate::leader::run(client, election, status, shutdown, |leading| async {
        outcome = work(leading).await;
    })
    .await?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn each_binary_serves_the_families_of_its_go_registries() {
        // (registries, leader gauge served, process_open_fds served, start time's help)
        let table = [
            (
                GoRegistries::Legacy,
                true,
                true,
                "Start time of the process",
            ),
            (
                GoRegistries::ManagerThenLegacy,
                true,
                true,
                "[ALPHA] Start time of the process",
            ),
            (
                GoRegistries::Manager,
                false,
                false,
                "[ALPHA] Start time of the process",
            ),
        ];
        for (go_registries, leader_gauge, open_fds, start_time_help) in table {
            let mut registry = Registry::default();
            let status = LeaderStatus::new(Duration::from_secs(15));
            add_go_families(&mut registry, go_registries, &status);
            status.set(true, Some(Instant::now()));
            let text = csi_grpc::metrics::encode(&registry);
            assert_eq!(
                text.contains("leader_election_master_status{name=\"\"} 1"),
                leader_gauge,
                "{go_registries:?}: {text}"
            );
            assert_eq!(
                text.contains("process_open_fds "),
                open_fds,
                "{go_registries:?}: {text}"
            );
            let help = format!("# HELP process_start_time_seconds {start_time_help}");
            assert!(text.contains(&help), "{go_registries:?}: {text}");
        }
    }
}
