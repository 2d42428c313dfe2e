//! `make bench`: throughput and latency of the reference driver with 1, 8 and 32 concurrent
//! clients, on a local cluster (a controller and one node instance in this process, each on its
//! Unix socket; every client task shares the instance's one HTTP/2 connection):
//!
//! - CreateVolume + DeleteVolume pairs, with 0, 1000 and 10 000 other volumes in the state
//!   (an operation should cost the same whatever the number of volumes);
//! - the full life of a volume on a node: CreateVolume → ControllerPublishVolume →
//!   NodeStageVolume → NodePublishVolume → NodeUnpublishVolume → NodeUnstageVolume →
//!   ControllerUnpublishVolume → DeleteVolume, with real bind mounts (needs root; skipped
//!   otherwise).
//!
//! Prints the tables and rewrites `BENCHMARKS.md` at the repository root with them, the machine
//! and the command. Nothing here asserts a timing: these are measurements, not tests.
//!
//! `BENCH_CSI_ENDPOINT=/path/to/socket` runs the CreateVolume + DeleteVolume rows against
//! another running driver instead (e.g. csi-driver-host-path's `hostpathplugin --endpoint
//! unix:///tmp/hp.sock`), with the same client and requests; `BENCH_EXISTING=0,1000` picks the
//! numbers of other volumes. Such a run is printed, never written to `BENCHMARKS.md`.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_grpc::conn::CsiConnection;
use csi_hostpath::local::{LocalCluster, base_config};
use csi_proto::csi::v1 as csi;
use tonic::Status;

const COMMAND: &str = "cargo bench -p csi-hostpath --bench driver";
const CLIENTS: [usize; 3] = [1, 8, 32];
/// Volumes that exist (and stay) while the CreateVolume + DeleteVolume rows run.
const EXISTING: [usize; 3] = [0, 1000, 10_000];
/// Clients creating the existing volumes.
const FILLERS: usize = 32;
const NODE: &str = "node-a";
/// Per-call timeout.
const T: Duration = Duration::from_secs(60);
/// No row may run longer than this: clients start no new iteration after it (the row then
/// reports what completed, marked as capped). Keeps `make bench` within about two minutes.
const ROW_BUDGET: Duration = Duration::from_secs(12);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    CreateDelete,
    FullCycle,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Self::CreateDelete => "CreateVolume + DeleteVolume",
            Self::FullCycle => "full cycle (8 RPCs, real bind mounts)",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::CreateDelete => "pair",
            Self::FullCycle => "cycle",
        }
    }

    fn rpcs(self) -> &'static [&'static str] {
        match self {
            Self::CreateDelete => &["CreateVolume", "DeleteVolume"],
            Self::FullCycle => &[
                "CreateVolume",
                "ControllerPublishVolume",
                "NodeStageVolume",
                "NodePublishVolume",
                "NodeUnpublishVolume",
                "NodeUnstageVolume",
                "ControllerUnpublishVolume",
                "DeleteVolume",
            ],
        }
    }

    /// Iterations per client: about the same total work whatever the concurrency, since
    /// every state change serialises on the state file's lock.
    fn iterations(self, clients: usize) -> usize {
        let total: usize = match self {
            Self::CreateDelete => 1000,
            Self::FullCycle => 320,
        };
        total.div_ceil(clients).max(2)
    }
}

/// Latencies by RPC name, plus whole iterations (pairs or cycles).
#[derive(Debug, Default)]
struct Samples {
    iterations: Vec<Duration>,
    rpcs: BTreeMap<&'static str, Vec<Duration>>,
}

impl Samples {
    fn merge(&mut self, other: Self) {
        self.iterations.extend(other.iterations);
        for (rpc, mut durations) in other.rpcs {
            self.rpcs.entry(rpc).or_default().append(&mut durations);
        }
    }
}

#[derive(Debug)]
struct Row {
    workload: Workload,
    clients: usize,
    /// Other volumes in the state meanwhile.
    existing: usize,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    Skipped(&'static str),
    Measured {
        seconds: f64,
        capped: bool,
        samples: Samples,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench FAILED: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let root_user = rustix::process::geteuid().is_root();
    let dir = tempfile::Builder::new()
        .prefix("csi-bench-")
        .tempdir()
        .context("creating the bench's temporary directory")?;
    let root = dir.path().to_path_buf();
    let fsync = fsync_floor(&root).context("measuring the fsync floor")?;
    let external = std::env::var_os("BENCH_CSI_ENDPOINT").map(PathBuf::from);
    let existing_counts = match std::env::var("BENCH_EXISTING") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .context("BENCH_EXISTING: numbers separated by commas")?,
        Err(_) => EXISTING.to_vec(),
    };
    let cluster = match &external {
        Some(_) => None,
        None => Some(
            LocalCluster::start(&root, &[NODE], |c| {
                c.capacity = [(String::new(), 1 << 50)].into();
            })
            .await
            .context("starting the driver instances")?,
        ),
    };
    let bench = match (&cluster, &external) {
        (Some(cluster), _) => Bench {
            controller: cluster.controller.csi.clone(),
            node: Some(NodeSide {
                csi: cluster.node(NODE).csi.clone(),
                kubelet: cluster.kubelet_dir(NODE),
            }),
            topology_key: base_config(&root).topology_key(),
        },
        (None, Some(socket)) => Bench {
            controller: connect_external(socket).await?,
            node: None,
            topology_key: String::new(),
        },
        (None, None) => unreachable!("either a local cluster or an external driver"),
    };

    println!("warming up…");
    let mut rows = Vec::new();
    let result = async {
        bench.row(Workload::CreateDelete, 1, 5).await?;
        if root_user && bench.node.is_some() {
            bench.row(Workload::FullCycle, 1, 3).await?;
        }
        for clients in CLIENTS {
            let workload = Workload::FullCycle;
            let outcome = if external.is_some() {
                Outcome::Skipped("an external driver: CreateVolume + DeleteVolume only")
            } else if root_user {
                bench
                    .row(workload, clients, workload.iterations(clients))
                    .await?
            } else {
                Outcome::Skipped("needs root (real mounts)")
            };
            let row = Row {
                workload,
                clients,
                existing: 0,
                outcome,
            };
            println!("{}", summary_line(&row));
            rows.push(row);
        }
        let mut existing = 0;
        for target in existing_counts.iter().copied() {
            println!("creating volumes until {target} exist…");
            bench.fill(existing, target).await?;
            existing = target;
            for clients in CLIENTS {
                let workload = Workload::CreateDelete;
                let outcome = bench
                    .row(workload, clients, workload.iterations(clients))
                    .await?;
                let row = Row {
                    workload,
                    clients,
                    existing,
                    outcome,
                };
                println!("{}", summary_line(&row));
                rows.push(row);
            }
        }
        anyhow::Ok(())
    }
    .await;
    if let Some(cluster) = cluster {
        cluster.stop().await;
    }
    result?;
    let leftovers: Vec<PathBuf> = csi_hostpath::mounts::mount_points()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.starts_with(&root))
        .collect();
    if !leftovers.is_empty() {
        let kept = dir.keep();
        return Err(anyhow!(
            "mounts left under {}: {leftovers:?} (directory kept)",
            kept.display()
        ));
    }
    dir.close()
        .context("removing the bench's temporary directory")?;

    let machine = Machine::read(&root, fsync);
    let results = results_table(&rows);
    let breakdown = breakdown_table(&rows);
    println!("\n{results}\n{breakdown}");
    if external.is_some() || existing_counts != EXISTING {
        println!("(another driver or other volume counts: BENCHMARKS.md is left as it is)");
        return Ok(());
    }
    let report = report(&machine, &results, &breakdown);
    // The repository root: two levels above this crate.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = manifest_dir
        .ancestors()
        .nth(2)
        .unwrap_or(manifest_dir)
        .join("BENCHMARKS.md");
    // Sections this benchmark does not write (the summary above them, kube-sim's below) stay
    // as and where they are.
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    let (above, below) = foreign_sections(&existing);
    let own = OWN_SECTIONS[0];
    let report = match report.split_once(&format!("\n{own}\n")) {
        Some((intro, rest)) => format!(
            "{}{above}\n\n{own}\n{}{below}",
            intro.trim_end(),
            rest.trim_end()
        ),
        None => format!("{}{above}{below}", report.trim_end()),
    };
    std::fs::write(&path, report).with_context(|| format!("writing {}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

/// The `## ` sections this benchmark writes, in order.
const OWN_SECTIONS: [&str; 4] = [
    "## What is measured",
    "## Machine",
    "## Throughput",
    "## Latency per RPC",
];

/// The `## ` sections of `existing` this benchmark does not write, each after a blank line:
/// those above its own and those below them.
fn foreign_sections(existing: &str) -> (String, String) {
    let mut above: Vec<Vec<&str>> = Vec::new();
    let mut below: Vec<Vec<&str>> = Vec::new();
    let mut own_seen = false;
    let mut keeping = false;
    for line in existing.lines() {
        if line.starts_with("## ") {
            let own = OWN_SECTIONS.contains(&line.trim_end());
            own_seen |= own;
            keeping = !own;
            if keeping {
                let sections = if own_seen { &mut below } else { &mut above };
                sections.push(Vec::new());
            }
        }
        let sections = if own_seen { &mut below } else { &mut above };
        if keeping && let Some(section) = sections.last_mut() {
            section.push(line);
        }
    }
    let joined = |sections: &[Vec<&str>]| -> String {
        sections
            .iter()
            .map(|lines| format!("\n\n{}", lines.join("\n").trim_end()))
            .collect()
    };
    (joined(&above), joined(&below))
}

struct Bench {
    controller: CsiConnection,
    /// The node instance (none for an external driver: its node side is not exercised).
    node: Option<NodeSide>,
    topology_key: String,
}

struct NodeSide {
    csi: CsiConnection,
    kubelet: PathBuf,
}

/// A connection to the controller of a driver this benchmark did not start.
async fn connect_external(socket: &Path) -> Result<CsiConnection> {
    let endpoint = csi_grpc::conn::Endpoint::from_path(socket)
        .with_context(|| format!("BENCH_CSI_ENDPOINT {}", socket.display()))?;
    let csi = csi_grpc::conn::connect(
        &endpoint,
        T,
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .with_context(|| format!("connecting to {}", socket.display()))?;
    csi.probe_until_ready(T)
        .await
        .with_context(|| format!("probing {}", socket.display()))?;
    Ok(csi)
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench").finish_non_exhaustive()
    }
}

fn rpc<T>(result: Result<T, Status>, what: &str, name: &str) -> Result<T> {
    result.map_err(|s| anyhow!("{what} {name}: {:?}: {}", s.code(), s.message()))
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// Times one call into `samples`.
async fn timed<T>(
    samples: &mut Samples,
    rpc_name: &'static str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let started = Instant::now();
    let result = call.await;
    samples
        .rpcs
        .entry(rpc_name)
        .or_default()
        .push(started.elapsed());
    result
}

impl Bench {
    /// Creates volumes `existing..target` (named `existing-<n>`), [`FILLERS`] at a time.
    async fn fill(&self, existing: usize, target: usize) -> Result<()> {
        let mut tasks = Vec::new();
        for filler in 0..FILLERS {
            let controller = self.controller.clone();
            tasks.push(tokio::spawn(async move {
                for n in (existing + filler..target).step_by(FILLERS) {
                    let name = format!("existing-{n}");
                    rpc(
                        controller
                            .create_volume(create_request(&name, None), T)
                            .await,
                        "CreateVolume",
                        &name,
                    )?;
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await.context("bench filler panicked")??;
        }
        Ok(())
    }

    /// Runs `clients` concurrent clients of `iterations` each (within [`ROW_BUDGET`]).
    async fn row(&self, workload: Workload, clients: usize, iterations: usize) -> Result<Outcome> {
        let started = Instant::now();
        let deadline = started + ROW_BUDGET;
        let tag = format!("{}-{clients}-{}", workload.unit(), nanos());
        let mut tasks = Vec::new();
        for client in 0..clients {
            let controller = self.controller.clone();
            let node = self
                .node
                .as_ref()
                .map(|n| (n.csi.clone(), n.kubelet.clone()));
            let key = self.topology_key.clone();
            let tag = tag.clone();
            tasks.push(tokio::spawn(async move {
                let mut samples = Samples::default();
                let mut capped = false;
                for i in 0..iterations {
                    if Instant::now() >= deadline {
                        capped = true;
                        break;
                    }
                    let name = format!("{tag}-{client}-{i}");
                    let begun = Instant::now();
                    match workload {
                        Workload::CreateDelete => {
                            create_delete(&controller, &name, &mut samples).await?;
                        }
                        Workload::FullCycle => {
                            let (node, kubelet) = node
                                .as_ref()
                                .context("a full cycle needs the node instance")?;
                            full_cycle(&controller, node, kubelet, &key, &name, &mut samples)
                                .await?;
                        }
                    }
                    samples.iterations.push(begun.elapsed());
                }
                anyhow::Ok((samples, capped))
            }));
        }
        let mut samples = Samples::default();
        let mut capped = false;
        for task in tasks {
            let (client, client_capped) = task.await.context("bench client panicked")??;
            samples.merge(client);
            capped |= client_capped;
        }
        Ok(Outcome::Measured {
            seconds: started.elapsed().as_secs_f64(),
            capped,
            samples,
        })
    }
}

fn create_request(name: &str, key: Option<&str>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        accessibility_requirements: key.map(|key| csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: [(key.to_string(), NODE.to_string())].into(),
            }],
            preferred: vec![],
        }),
        ..Default::default()
    }
}

async fn create_delete(csi: &CsiConnection, name: &str, samples: &mut Samples) -> Result<()> {
    let volume = rpc(
        timed(
            samples,
            "CreateVolume",
            csi.create_volume(create_request(name, None), T),
        )
        .await,
        "CreateVolume",
        name,
    )?
    .volume
    .context("CreateVolume returned no volume")?;
    rpc(
        timed(
            samples,
            "DeleteVolume",
            csi.delete_volume(
                csi::DeleteVolumeRequest {
                    volume_id: volume.volume_id,
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "DeleteVolume",
        name,
    )?;
    Ok(())
}

async fn full_cycle(
    controller: &CsiConnection,
    node: &CsiConnection,
    kubelet: &Path,
    key: &str,
    name: &str,
    samples: &mut Samples,
) -> Result<()> {
    let volume_id = rpc(
        timed(
            samples,
            "CreateVolume",
            controller.create_volume(create_request(name, Some(key)), T),
        )
        .await,
        "CreateVolume",
        name,
    )?
    .volume
    .context("CreateVolume returned no volume")?
    .volume_id;
    let published = rpc(
        timed(
            samples,
            "ControllerPublishVolume",
            controller.controller_publish_volume(
                csi::ControllerPublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    node_id: NODE.into(),
                    volume_capability: Some(capability()),
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "ControllerPublishVolume",
        name,
    )?;
    // As the kubelet does: it creates the staging directory and removes it after unstaging.
    let staging = kubelet.join("staging").join(name);
    let target = kubelet.join("pods").join(name).join("mount");
    tokio::fs::create_dir_all(&staging)
        .await
        .with_context(|| format!("creating {}", staging.display()))?;
    let staging_path = staging.display().to_string();
    let target_path = target.display().to_string();
    rpc(
        timed(
            samples,
            "NodeStageVolume",
            node.node_stage_volume(
                csi::NodeStageVolumeRequest {
                    volume_id: volume_id.clone(),
                    publish_context: published.publish_context.clone(),
                    staging_target_path: staging_path.clone(),
                    volume_capability: Some(capability()),
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "NodeStageVolume",
        name,
    )?;
    rpc(
        timed(
            samples,
            "NodePublishVolume",
            node.node_publish_volume(
                csi::NodePublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    publish_context: published.publish_context,
                    staging_target_path: staging_path.clone(),
                    target_path: target_path.clone(),
                    volume_capability: Some(capability()),
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "NodePublishVolume",
        name,
    )?;
    rpc(
        timed(
            samples,
            "NodeUnpublishVolume",
            node.node_unpublish_volume(
                csi::NodeUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    target_path,
                },
                T,
            ),
        )
        .await,
        "NodeUnpublishVolume",
        name,
    )?;
    rpc(
        timed(
            samples,
            "NodeUnstageVolume",
            node.node_unstage_volume(
                csi::NodeUnstageVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path: staging_path,
                },
                T,
            ),
        )
        .await,
        "NodeUnstageVolume",
        name,
    )?;
    tokio::fs::remove_dir(&staging)
        .await
        .with_context(|| format!("removing {}", staging.display()))?;
    let _ = tokio::fs::remove_dir(kubelet.join("pods").join(name)).await;
    rpc(
        timed(
            samples,
            "ControllerUnpublishVolume",
            controller.controller_unpublish_volume(
                csi::ControllerUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    node_id: NODE.into(),
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "ControllerUnpublishVolume",
        name,
    )?;
    rpc(
        timed(
            samples,
            "DeleteVolume",
            controller.delete_volume(
                csi::DeleteVolumeRequest {
                    volume_id,
                    ..Default::default()
                },
                T,
            ),
        )
        .await,
        "DeleteVolume",
        name,
    )?;
    Ok(())
}

/// Mean time of one state commit as the driver's store makes it (append a 1 KiB line to the
/// state file and fdatasync it), on the filesystem the driver's state lives on: the floor
/// under every state-changing RPC.
fn fsync_floor(root: &Path) -> std::io::Result<Duration> {
    let dir = root.join("fsync-probe");
    std::fs::create_dir_all(&dir)?;
    let mut line = vec![b'x'; 1023];
    line.push(b'\n');
    let mut file = std::fs::File::create(dir.join("state.log"))?;
    let rounds = 200;
    let started = Instant::now();
    for _ in 0..rounds {
        file.write_all(&line)?;
        file.sync_data()?;
    }
    let elapsed = started.elapsed() / rounds;
    std::fs::remove_dir_all(&dir)?;
    Ok(elapsed)
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn sorted(durations: &[Duration]) -> Vec<Duration> {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted
}

fn summary_line(row: &Row) -> String {
    match &row.outcome {
        Outcome::Skipped(why) => format!(
            "{} × {} client{}: skipped, {why}",
            row.workload.label(),
            row.clients,
            plural(row.clients)
        ),
        Outcome::Measured {
            seconds, samples, ..
        } => format!(
            "{} × {} client{} ({} other volumes): {} {}s in {seconds:.2} s",
            row.workload.label(),
            row.clients,
            plural(row.clients),
            row.existing,
            samples.iterations.len(),
            row.workload.unit()
        ),
    }
}

fn results_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| operation | other volumes | clients | total ops | RPCs | seconds | ops/s | RPCs/s | p50 per op | p99 per op |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let label = format!("{} ({}s)", row.workload.label(), row.workload.unit());
        match &row.outcome {
            Outcome::Skipped(why) => {
                let _ = writeln!(
                    out,
                    "| {label} | {} | {} | skipped: {why} | | | | | | |",
                    row.existing, row.clients
                );
            }
            Outcome::Measured {
                seconds,
                capped,
                samples,
            } => {
                let ops = samples.iterations.len();
                let rpcs: usize = samples.rpcs.values().map(Vec::len).sum();
                let by_op = sorted(&samples.iterations);
                let note = if *capped {
                    format!(" (capped at {} s)", ROW_BUDGET.as_secs())
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "| {label} | {} | {} | {ops}{note} | {rpcs} | {seconds:.2} | {:.1} | {:.1} | {} | {} |",
                    row.existing,
                    row.clients,
                    ops as f64 / seconds,
                    rpcs as f64 / seconds,
                    ms(percentile(&by_op, 50.0)),
                    ms(percentile(&by_op, 99.0)),
                );
            }
        }
    }
    out
}

/// p50 / p99 of each RPC, one column per client count.
fn breakdown_table(rows: &[Row]) -> String {
    let mut out = String::from("| operation | other volumes | RPC |");
    for clients in CLIENTS {
        let _ = write!(out, " {clients} client{} p50 / p99 |", plural(clients));
    }
    out.push_str("\n|---|---:|---|");
    for _ in CLIENTS {
        out.push_str("---:|");
    }
    out.push('\n');
    let mut runs: Vec<(Workload, usize)> = rows.iter().map(|r| (r.workload, r.existing)).collect();
    runs.sort_by_key(|(workload, existing)| (*workload == Workload::FullCycle, *existing));
    runs.dedup();
    for (workload, existing) in runs {
        for rpc_name in workload.rpcs() {
            let _ = write!(out, "| {} | {existing} | {rpc_name} |", workload.label());
            for clients in CLIENTS {
                let cell = rows
                    .iter()
                    .find(|r| {
                        r.workload == workload && r.clients == clients && r.existing == existing
                    })
                    .and_then(|r| match &r.outcome {
                        Outcome::Measured { samples, .. } => samples.rpcs.get(rpc_name),
                        Outcome::Skipped(_) => None,
                    })
                    .map_or_else(
                        || "skipped".to_string(),
                        |durations| {
                            let s = sorted(durations);
                            format!(
                                "{} / {}",
                                ms(percentile(&s, 50.0)),
                                ms(percentile(&s, 99.0))
                            )
                        },
                    );
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// What the numbers were measured on.
#[derive(Debug)]
struct Machine {
    date: String,
    cpus: String,
    cpu_model: String,
    memory: String,
    kernel: String,
    filesystem: String,
    fsync: Duration,
    commit: String,
}

impl Machine {
    fn read(root: &Path, fsync: Duration) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (key, value) = l.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let logical = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let nproc = std::thread::available_parallelism().map_or(0, usize::from);
        let cpus = if logical > 0 && logical != nproc {
            format!("{nproc} usable of {logical}")
        } else {
            nproc.to_string()
        };
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                Some(format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0)))
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/version")
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Self {
            date: utc_now(),
            cpus,
            cpu_model,
            memory,
            kernel,
            filesystem: filesystem_of(root),
            fsync,
            commit: commit(),
        }
    }
}

/// The filesystem type and source of the mount holding `path` (the longest mount point that
/// is a prefix of it).
fn filesystem_of(path: &Path) -> String {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = Path::new(fields.get(4)?);
            let dash = fields.iter().position(|f| *f == "-")?;
            let fs_type = fields.get(dash + 1)?;
            let source = fields.get(dash + 2)?;
            path.starts_with(mount_point).then(|| {
                (
                    mount_point.components().count(),
                    format!("{fs_type} on {source}"),
                )
            })
        })
        .max_by_key(|(depth, _)| *depth)
        .map_or_else(|| "unknown".into(), |(_, fs)| fs)
}

fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{hash} with uncommitted changes")
            } else {
                hash
            }
        }
        None => "unknown".into(),
    }
}

/// `YYYY-MM-DD HH:MM UTC`, from the system clock (civil-from-days, proleptic Gregorian).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

fn report(machine: &Machine, results: &str, breakdown: &str) -> String {
    format!(
        r"# Benchmarks

Generated by `make bench` (`{COMMAND}`, a release build); every run rewrites its sections; `make bench` also runs `cargo bench -p kube-sim --bench apiserver`, which rewrites the kube-sim section.
Nothing asserts a timing anywhere: these are measurements on the machine below, not goals.

## What is measured

The reference driver (`csi-hostpath`) on a local cluster (`csi_hostpath::local`): a controller
instance and one node instance in the bench process, each serving gRPC on its own Unix socket,
sharing one state directory in a fresh temporary directory. The clients are tokio tasks in the
same process (client and driver share its CPUs), all multiplexed over each instance's one
HTTP/2 connection, each working on volumes of its own:

- **CreateVolume + DeleteVolume**: one op is a pair (filesystem volume, 1 GiB, no topology),
  with 0, 1000 and 10 000 other volumes in the state (created before the rows, and kept).
- **full cycle**: one op is CreateVolume (topology: node-a) → ControllerPublishVolume →
  NodeStageVolume → NodePublishVolume → NodeUnpublishVolume → NodeUnstageVolume →
  ControllerUnpublishVolume → DeleteVolume, with real bind mounts (needs root, else skipped).
  The client also creates and removes the staging directory, as the kubelet does.

Each client runs a fixed number of ops (about the same total per row whatever the
concurrency); a row stops starting new ops after {budget} s and is then marked capped.
Latencies are per op (pair or cycle) and per RPC as the client sees them, nearest-rank
percentiles. Every state change is one transaction under an exclusive `flock`: catch up on
what other instances appended to `state.log`, apply the change, append the rows it changed as
one line and fdatasync it (the file is compacted when its changes outgrow the whole state);
so state changes serialise across all instances and the commit floor below bounds them: a pair
is 4 transactions, a full cycle 10.

## Machine

- date: {date}
- commit: {commit}
- CPUs (`nproc`): {cpus}, {cpu_model}
- memory: {memory}
- kernel: {kernel}
- state directory filesystem: {filesystem}
- commit floor: appending one 1 KiB line to a file and fdatasyncing it takes {fsync} here
  (mean of 200)
- command: `make bench`, which runs `{COMMAND}`

## Throughput

{results}
## Latency per RPC

{breakdown}",
        budget = ROW_BUDGET.as_secs(),
        date = machine.date,
        commit = machine.commit,
        cpus = machine.cpus,
        cpu_model = machine.cpu_model,
        memory = machine.memory,
        kernel = machine.kernel,
        filesystem = machine.filesystem,
        fsync = ms(machine.fsync),
    )
}
