//! What the sidecar benchmarks (`tests/benches/`) share: the API server under test (kube-sim
//! or `KUBECONFIG`), the CSI driver under test (the reference driver, or the one at
//! `BENCH_CSI_ENDPOINT`), the sidecar binary as its own process (the release build, or the one
//! `BENCH_<SIDECAR>` names), its peak RSS and time in the driver, API requests per object
//! (counted by kube-sim per client; on a real server, all clients' requests from its
//! `apiserver_request_total`), and the report tables. Nothing here asserts a timing.
//!
//! Environment, for comparing with other implementations (`<SIDECAR>` is the sidecar's name
//! without `csi-`, upper case: `PROVISIONER`, `ATTACHER`):
//! - `BENCH_<SIDECAR>=/path/to/binary`: run that binary instead of this workspace's release
//!   build (it must take the same `--kubeconfig`, `--http-endpoint` and `--csi-address` flags).
//! - `BENCH_<SIDECAR>_ARGS="--flag=value ..."`: extra flags, split on whitespace.
//! - `BENCH_CSI_ENDPOINT=/path/to/socket` (or `unix:///path`): a running driver serving the
//!   Identity, Controller and Node services on one socket, instead of the reference driver.
//!   Its name (GetPluginInfo), node ID and topology (NodeGetInfo) are asked over the socket,
//!   exactly as they are asked of the reference driver.
//!
//! A run with any of these is printed but never written to `BENCHMARKS.md` ([`record`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_grpc::conn::{Endpoint, connect};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_hostpath::local::LocalCluster;
use csi_proto::csi::v1 as csi;
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use kube_sim::apiserver::{RequestCounts, RequestKey};
use kube_sim::roles::{Role, Timing};
use kube_sim_harness::benchmarks;
use serde::de::DeserializeOwned;

/// The client name of a real server's request counts: it counts all clients together.
pub const ALL_CLIENTS: &str = "(all clients)";

/// The API server to use: kube-sim with `roles`, or the cluster of `KUBECONFIG`.
pub struct ApiServerUnderTest {
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub sim: Option<kube_sim::ApiServer>,
    _control_plane: tokio::task::JoinSet<()>,
}

impl std::fmt::Debug for ApiServerUnderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerUnderTest")
            .field("kubeconfig", &self.kubeconfig)
            .field("kube_sim", &self.sim.is_some())
            .finish_non_exhaustive()
    }
}

impl ApiServerUnderTest {
    pub async fn start(root: &Path, roles: &[Role]) -> anyhow::Result<Self> {
        if let Ok(path) = std::env::var("KUBECONFIG") {
            return Ok(Self {
                client: Client::try_default().await?,
                kubeconfig: PathBuf::from(path),
                sim: None,
                _control_plane: tokio::task::JoinSet::new(),
            });
        }
        let sim = kube_sim::ApiServer::start().await?;
        let kubeconfig = root.join("kubeconfig");
        std::fs::write(&kubeconfig, kube_sim::cli::kubeconfig_yaml(sim.addr))?;
        let client = sim.client();
        let control_plane = kube_sim::roles::start_control_plane(
            client.clone(),
            roles,
            Timing::default(),
            tokio_util::sync::CancellationToken::new(),
        );
        Ok(Self {
            client,
            kubeconfig,
            sim: Some(sim),
            _control_plane: control_plane,
        })
    }

    /// kube-sim's request counts per client; on a real server, its `apiserver_request_total`
    /// (all clients together, as [`ALL_CLIENTS`]; `None` if `/metrics` cannot be read).
    pub async fn counts(&self) -> Option<RequestCounts> {
        if let Some(sim) = &self.sim {
            return Some(sim.request_counts());
        }
        let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
        let text = self.client.request_text(request).await.ok()?;
        Some(server_request_counts(&text))
    }
}

/// kube-apiserver's `apiserver_request_total` by verb, group and resource (summed over codes,
/// versions and scopes), under the client [`ALL_CLIENTS`].
fn server_request_counts(metrics: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_default()
                .to_string()
        };
        let verb = match label("verb").as_str() {
            "POST" => "create".to_string(),
            "PUT" => "update".to_string(),
            "PATCH" | "APPLY" => "patch".to_string(),
            "WATCH" | "WATCHLIST" => "watch".to_string(),
            other => other.to_lowercase(),
        };
        let subresource = label("subresource");
        let resource = if subresource.is_empty() {
            label("resource")
        } else {
            format!("{}/{subresource}", label("resource"))
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = RequestKey {
            client: ALL_CLIENTS.to_string(),
            verb,
            group: label("group"),
            resource,
        };
        *counts.entry(key).or_default() += value as u64;
    }
    counts
}

/// The CSI driver under test: the reference driver in this process (a controller instance and
/// one node instance), or the running driver at `BENCH_CSI_ENDPOINT`. Either way its name,
/// node ID and topology are what it answers over its node socket.
#[derive(Debug)]
pub struct DriverUnderTest {
    /// The socket a controller sidecar uses.
    pub controller: PathBuf,
    /// What GetPluginInfo answers.
    pub name: String,
    /// What NodeGetInfo answers.
    pub node_id: String,
    pub topology: BTreeMap<String, String>,
    /// The reference driver, when no `BENCH_CSI_ENDPOINT` is given.
    pub local: Option<LocalCluster>,
}

impl DriverUnderTest {
    /// The driver at `BENCH_CSI_ENDPOINT`, else the reference driver named `name` with one node
    /// instance `node`.
    pub async fn start(root: &Path, name: &str, node: &str) -> anyhow::Result<Self> {
        let (local, controller, node_socket) = match std::env::var("BENCH_CSI_ENDPOINT") {
            Ok(address) => {
                let path = Endpoint::parse(&address)?.path().to_path_buf();
                (None, path.clone(), path)
            }
            Err(_) => {
                let local = LocalCluster::start(root, &[node], |config| {
                    config.driver_name = name.to_string();
                })
                .await?;
                let controller = local.controller.endpoint.path().to_path_buf();
                let node_socket = local.node(node).endpoint.path().to_path_buf();
                (Some(local), controller, node_socket)
            }
        };
        let csi = connect(
            &Endpoint::from_path(&node_socket)?,
            Duration::from_secs(10),
            CsiOperationMetrics::unregistered(),
        )
        .await?;
        let timeout = Duration::from_secs(10);
        let plugin = csi
            .get_plugin_info(csi::GetPluginInfoRequest {}, timeout)
            .await?;
        let info = csi
            .node_get_info(csi::NodeGetInfoRequest {}, timeout)
            .await?;
        Ok(Self {
            controller,
            name: plugin.name,
            node_id: info.node_id,
            topology: info
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
            local,
        })
    }

    /// A connection to its controller socket, for the benchmark's own calls (its volumes).
    pub async fn controller_connection(&self) -> anyhow::Result<csi_grpc::conn::CsiConnection> {
        Ok(connect(
            &Endpoint::from_path(&self.controller)?,
            Duration::from_secs(10),
            CsiOperationMetrics::unregistered(),
        )
        .await?)
    }

    /// Whether this is a driver of `BENCH_CSI_ENDPOINT`, not the reference driver.
    pub fn external(&self) -> bool {
        self.local.is_none()
    }

    /// Stops the reference driver (an external one keeps running).
    pub async fn stop(self) {
        if let Some(local) = self.local {
            local.stop().await;
        }
    }
}

/// A sidecar binary running as its own process, logging to a file.
#[derive(Debug)]
pub struct SidecarProcess {
    pub binary: PathBuf,
    /// The flags `BENCH_<SIDECAR>_ARGS` added.
    pub extra_args: Vec<String>,
    /// Whether `BENCH_<SIDECAR>` named the binary.
    pub external: bool,
    /// Where it serves `/metrics` (`None`: a binary given no `--http-endpoint`).
    pub metrics_address: Option<std::net::SocketAddr>,
    child: std::process::Child,
    log: PathBuf,
}

impl SidecarProcess {
    /// Starts `name` (the release build beside this benchmark's profile directory, or the
    /// binary `BENCH_<SIDECAR>` names) with `args`, the flags of `BENCH_<SIDECAR>_ARGS`, the
    /// kubeconfig and an `--http-endpoint`; returns once it has opened `watches` watches
    /// (kube-sim and our binary), else after 5 s.
    pub async fn start(
        name: &str,
        args: &[String],
        api: &ApiServerUnderTest,
        root: &Path,
        watches: usize,
    ) -> anyhow::Result<Self> {
        Self::start_with(name, args, api, root, watches, true).await
    }

    /// [`SidecarProcess::start`], giving a binary of `BENCH_<SIDECAR>` an `--http-endpoint`
    /// only when `external_http` (upstream's COSI binaries have no such flag, and refuse flags
    /// they do not know). Such a binary gets 5 s to start, and fails the run if it exits.
    pub async fn start_with(
        name: &str,
        args: &[String],
        api: &ApiServerUnderTest,
        root: &Path,
        watches: usize,
        external_http: bool,
    ) -> anyhow::Result<Self> {
        let binary = match std::env::var_os(variable_of(name)) {
            Some(path) => (PathBuf::from(path), true),
            None => (Self::ours(name)?, false),
        };
        Self::start_binary(name, binary, args, api, root, watches, external_http).await
    }

    /// This workspace's release build of `name`.
    pub fn ours(name: &str) -> std::io::Result<PathBuf> {
        benchmarks::release_binary(name, package_of(name))
    }

    /// [`SidecarProcess::start_with`] with the binary given (`external`: not this workspace's
    /// build), for a benchmark that runs ours and another binary by turns.
    pub async fn start_binary(
        name: &str,
        (binary, external): (PathBuf, bool),
        args: &[String],
        api: &ApiServerUnderTest,
        root: &Path,
        watches: usize,
        external_http: bool,
    ) -> anyhow::Result<Self> {
        let variable = variable_of(name);
        let extra_args: Vec<String> = std::env::var(format!("{variable}_ARGS"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let metrics_address = (!external || external_http)
            .then(|| std::net::TcpListener::bind("127.0.0.1:0")?.local_addr())
            .transpose()?;
        let log = root.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = std::process::Command::new(&binary)
            .args(args)
            .args(&extra_args)
            .arg(format!("--kubeconfig={}", api.kubeconfig.display()))
            .args(metrics_address.map(|address| format!("--http-endpoint={address}")))
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = Self {
            binary,
            extra_args,
            external,
            metrics_address,
            child,
            log,
        };
        let started = Instant::now();
        // Another binary may open other watches: it gets the fixed wait.
        while let Some(current) = api
            .sim
            .as_ref()
            .filter(|_| !external)
            .map(kube_sim::ApiServer::request_counts)
        {
            let open = current
                .iter()
                .filter(|(k, _)| k.client == name && k.verb == "watch")
                .count();
            if open >= watches {
                return Ok(process);
            }
            if started.elapsed() > Duration::from_secs(30) {
                process.print_log_tail();
                process.stop();
                bail!("{name} did not start its watches within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        if let Some(status) = process.child.try_wait()? {
            process.print_log_tail();
            bail!("{} exited: {status}", process.binary.display());
        }
        Ok(process)
    }

    /// Its client name in the API server's request counts: its User-Agent's program name,
    /// which is the file name of our binaries and of Go ones.
    pub fn client(&self) -> String {
        self.binary
            .file_name()
            .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
    }

    /// The binary and the flags `BENCH_<SIDECAR>_ARGS` added, for a report.
    pub fn describe(&self) -> String {
        if self.extra_args.is_empty() {
            format!("`{}`", self.binary.display())
        } else {
            format!(
                "`{}` with `{}`",
                self.binary.display(),
                self.extra_args.join(" ")
            )
        }
    }

    /// Another binary, or ours with other flags: a run not to record.
    pub fn swapped(&self) -> bool {
        self.external || !self.extra_args.is_empty()
    }

    /// The peak resident set (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        benchmarks::peak_rss_mib(self.child.id())
    }

    /// The CPU seconds (user + system) it has used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        benchmarks::cpu_seconds(self.child.id())
    }

    pub fn binary_mib(&self) -> f64 {
        std::fs::metadata(&self.binary).map_or(0.0, |m| m.len() as f64 / 1024.0 / 1024.0)
    }

    /// The last lines of its log, on stderr (after a failed phase).
    pub fn print_log_tail(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("{}'s last log lines:", self.binary.display());
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
    }

    /// Mean latency of each of `methods` (`CreateVolume`, of any CSI service) from its
    /// `csi_sidecar_operations_seconds`.
    pub async fn driver_latencies(&self, methods: &[&str]) -> Option<String> {
        let (_, text) = kube_sim_harness::http_get(self.metrics_address?, "/metrics").await?;
        let value = |suffix: &str, method: &str| -> Option<f64> {
            text.lines()
                .filter(|l| l.starts_with(&format!("csi_sidecar_operations_seconds_{suffix}{{")))
                .filter(|l| l.contains(&format!("/{method}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .reduce(|a, b| a + b)
        };
        let mean = |method: &str| {
            let (sum, count) = (value("sum", method)?, value("count", method)?);
            (count > 0.0).then(|| format!("{method} {:.1} ms", sum / count * 1e3))
        };
        let parts: Vec<String> = methods.iter().filter_map(|m| mean(m)).collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two binaries working together, each as its own process: a controller and its sidecar.
#[derive(Debug)]
pub struct BinaryPair {
    processes: [SidecarProcess; 2],
    names: [&'static str; 2],
}

impl BinaryPair {
    /// Starts both (in order): each a name, its flags and the watches it opens
    /// ([`SidecarProcess::start`]).
    pub async fn start(
        api: &ApiServerUnderTest,
        root: &Path,
        [
            (first, first_args, first_watches),
            (second, second_args, second_watches),
        ]: [(&'static str, Vec<String>, usize); 2],
    ) -> anyhow::Result<Self> {
        let mut first_process =
            SidecarProcess::start(first, &first_args, api, root, first_watches).await?;
        let second_process =
            match SidecarProcess::start(second, &second_args, api, root, second_watches).await {
                Ok(process) => process,
                Err(error) => {
                    first_process.stop();
                    return Err(error);
                }
            };
        Ok(Self {
            processes: [first_process, second_process],
            names: [first, second],
        })
    }

    /// Stops both once `phases` ran (printing their logs if the phases failed) and reports:
    /// [`paired_report`] over `count` objects, then the mean time the second spent in the
    /// driver's `methods`. Also whether either binary was swapped ([`SidecarProcess::swapped`]).
    pub async fn finish(
        mut self,
        phases: anyhow::Result<Vec<PairedPhase>>,
        (count, unit, per): (usize, &str, &str),
        methods: &[&str],
    ) -> anyhow::Result<(String, bool)> {
        if phases.is_err() {
            self.processes
                .iter()
                .for_each(SidecarProcess::print_log_tail);
        }
        let rss = self.processes.each_ref().map(SidecarProcess::peak_rss_mib);
        let driver_time = self.processes[1].driver_latencies(methods).await;
        self.processes.iter_mut().for_each(SidecarProcess::stop);
        let [first, second] = &self.processes;
        let mut report = paired_report(
            count,
            unit,
            per,
            &phases?,
            [
                (self.names[0], first, rss[0]),
                (self.names[1], second, rss[1]),
            ],
        );
        if let Some(lines) = driver_time {
            let _ = writeln!(
                report,
                "Time in the driver (mean per call, from {}'s `csi_sidecar_operations_seconds`): {lines}.",
                self.names[1]
            );
        }
        Ok((report, first.swapped() || second.swapped()))
    }
}

/// One measured phase: how long, per-object latencies, and the sidecar's API requests.
#[derive(Debug)]
pub struct Phase {
    pub name: &'static str,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    pub requests: Option<Requests>,
}

/// `client`'s requests between two snapshots of the counts, by "verb resource" (a real
/// server's: all clients' requests).
pub fn client_requests(
    client: &str,
    before: Option<RequestCounts>,
    after: Option<RequestCounts>,
) -> Option<Requests> {
    let (before, after) = (before?, after?);
    let by_request = after
        .iter()
        .filter(|(key, _)| key.client == client || key.client == ALL_CLIENTS)
        .filter_map(|(key, count)| {
            let earlier = before.get(key).copied().unwrap_or(0);
            (count > &earlier).then(|| (format!("{} {}", key.verb, key.resource), count - earlier))
        })
        .collect();
    Some(Requests {
        all_clients: after.keys().any(|key| key.client == ALL_CLIENTS),
        by_request,
    })
}

/// API requests of a phase by "verb resource": the sidecar's own, or (a real server, which
/// cannot count per client) every client's.
#[derive(Debug, Clone)]
pub struct Requests {
    pub all_clients: bool,
    pub by_request: BTreeMap<String, u64>,
}

/// A measured phase of two binaries working together (a controller and its sidecar): each
/// one's API requests.
#[derive(Debug)]
pub struct PairedPhase {
    pub name: &'static str,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    /// The requests of the first and the second binary.
    pub requests: [Option<Requests>; 2],
}

impl PairedPhase {
    /// Runs `work` (which returns the per-object latencies) as the phase `name`, timed, with
    /// the requests of `clients` (their names in the counts) made meanwhile.
    pub async fn measure(
        server: &ApiServerUnderTest,
        name: &'static str,
        clients: [&str; 2],
        work: impl std::future::Future<Output = anyhow::Result<Vec<Duration>>>,
    ) -> anyhow::Result<Self> {
        let before = server.counts().await;
        let start = Instant::now();
        let latencies = work.await?;
        let elapsed = start.elapsed();
        let after = server.counts().await;
        Ok(Self {
            name,
            elapsed,
            latencies,
            requests: clients.map(|client| client_requests(client, before.clone(), after.clone())),
        })
    }

    /// The phase as the binary `which` (0 or 1) saw it.
    pub fn of(&self, which: usize) -> Phase {
        Phase {
            name: self.name,
            elapsed: self.elapsed,
            latencies: self.latencies.clone(),
            requests: self.requests[which].clone(),
        }
    }
}

/// The report of two binaries working together: the phase table (`unit` per second), each
/// binary's peak RSS (`rss`, taken before it stopped) and size, and each one's API requests
/// `per` object.
pub fn paired_report(
    count: usize,
    unit: &str,
    per: &str,
    phases: &[PairedPhase],
    binaries: [(&str, &SidecarProcess, Option<f64>); 2],
) -> String {
    let mut report = phase_table(
        count,
        unit,
        &phases.iter().map(|p| p.of(0)).collect::<Vec<_>>(),
    );
    let mib = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.1} MiB"));
    let _ = writeln!(
        report,
        "\n| binary | peak RSS | binary size (release) |\n|---|---|---|"
    );
    for (name, process, rss) in binaries {
        let _ = writeln!(
            report,
            "| {name} | {} | {:.1} MiB |",
            mib(rss),
            process.binary_mib()
        );
    }
    report.push('\n');
    for (which, (name, _, _)) in binaries.iter().enumerate() {
        let _ = writeln!(report, "API requests of {name}:\n");
        report.push_str(&request_table(
            count,
            per,
            &phases.iter().map(|p| p.of(which)).collect::<Vec<_>>(),
        ));
        report.push('\n');
    }
    report
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The rate / p50 / p99 / wall-time table of `phases` over `count` objects.
pub fn phase_table(count: usize, unit: &str, phases: &[Phase]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| phase | {unit}/s | p50 | p99 | wall time |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    let millis = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    for phase in phases {
        let rate = count as f64 / phase.elapsed.as_secs_f64();
        let (p50, p99) = if phase.latencies.is_empty() {
            ("—".to_string(), "—".to_string())
        } else {
            (
                millis(percentile(&phase.latencies, 50.0)),
                millis(percentile(&phase.latencies, 99.0)),
            )
        };
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {p50} | {p99} | {:.2} s |",
            phase.name,
            phase.elapsed.as_secs_f64()
        );
    }
    out
}

/// The API requests of each phase per object (watches in all), with the sum of writes.
pub fn request_table(count: usize, per: &str, phases: &[Phase]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| phase | request | per {per} |");
    let _ = writeln!(out, "|---|---|---|");
    for phase in phases {
        let Some(requests) = &phase.requests else {
            let _ = writeln!(out, "| {} | (not counted) | |", phase.name);
            continue;
        };
        let whose = if requests.all_clients {
            " (all clients)"
        } else {
            ""
        };
        let mut writes = 0;
        for (request, n) in &requests.by_request {
            if request.starts_with("watch ") {
                let _ = writeln!(out, "| {} | {request}{whose} | {n} in all |", phase.name);
                continue;
            }
            if ["create", "update", "patch", "delete"]
                .iter()
                .any(|verb| request.starts_with(verb))
            {
                writes += n;
            }
            let _ = writeln!(
                out,
                "| {} | {request}{whose} | {:.2} |",
                phase.name,
                *n as f64 / count as f64
            );
        }
        let _ = writeln!(
            out,
            "| {} | **all writes{whose}** | **{:.2}** |",
            phase.name,
            writes as f64 / count as f64
        );
    }
    out
}

/// Prints `report` and writes it as the `heading` section of BENCHMARKS.md: runs on kube-sim
/// with our own binary and the reference driver only. A real cluster's numbers, or a run with
/// another binary, other flags or another driver (`external`), are printed, not recorded.
#[allow(clippy::print_stdout, reason = "the benchmarks report on stdout")]
pub fn record(
    api: &ApiServerUnderTest,
    external: bool,
    heading: &str,
    command: &str,
    report: &str,
) -> anyhow::Result<()> {
    println!("{report}");
    if external {
        println!("not written to BENCHMARKS.md: another binary, flags or driver (BENCH_*)");
    } else if api.sim.is_some() {
        let body = format!("{}\n{report}", benchmarks::machine(command));
        let path = benchmarks::write_section(heading, &body)?;
        println!("written to {}", path.display());
    }
    Ok(())
}

/// A benchmark's `main`: the count from the environment variable `variable` (else
/// `default`), `bench` on a multi-threaded runtime.
pub fn main_with_count<F, Fut>(variable: &str, default: usize, bench: F) -> anyhow::Result<()>
where
    F: FnOnce(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let count = std::env::var(variable)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(count))
}

/// Sends `request(i)` for every `i < count`, `clients` at a time, as concurrent API clients
/// would; returns when each was sent, by the object name `request` returns.
pub async fn timed_requests<F, Fut>(
    count: usize,
    clients: usize,
    request: F,
) -> anyhow::Result<HashMap<String, Instant>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    use futures::StreamExt;
    futures::stream::iter(0..count)
        .map(|i| {
            let sent = request(i);
            async move {
                let at = Instant::now();
                Ok::<_, anyhow::Error>((sent.await?, at))
            }
        })
        .buffer_unordered(clients)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Sorted per-object latencies from `from` to `to`.
pub fn latencies(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = to
        .iter()
        .filter_map(|(name, at)| Some(at.saturating_duration_since(*from.get(name)?)))
        .collect();
    latencies.sort();
    latencies
}

/// A watch past its initial list: from here on every change, deletions included, arrives as
/// an event.
pub async fn listed_watch<K>(
    api: &Api<K>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + use<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut events = Box::pin(watcher::watcher(api.clone(), watcher::Config::default()));
    while let Some(event) = events.next().await {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    events
}

/// Creates `object(i)` through `api` for every `i < count`, `clients` at a time, and waits until
/// the watch of `api` shows each `done` (at most `limit` for each next change, `what` naming the
/// state in the error); the sorted latencies from each create to its object done.
pub async fn create_until<K>(
    api: &Api<K>,
    count: usize,
    clients: usize,
    (limit, what): (Duration, &str),
    object: impl Fn(usize) -> anyhow::Result<K>,
    done: impl Fn(&K) -> bool,
) -> anyhow::Result<Vec<Duration>>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut events = std::pin::pin!(listed_watch(api).await);
    let created = timed_requests(count, clients, |i| {
        let api = api.clone();
        let object = object(i);
        async move {
            let created = api
                .create(&kube::api::PostParams::default(), &object?)
                .await?;
            Ok(created.meta().name.clone().unwrap_or_default())
        }
    })
    .await?;
    let done_at = reached(&mut events, count, what, limit, |event| match event {
        watcher::Event::Apply(object) if done(&object) => object.meta().name.clone(),
        _ => None,
    })
    .await?;
    Ok(latencies(&created, &done_at))
}

/// Deletes `names` through `api`, `clients` at a time, and waits until the watch of `watched`
/// shows each one's stand-in gone (`stands_for`: a watched object's name → the deleted name; at
/// most `limit` for each next deletion); the sorted latencies from each delete to its stand-in
/// gone.
pub async fn delete_until<K, W>(
    api: &Api<K>,
    names: &[String],
    clients: usize,
    limit: Duration,
    watched: &Api<W>,
    stands_for: &HashMap<String, String>,
) -> anyhow::Result<Vec<Duration>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    W: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    W::DynamicType: Default,
{
    let mut events = std::pin::pin!(listed_watch(watched).await);
    let deleted = timed_requests(names.len(), clients, |i| {
        let api = api.clone();
        let name = names[i].clone();
        async move {
            api.delete(&name, &kube::api::DeleteParams::default())
                .await?;
            Ok(name)
        }
    })
    .await?;
    let gone_at = reached(
        &mut events,
        names.len(),
        "deleted",
        limit,
        |event| match event {
            watcher::Event::Delete(object) => stands_for.get(object.meta().name.as_ref()?).cloned(),
            _ => None,
        },
    )
    .await?;
    Ok(latencies(&deleted, &gone_at))
}

/// When each of `count` objects reached the state `done` recognises (by the name it returns),
/// waiting at most `limit` for each next event.
pub async fn reached<K>(
    events: &mut (impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin),
    count: usize,
    what: &str,
    limit: Duration,
    done: impl Fn(watcher::Event<K>) -> Option<String>,
) -> anyhow::Result<HashMap<String, Instant>> {
    let mut at: HashMap<String, Instant> = HashMap::new();
    while at.len() < count {
        let event = tokio::time::timeout(limit, events.next())
            .await
            .with_context(|| format!("{} still not {what}", count - at.len()))?;
        match event {
            Some(Ok(event)) => {
                if let Some(name) = done(event) {
                    at.entry(name).or_insert_with(Instant::now);
                }
            }
            Some(Err(error)) => bail!("watching: {error}"),
            None => bail!("the watch ended"),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_servers_request_total_is_counted_by_verb_and_resource_for_all_clients() {
        let metrics = r#"# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",contentType="application/json",dry_run="",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",contentType="application/json",dry_run="",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",contentType="application/vnd.kubernetes.protobuf",dry_run="",group="",resource="persistentvolumeclaims",scope="namespace",subresource="status",verb="PUT",version="v1"} 3
apiserver_request_total{code="0",component="apiserver",contentType="application/json",dry_run="",group="storage.k8s.io",resource="csinodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_request_duration_seconds_count{verb="POST"} 99
"#;
        let counts = server_request_counts(metrics);
        let get = |verb: &str, resource: &str| {
            counts
                .iter()
                .find(|(k, _)| k.verb == verb && k.resource == resource)
                .map(|(k, n)| {
                    assert_eq!(k.client, ALL_CLIENTS);
                    *n
                })
        };
        assert_eq!(get("create", "events"), Some(8));
        assert_eq!(get("update", "persistentvolumeclaims/status"), Some(3));
        assert_eq!(get("watch", "csinodes"), Some(2));
        assert_eq!(counts.len(), 3);
    }
}

/// The environment variable naming another binary for the sidecar `name`: `BENCH_<SIDECAR>`.
fn variable_of(name: &str) -> String {
    format!(
        "BENCH_{}",
        name.trim_start_matches("csi-")
            .to_uppercase()
            .replace('-', "_")
    )
}

/// The package that builds the binary `name`.
fn package_of(name: &str) -> &str {
    match name {
        "snapshot-controller" => "csi-snapshotter",
        "livenessprobe" => "csi-node-driver-registrar",
        name if name.starts_with("cosi-") => "cosi",
        name => name,
    }
}

/// A sidecar's size in a benchmark report.
#[derive(Debug, Clone, Copy)]
pub struct Footprint<'a> {
    pub sidecar: &'a str,
    /// Peak RSS in MiB, taken before it stopped.
    pub rss: Option<f64>,
    pub binary_mib: f64,
}

/// A sidecar benchmark's report: `intro` (what was run), the phase table (`unit` per second),
/// the sidecar's peak RSS and binary size, and the table of its API requests `per` object.
pub fn sidecar_report(
    intro: &str,
    count: usize,
    unit: &str,
    per: &str,
    phases: &[Phase],
    footprint: Footprint<'_>,
) -> String {
    let Footprint {
        sidecar,
        rss,
        binary_mib,
    } = footprint;
    let mut report = format!("{intro}\n\n");
    report.push_str(&phase_table(count, unit, phases));
    let _ = writeln!(
        report,
        "\nPeak RSS of {sidecar}: {}; binary size: {binary_mib:.1} MiB (release).\n",
        rss.map_or("n/a".to_string(), |r| format!("{r:.1} MiB")),
    );
    report.push_str(&request_table(count, per, phases));
    report
}

/// Serves `crds` (one that exists already is kept) and makes the namespace `namespace`.
pub async fn crds_and_namespace(
    client: &Client,
    crds: Vec<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >,
    namespace: &str,
) -> anyhow::Result<()> {
    use kube::api::PostParams;
    let api = Api::all(client.clone());
    for crd in crds {
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
    }
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}

/// Creates `object` of a custom kind, retrying for up to 30 s while the server does not serve
/// the kind yet (a real server needs a moment to serve a new CRD).
pub async fn create_when_served<K>(api: &Api<K>, object: &K) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(error) = api.create(&kube::api::PostParams::default(), object).await {
        if Instant::now() > deadline {
            bail!("creating {}: {error}", K::kind(&Default::default()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// What a benchmark on the reference driver starts with: a temporary directory named by
/// `prefix`, the API server under test without roles, and the reference driver `driver` with
/// one node `node`, in this process, configured further by `configure`.
pub async fn start_with_reference_driver(
    prefix: &str,
    driver: &str,
    node: &str,
    configure: impl Fn(&mut csi_hostpath::config::Config),
) -> anyhow::Result<(tempfile::TempDir, ApiServerUnderTest, LocalCluster)> {
    let root = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[]).await?;
    let driver = LocalCluster::start(root.path(), &[node], |config| {
        config.driver_name = driver.to_string();
        configure(config);
    })
    .await?;
    Ok((root, api, driver))
}

/// The claims [`volumes_with_pvs`] binds the PVs to: one per PV, of the same name, in
/// `namespace`, of `class` (also the PV's), its status merged with `status` once the PV exists
/// (kube-sim binds nothing unless its pv-binder runs).
#[derive(Debug, Clone)]
pub struct BoundClaims<'a> {
    pub namespace: &'a str,
    pub class: &'a str,
    pub status: serde_json::Value,
}

/// Per index below `count`, `clients` at a time: a 1 MiB volume `name(i)` at the driver and
/// its Retain PV `name(i)` of `driver` (no class without `claims`), and with `claims` a claim
/// bound to it.
pub async fn volumes_with_pvs(
    client: &Client,
    csi: &csi_grpc::conn::CsiConnection,
    driver: &str,
    count: usize,
    clients: usize,
    name: fn(usize) -> String,
    claims: Option<BoundClaims<'_>>,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams, PostParams};
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims = claims.as_ref();
    futures::stream::iter(0..count)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                let volume = csi_hostpath::local::create_plain_volume(
                    csi,
                    &name(i),
                    1 << 20,
                    Duration::from_secs(60),
                )
                .await
                .map_err(|s| anyhow::anyhow!("CreateVolume: {}", s.message()))?;
                let mut pv = serde_json::json!({
                    "metadata": {"name": name(i)},
                    "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": claims.map_or("", |c| c.class),
                        "csi": {"driver": driver, "volumeHandle": volume.volume_id}}});
                let Some(bound) = claims else {
                    pvs.create(&PostParams::default(), &serde_json::from_value(pv)?)
                        .await?;
                    return Ok(());
                };
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(client.clone(), bound.namespace);
                let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name(i)},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": bound.class,
                        "volumeName": name(i), "resources": {"requests": {"storage": "1Mi"}}}}))?;
                let claim = api.create(&PostParams::default(), &claim).await?;
                pv["spec"]["claimRef"] = serde_json::json!({"name": name(i),
                    "namespace": bound.namespace, "uid": claim.meta().uid});
                pvs.create(&PostParams::default(), &serde_json::from_value(pv)?)
                    .await?;
                api.patch_status(
                    &name(i),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": bound.status})),
                )
                .await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(clients)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}
