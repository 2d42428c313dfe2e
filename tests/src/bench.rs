//! What the sidecar benchmarks (`tests/benches/`) share: the API server under test (kube-sim
//! or `KUBECONFIG`), the release sidecar binary as its own process, its peak RSS and time in
//! the driver, API requests per object counted by kube-sim per client, and the report tables.
//! Nothing here asserts a timing.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::Client;
use kube_sim::apiserver::RequestCounts;
use kube_sim::roles::{Role, Timing};

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

    /// kube-sim's request counts (`None` on a real cluster).
    pub fn counts(&self) -> Option<RequestCounts> {
        self.sim.as_ref().map(kube_sim::ApiServer::request_counts)
    }
}

/// A release sidecar binary running as its own process, logging to a file.
#[derive(Debug)]
pub struct SidecarProcess {
    pub binary: PathBuf,
    pub metrics_address: std::net::SocketAddr,
    child: std::process::Child,
    log: PathBuf,
}

impl SidecarProcess {
    /// Starts `name` (beside this benchmark's profile directory) with `args`, the kubeconfig
    /// and an `--http-endpoint`; returns once it has opened `watches` watches (kube-sim), or
    /// after 5 s on a real cluster.
    pub async fn start(
        name: &str,
        args: &[String],
        api: &ApiServerUnderTest,
        root: &Path,
        watches: usize,
    ) -> anyhow::Result<Self> {
        let binary = kube_sim::benchmarks::release_binary(name, name)?;
        let metrics_address = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = root.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = std::process::Command::new(&binary)
            .args(args)
            .arg(format!("--kubeconfig={}", api.kubeconfig.display()))
            .arg(format!("--http-endpoint={metrics_address}"))
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = Self {
            binary,
            metrics_address,
            child,
            log,
        };
        let started = Instant::now();
        while let Some(current) = api.counts() {
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
        Ok(process)
    }

    /// The peak resident set (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        kube_sim::benchmarks::peak_rss_mib(self.child.id())
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

    /// Mean latency of each of `methods` (`CreateVolume`) from its
    /// `csi_sidecar_operations_seconds`.
    pub async fn driver_latencies(&self, methods: &[&str]) -> Option<String> {
        let (_, text) = kube_sim::harness::http_get(self.metrics_address, "/metrics").await?;
        let value = |suffix: &str, method: &str| -> Option<f64> {
            text.lines()
                .filter(|l| l.starts_with(&format!("csi_sidecar_operations_seconds_{suffix}{{")))
                .filter(|l| l.contains(&format!("/csi.v1.Controller/{method}\"")))
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

/// One measured phase: how long, per-object latencies, and the sidecar's API requests.
#[derive(Debug)]
pub struct Phase {
    pub name: &'static str,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    pub requests: Option<BTreeMap<String, u64>>,
}

/// `client`'s requests between two snapshots of the counts, by "verb resource".
pub fn client_requests(
    client: &str,
    before: Option<RequestCounts>,
    after: Option<RequestCounts>,
) -> Option<BTreeMap<String, u64>> {
    let (before, after) = (before?, after?);
    Some(
        after
            .iter()
            .filter(|(key, _)| key.client == client)
            .filter_map(|(key, count)| {
                let earlier = before.get(key).copied().unwrap_or(0);
                (count > &earlier)
                    .then(|| (format!("{} {}", key.verb, key.resource), count - earlier))
            })
            .collect(),
    )
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
            let _ = writeln!(
                out,
                "| {} | (not counted on a real cluster) | |",
                phase.name
            );
            continue;
        };
        let mut writes = 0;
        for (request, n) in requests {
            if request.starts_with("watch ") {
                let _ = writeln!(out, "| {} | {request} | {n} in all |", phase.name);
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
                "| {} | {request} | {:.2} |",
                phase.name,
                *n as f64 / count as f64
            );
        }
        let _ = writeln!(
            out,
            "| {} | **all writes** | **{:.2}** |",
            phase.name,
            writes as f64 / count as f64
        );
    }
    out
}

/// Prints `report` and writes it as the `heading` section of BENCHMARKS.md (kube-sim runs
/// only: a real cluster's numbers are printed, not recorded).
#[allow(clippy::print_stdout, reason = "the benchmarks report on stdout")]
pub fn record(
    api: &ApiServerUnderTest,
    heading: &str,
    command: &str,
    report: &str,
) -> anyhow::Result<()> {
    println!("{report}");
    if api.sim.is_some() {
        let body = format!("{}\n{report}", kube_sim::benchmarks::machine(command));
        let path = kube_sim::benchmarks::write_section(heading, &body)?;
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
