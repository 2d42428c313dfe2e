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

use crate::conn::{ConnError, CsiConnection, DEFAULT_CONNECT_WAIT, DriverInfo, Services, connect};
use crate::flags::{CsiArgs, SidecarArgs};
use crate::http::{HealthCheck, HttpError};
use crate::informers::CacheSyncHealth;
use crate::leader::{LeaderElectionError, LeaderStatus};
use crate::metrics::CsiOperationMetrics;
use crate::metrics::process::{ProcessCollector, ProcessFamilies};

/// Connects (waiting a bounded time for the socket), exits the process when the connection is
/// later lost, calls Probe until the driver is ready and discovers its name and capabilities.
pub async fn connect_driver(
    args: &CsiArgs,
    metrics: CsiOperationMetrics,
    services: Services,
) -> Result<(CsiConnection, DriverInfo), ConnError> {
    let endpoint = args.endpoint()?;
    let csi = connect(&endpoint, DEFAULT_CONNECT_WAIT, metrics.clone()).await?;
    csi.exit_on_loss();
    csi.probe_until_ready(args.timeout).await?;
    let driver = DriverInfo::discover(&csi, args.timeout, services).await?;
    metrics.set_driver_name(&driver.name);
    tracing::info!(driver = %driver.name, "detected CSI driver");
    Ok((csi, driver))
}

/// Serves `registry` and the health checks on `--http-endpoint` (or `--metrics-address`),
/// with `/healthz/leader-election` when electing; returns the leader status the election
/// keeps up to date.
pub async fn serve_http(
    sidecar: &SidecarArgs,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<Arc<LeaderStatus>, HttpError> {
    serve_checks(sidecar, registry, Vec::new(), shutdown).await
}

/// [`serve_http`] with `/healthz/informer-sync` (as kube-controller-manager's check is named):
/// unhealthy while a cache of the controller has no initial list after `grace`. Returns the
/// [`CacheSyncHealth`] the controller's informers report to.
pub async fn serve_http_with_caches(
    sidecar: &SidecarArgs,
    registry: Registry,
    grace: Duration,
    shutdown: CancellationToken,
) -> Result<(Arc<LeaderStatus>, Arc<CacheSyncHealth>), HttpError> {
    let caches = CacheSyncHealth::new(grace);
    let check = caches.clone();
    let checks: Vec<(String, HealthCheck)> =
        vec![("informer-sync".to_string(), Arc::new(move || check.check()))];
    let status = serve_checks(sidecar, registry, checks, shutdown).await?;
    Ok((status, caches))
}

/// Also serves what the Go sidecars' legacy registry adds to their own metrics: the
/// `process_*` families and `leader_election_master_status`.
async fn serve_checks(
    sidecar: &SidecarArgs,
    mut registry: Registry,
    mut checks: Vec<(String, HealthCheck)>,
    shutdown: CancellationToken,
) -> Result<Arc<LeaderStatus>, HttpError> {
    let status = LeaderStatus::new(sidecar.leader_election.leader_election_lease_duration);
    status.register(&mut registry);
    registry.register_collector(Box::new(ProcessCollector::new(ProcessFamilies::All)));
    if sidecar.leader_election.leader_election {
        let status = status.clone();
        checks.push((
            "leader-election".to_string(),
            Arc::new(move || status.check()),
        ));
    }
    crate::http::start(&sidecar.http, Arc::new(registry), checks, shutdown).await?;
    Ok(status)
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
