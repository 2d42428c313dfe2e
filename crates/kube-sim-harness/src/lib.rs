//! kube-sim-harness: test and benchmark helpers for the suite's tests, a dev-dependency only and
//! never a dependency of a binary (`make layers` checks), so none of it ships in kube-sim or in
//! a user's dependency graph.
//!
//! At the root, helpers for tests that run the suite's binaries against kube-sim: a child
//! process killed when the test ends, polling until a condition holds, a minimal HTTP GET for
//! their `/healthz` and `/metrics`, and the client of kube-sim's API tests (kube-sim, or the
//! real server they are compared with). [`benchmarks`]: the sections of `BENCHMARKS.md` and
//! the release binaries the benchmarks measure.

pub mod benchmarks;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A child process, killed and reaped when dropped (whether the test passed or not).
#[derive(Debug)]
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `binary` with `args`, its output discarded.
pub fn spawn(binary: &str, args: impl IntoIterator<Item = String>) -> Running {
    let child = std::process::Command::new(binary)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
    Running(child)
}

/// The holder of the Lease `name` in namespace `default`, once one holds it.
pub async fn lease_holder(client: &kube::Client, name: &str) -> String {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "default");
    eventually("the Lease", || async {
        leases
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    })
    .await
}

/// Polls `check` every 100 ms until it yields a value; panics naming `what` after 30 s.
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` over HTTP/1.0: the status code and the body; `None` when nothing answers.
pub async fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((code, body))
}

/// A free local TCP address for a server under test.
pub fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
}

/// Whether a namespace's pods are admitted yet: the ServiceAccount admission plugin refuses
/// them until kube-controller-manager (kube-sim's `serviceaccounts` role) has made the
/// namespace's `default` ServiceAccount and, on servers before 1.24, listed its token Secret.
pub async fn admits_pods(client: &kube::Client, namespace: &str) -> Result<bool, kube::Error> {
    let version = client.apiserver_version().await?;
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .unwrap_or(u32::MAX);
    let needs_token = version.major == "1" && minor < 24;
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(client.clone(), namespace);
    Ok(accounts
        .get_opt(kube_sim::roles::service_accounts::DEFAULT_SERVICE_ACCOUNT)
        .await?
        .is_some_and(|account| {
            !needs_token || account.secrets.as_ref().is_some_and(|s| !s.is_empty())
        }))
}

/// An API server and a kubeconfig for it written to `dir/kubeconfig`, for a binary's
/// `--kubeconfig`.
pub async fn api_server_with_kubeconfig(
    dir: &std::path::Path,
) -> (kube_sim::ApiServer, std::path::PathBuf) {
    let sim = kube_sim::ApiServer::start().await.expect("kube-sim starts");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, kube_sim::cli::kubeconfig_yaml(sim.addr)).expect("a kubeconfig");
    (sim, kubeconfig)
}

/// A client of the API server `KUBE_SIM_COMPARE_KUBECONFIG` names (compare mode), else of a
/// new kube-sim, returned with it.
pub async fn server_under_test() -> (kube::Client, Option<kube_sim::ApiServer>) {
    match std::env::var("KUBE_SIM_COMPARE_KUBECONFIG") {
        Ok(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                .unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("the configuration of {path}: {e}"));
            let client = kube::Client::try_from(config).expect("a client of the compared server");
            (client, None)
        }
        Err(_) => {
            let sim = kube_sim::ApiServer::start().await.expect("kube-sim starts");
            (sim.client(), Some(sim))
        }
    }
}
