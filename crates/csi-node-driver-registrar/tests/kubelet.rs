//! The `csi-node-driver-registrar` and `livenessprobe` binaries against kube-sim's kubelet
//! (plugin watcher) and the reference driver's node instance: registration → CSINode entry,
//! `/healthz` 200 → 404 (logged as an error) when the socket goes; SIGTERM removes the socket and kubelet
//! unregisters; a stale socket is replaced; a registration kubelet rejects exits 1;
//! livenessprobe 200 while the driver answers, 500 (and an error logged) once its socket is
//! gone.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube_sim::roles::Timing;
use kube_sim::roles::kubelet::{Kubelet, KubeletConfig};
use kube_sim_harness::{Running, eventually, free_address, http_get};
use tokio_util::sync::CancellationToken;

use common::registrar;

const DRIVER: &str = "reg.test.io";
const NODE: &str = "node-a";

/// A binary's stderr, kept in a file the test reads.
struct LogFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl LogFile {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr.log");
        Self { _dir: dir, path }
    }

    fn stderr(&self) -> Stdio {
        std::fs::File::create(&self.path).unwrap().into()
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }

    /// The error lines of failed `/healthz` checks.
    fn failed_health_checks(&self) -> usize {
        self.text()
            .lines()
            .filter(|line| line.contains("ERROR") && line.contains("health check failed"))
            .count()
    }
}

/// The status code of `GET path`, `None` when nothing listens.
async fn status_of(address: std::net::SocketAddr, path: &str) -> Option<u16> {
    http_get(address, path).await.map(|(code, _)| code)
}

async fn wait_healthy(http: std::net::SocketAddr) {
    eventually("/healthz 200", || async {
        (status_of(http, "/healthz").await == Some(200)).then_some(())
    })
    .await;
}

async fn wait_registered(client: &kube::Client, what: &str) {
    eventually(what, || async { registered(client).await.then_some(()) }).await;
}

struct Node {
    client: kube::Client,
    driver: LocalCluster,
    registry: PathBuf,
    endpoint: PathBuf,
    config: KubeletConfig,
    _sim: kube_sim::ApiServer,
    kubelet: Kubelet,
    _root: tempfile::TempDir,
}

async fn node() -> Node {
    let root = tempfile::Builder::new()
        .prefix("reg-")
        .tempdir_in("/tmp")
        .unwrap();
    let sim = kube_sim::ApiServer::start().await.unwrap();
    let client = sim.client();
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await
    .unwrap();
    let config = KubeletConfig::new(NODE, driver.kubelet_dir(NODE), Timing::fast());
    let registry = config.plugins_registry();
    let kubelet = Kubelet::start(client.clone(), config.clone(), CancellationToken::new())
        .await
        .unwrap();
    let endpoint = driver.node(NODE).endpoint.path().to_path_buf();
    Node {
        client,
        driver,
        registry,
        endpoint,
        config,
        _sim: sim,
        kubelet,
        _root: root,
    }
}

async fn registered(client: &kube::Client) -> bool {
    Api::<CSINode>::all(client.clone())
        .get_opt(NODE)
        .await
        .ok()
        .flatten()
        .is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER))
}

#[tokio::test(flavor = "multi_thread")]
async fn registers_answers_health_and_deregisters_on_sigterm() {
    let node = node().await;
    let socket = node.registry.join(format!("{DRIVER}-reg.sock"));
    // A stale socket of a previous run (nothing listens) is replaced.
    std::fs::create_dir_all(&node.registry).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let http = free_address();
    let mut running = Running(registrar(
        &node.endpoint,
        &node.endpoint,
        &node.registry,
        http,
        Stdio::null(),
    ));

    wait_registered(&node.client, "the CSINode entry").await;
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600,
        "owner-only socket"
    );
    wait_healthy(http).await;

    Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .unwrap();
    let status = running.0.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0: {status}");
    assert!(!socket.exists(), "the socket is removed on SIGTERM");
    eventually("kubelet unregistered the driver", || async {
        (!registered(&node.client).await).then_some(())
    })
    .await;

    // Running again registers again; a socket deleted under it fails /healthz with 404,
    // logged as an error with its reason.
    let http = free_address();
    let log = LogFile::new();
    let _again = Running(registrar(
        &node.endpoint,
        &node.endpoint,
        &node.registry,
        http,
        log.stderr(),
    ));
    wait_registered(&node.client, "registered again").await;
    wait_healthy(http).await;
    assert_eq!(log.failed_health_checks(), 0);
    std::fs::remove_file(&socket).unwrap();
    assert_eq!(status_of(http, "/healthz").await, Some(404));
    eventually("the failed check logged as an error", || async {
        (log.failed_health_checks() > 0).then_some(())
    })
    .await;
    assert!(
        log.text().contains("registration socket does not exist"),
        "{}",
        log.text()
    );
    node.driver.stop().await;
}

/// A restarted kubelet finds the socket and registers the driver again (here into a CSINode
/// deleted meanwhile).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_kubelet_registers_the_driver_again() {
    let mut node = node().await;
    let http = free_address();
    let _running = Running(registrar(
        &node.endpoint,
        &node.endpoint,
        &node.registry,
        http,
        Stdio::null(),
    ));
    wait_registered(&node.client, "the CSINode entry").await;
    node.kubelet.stop().await;
    Api::<CSINode>::all(node.client.clone())
        .delete(NODE, &Default::default())
        .await
        .unwrap();
    node.kubelet = Kubelet::start(
        node.client.clone(),
        node.config.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    wait_registered(&node.client, "registered by the new kubelet").await;
    assert_eq!(status_of(http, "/healthz").await, Some(200));
    node.driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registration_kubelet_rejects_exits_1() {
    let node = node().await;
    let http = free_address();
    // kubelet cannot reach the endpoint it is told, so NodeGetInfo fails.
    let missing = node.registry.join("missing.sock");
    let mut running = Running(registrar(
        &node.endpoint,
        &missing,
        &node.registry,
        http,
        Stdio::null(),
    ));
    let status = eventually("the registrar exited", || {
        let status = running.0.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert_eq!(status.code(), Some(1), "{status}");
    assert!(!registered(&node.client).await, "no CSINode entry");
    node.driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn livenessprobe_reports_the_driver() {
    let node = node().await;
    let http = free_address();
    let log = LogFile::new();
    let _probe = Running(
        Command::new(env!("CARGO_BIN_EXE_livenessprobe"))
            .arg(format!("--csi-address={}", node.endpoint.display()))
            .arg(format!("--http-endpoint={http}"))
            .stdout(Stdio::null())
            .stderr(log.stderr())
            .spawn()
            .unwrap(),
    );
    wait_healthy(http).await;
    assert_eq!(status_of(http, "/metrics").await, Some(200));
    for _ in 0..3 {
        assert_eq!(status_of(http, "/healthz").await, Some(200));
    }
    let text = log.text();
    assert!(
        !text.contains("WARN") && !text.contains("ERROR"),
        "nothing to warn of while the driver answers (each check connects and lets go): {text}"
    );
    node.driver.stop().await;
    eventually("/healthz 500 once the driver is gone", || async {
        (status_of(http, "/healthz").await == Some(500)).then_some(())
    })
    .await;
    eventually("the failed check logged as an error", || async {
        (log.failed_health_checks() > 0).then_some(())
    })
    .await;
}
