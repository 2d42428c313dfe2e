//! `make demo`: the reference driver on a simulated two-node cluster in this process, with real
//! bind mounts, walking one volume through its life: provision it, publish it on node-a and
//! write to it, snapshot it and restore the snapshot on node-b, fence node-a while a process
//! there is still writing, move the volume to node-b with its data, and clean everything up.
//!
//! Needs root (the node instances really mount). Everything lives in a temporary directory
//! that is removed at the end; any failure is reported and makes the demo exit non-zero.

#![allow(clippy::print_stdout, reason = "the demo narrates on stdout")]

use std::fmt::Display;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_grpc::conn::CsiConnection;
use csi_hostpath::local::{LocalCluster, base_config};
use csi_hostpath::mounts;
use csi_proto::csi::v1 as csi;
use tokio::process::{Child, Command};
use tonic::{Code, Status};

/// Timeout of every CSI call.
const T: Duration = Duration::from_secs(30);
const GI: i64 = 1 << 30;
const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
/// Numbered steps of the story (checked at the end).
const STEPS: usize = 34;
/// Fencing must stop every writer of an unpublished node within this bound.
const FENCE_BOUND: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> ExitCode {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "make demo needs root: the driver's node instances make real bind mounts. \
             Run it as root."
        );
        return ExitCode::FAILURE;
    }
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\ndemo FAILED: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("csi-demo-")
        .tempdir()
        .context("creating the demo's temporary directory")?;
    let root = dir.path().to_path_buf();
    let cluster = LocalCluster::start(&root, &[NODE_A, NODE_B], |c| {
        c.capacity = [(String::new(), 10 << 30)].into();
    })
    .await
    .context("starting the driver instances")?;
    println!(
        "csi-hostpath demo: a controller instance and node instances {NODE_A} and {NODE_B} \
         (10 GiB each), in this process"
    );
    println!(
        "root {} (state/ = driver state and volume data, kubelet/<node>/ = staging and target paths)",
        root.display()
    );

    let mut narrator = Narrator::new(&root);
    let mut writer = None;
    let told = story(&cluster, &mut narrator, &mut writer).await;

    // Whatever happened: no writer left behind, no mount left behind, instances stopped.
    if let Some(mut child) = writer {
        let _ = child.kill().await;
    }
    let leftovers = mounts_under(&root);
    let mut unmount_failures = Vec::new();
    for path in &leftovers {
        if let Err(error) = mounts::unmount_all(path) {
            unmount_failures.push(format!("{}: {error}", path.display()));
        }
    }
    cluster.stop().await;
    if !unmount_failures.is_empty() {
        let kept = dir.keep();
        bail!(
            "{}; could not unmount {} (left {} in place)",
            told.err()
                .map_or_else(|| "demo finished".into(), |e| format!("{e:#}")),
            unmount_failures.join(", "),
            kept.display()
        );
    }
    told?;
    dir.close()
        .with_context(|| format!("removing {}", root.display()))?;
    narrator.done(
        "stop the cluster, remove the temporary directory",
        "every instance stopped, nothing left on disk",
    );
    ensure!(
        narrator.step == STEPS,
        "the demo told {} steps, not {STEPS}",
        narrator.step
    );
    println!("\ndemo complete: every CSI call answered as expected, nothing left behind.");
    Ok(())
}

/// Prints numbered steps, each with the time it took.
#[derive(Debug)]
struct Narrator {
    root: PathBuf,
    step: usize,
    mark: Instant,
}

impl Narrator {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            step: 0,
            mark: Instant::now(),
        }
    }

    fn section(&mut self, title: &str) {
        println!("\n── {title} ──");
        self.mark = Instant::now();
    }

    /// One finished step: what was called (or done) and its result.
    fn done(&mut self, what: &str, result: impl Display) {
        self.step += 1;
        println!(
            "[{:>2}/{STEPS}] {what} → {result} ({})",
            self.step,
            millis(self.mark.elapsed())
        );
        self.mark = Instant::now();
    }

    /// Extra lines under a step.
    fn detail(&self, line: impl Display) {
        println!("        {line}");
    }

    /// A path shown relative to the demo root.
    fn path(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .map_or_else(|_| path.display().to_string(), |p| p.display().to_string())
    }
}

fn millis(elapsed: Duration) -> String {
    let ms = elapsed.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// `FAILED_PRECONDITION` rather than `FailedPrecondition`: the spelling of the CSI spec.
fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// A failed CSI call as an error naming the call, the code and the driver's message.
fn rpc<T>(result: Result<T, Status>, what: &str) -> Result<T> {
    result.map_err(|status| {
        anyhow!(
            "{what}: {} ({})",
            code_name(status.code()),
            status.message()
        )
    })
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn topology(key: &str, node: &str) -> csi::Topology {
    csi::Topology {
        segments: [(key.to_string(), node.to_string())].into(),
    }
}

/// Mount points at or under `root`, deepest first.
fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts::mount_points()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Where a volume is on one node, as the kubelet would lay it out.
#[derive(Debug, Clone)]
struct Placement {
    node: &'static str,
    volume_id: String,
    name: &'static str,
    staging: PathBuf,
    target: PathBuf,
}

impl Placement {
    fn new(
        cluster: &LocalCluster,
        node: &'static str,
        pod: &str,
        volume_id: &str,
        name: &'static str,
    ) -> Self {
        let kubelet = cluster.kubelet_dir(node);
        Self {
            node,
            volume_id: volume_id.to_string(),
            name,
            staging: kubelet.join("staging").join(name),
            target: kubelet.join("pods").join(pod).join("volumes").join(name),
        }
    }

    fn csi<'a>(&self, cluster: &'a LocalCluster) -> &'a CsiConnection {
        &cluster.node(self.node).csi
    }
}

/// ControllerPublishVolume, NodeStageVolume and NodePublishVolume: three steps.
async fn attach(cluster: &LocalCluster, n: &mut Narrator, at: &Placement) -> Result<()> {
    let (node, name) = (at.node, at.name);
    let published = rpc(
        cluster
            .controller
            .csi
            .controller_publish_volume(
                csi::ControllerPublishVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    node_id: node.into(),
                    volume_capability: Some(capability()),
                    ..Default::default()
                },
                T,
            )
            .await,
        &format!("ControllerPublishVolume {name} → {node}"),
    )?;
    let mut context: Vec<_> = published.publish_context.iter().collect();
    context.sort();
    n.done(
        &format!("ControllerPublishVolume {name} → {node}"),
        format!("attached, publish_context {context:?}"),
    );

    // The kubelet creates the staging directory; the driver creates the target itself.
    std::fs::create_dir_all(&at.staging)
        .with_context(|| format!("creating {}", at.staging.display()))?;
    rpc(
        at.csi(cluster)
            .node_stage_volume(
                csi::NodeStageVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    publish_context: published.publish_context.clone(),
                    staging_target_path: at.staging.display().to_string(),
                    volume_capability: Some(capability()),
                    ..Default::default()
                },
                T,
            )
            .await,
        &format!("NodeStageVolume {name} on {node}"),
    )?;
    n.done(
        &format!("NodeStageVolume {name} on {node}"),
        format!("staged (bind mount) at {}", n.path(&at.staging)),
    );

    rpc(
        at.csi(cluster)
            .node_publish_volume(
                csi::NodePublishVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    publish_context: published.publish_context,
                    staging_target_path: at.staging.display().to_string(),
                    target_path: at.target.display().to_string(),
                    volume_capability: Some(capability()),
                    readonly: false,
                    ..Default::default()
                },
                T,
            )
            .await,
        &format!("NodePublishVolume {name} on {node}"),
    )?;
    n.done(
        &format!("NodePublishVolume {name} on {node}"),
        format!("published at {}", n.path(&at.target)),
    );
    Ok(())
}

async fn node_unpublish(cluster: &LocalCluster, n: &mut Narrator, at: &Placement) -> Result<()> {
    let what = format!("NodeUnpublishVolume {} on {}", at.name, at.node);
    rpc(
        at.csi(cluster)
            .node_unpublish_volume(
                csi::NodeUnpublishVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    target_path: at.target.display().to_string(),
                },
                T,
            )
            .await,
        &what,
    )?;
    ensure!(
        !at.target.exists(),
        "{what}: target {} still exists",
        at.target.display()
    );
    n.done(
        &what,
        format!("unmounted and removed {}", n.path(&at.target)),
    );
    Ok(())
}

async fn node_unstage(cluster: &LocalCluster, n: &mut Narrator, at: &Placement) -> Result<()> {
    let what = format!("NodeUnstageVolume {} on {}", at.name, at.node);
    rpc(
        at.csi(cluster)
            .node_unstage_volume(
                csi::NodeUnstageVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    staging_target_path: at.staging.display().to_string(),
                },
                T,
            )
            .await,
        &what,
    )?;
    ensure!(
        !mounts::is_mount_point(&at.staging)?,
        "{what}: {} is still a mount point",
        at.staging.display()
    );
    // The kubelet removes the staging directory it created.
    std::fs::remove_dir(&at.staging)
        .with_context(|| format!("removing {}", at.staging.display()))?;
    n.done(&what, format!("unmounted {}", n.path(&at.staging)));
    Ok(())
}

async fn controller_unpublish(
    cluster: &LocalCluster,
    n: &mut Narrator,
    at: &Placement,
    result: &str,
) -> Result<()> {
    let what = format!("ControllerUnpublishVolume {} from {}", at.name, at.node);
    rpc(
        cluster
            .controller
            .csi
            .controller_unpublish_volume(
                csi::ControllerUnpublishVolumeRequest {
                    volume_id: at.volume_id.clone(),
                    node_id: at.node.into(),
                    ..Default::default()
                },
                T,
            )
            .await,
        &what,
    )?;
    n.done(&what, result);
    Ok(())
}

async fn story(cluster: &LocalCluster, n: &mut Narrator, writer: &mut Option<Child>) -> Result<()> {
    let controller = &cluster.controller.csi;
    let key = base_config(&cluster.root).topology_key();

    n.section("provision a volume and use it on node-a");
    let created = rpc(
        controller
            .create_volume(
                csi::CreateVolumeRequest {
                    name: "demo-data".into(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: GI,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![capability()],
                    accessibility_requirements: Some(csi::TopologyRequirement {
                        requisite: vec![topology(&key, NODE_A), topology(&key, NODE_B)],
                        preferred: vec![topology(&key, NODE_A)],
                    }),
                    ..Default::default()
                },
                T,
            )
            .await,
        "CreateVolume demo-data",
    )?
    .volume
    .context("CreateVolume demo-data returned no volume")?;
    let accessible: Vec<&str> = created
        .accessible_topology
        .iter()
        .filter_map(|t| t.segments.get(&key).map(String::as_str))
        .collect();
    n.done(
        "CreateVolume demo-data (mount, 1 GiB, requisite node-a+node-b, preferred node-a)",
        format!(
            "volume {}… of {} GiB, accessible from {accessible:?}",
            short(&created.volume_id),
            created.capacity_bytes / GI
        ),
    );
    let data_a = Placement::new(cluster, NODE_A, "app-1", &created.volume_id, "demo-data");
    attach(cluster, n, &data_a).await?;

    let hello = data_a.target.join("hello.txt");
    let greeting = "hello from node-a, written through the CSI target path\n";
    std::fs::write(&hello, greeting).with_context(|| format!("writing {}", hello.display()))?;
    let back =
        std::fs::read_to_string(&hello).with_context(|| format!("reading {}", hello.display()))?;
    ensure!(back == greeting, "read back {back:?}, wrote {greeting:?}");
    n.done(
        "write + read back through node-a's target",
        format!(
            "{} holds {} bytes, read back intact",
            n.path(&hello),
            back.len()
        ),
    );

    n.section("snapshot it and restore the snapshot on node-b");
    let snapshot = rpc(
        controller
            .create_snapshot(
                csi::CreateSnapshotRequest {
                    source_volume_id: created.volume_id.clone(),
                    name: "demo-snap".into(),
                    ..Default::default()
                },
                T,
            )
            .await,
        "CreateSnapshot demo-snap",
    )?
    .snapshot
    .context("CreateSnapshot demo-snap returned no snapshot")?;
    ensure!(snapshot.ready_to_use, "snapshot demo-snap is not ready");
    n.done(
        "CreateSnapshot demo-snap of demo-data",
        format!(
            "snapshot {}… ready_to_use, {} GiB",
            short(&snapshot.snapshot_id),
            snapshot.size_bytes / GI
        ),
    );

    let restored = rpc(
        controller
            .create_volume(
                csi::CreateVolumeRequest {
                    name: "demo-restore".into(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: GI,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![capability()],
                    accessibility_requirements: Some(csi::TopologyRequirement {
                        requisite: vec![topology(&key, NODE_A), topology(&key, NODE_B)],
                        preferred: vec![topology(&key, NODE_B)],
                    }),
                    volume_content_source: Some(csi::VolumeContentSource {
                        r#type: Some(csi::volume_content_source::Type::Snapshot(
                            csi::volume_content_source::SnapshotSource {
                                snapshot_id: snapshot.snapshot_id.clone(),
                            },
                        )),
                    }),
                    ..Default::default()
                },
                T,
            )
            .await,
        "CreateVolume demo-restore from demo-snap",
    )?
    .volume
    .context("CreateVolume demo-restore returned no volume")?;
    n.done(
        "CreateVolume demo-restore from snapshot demo-snap (preferred node-b)",
        format!("volume {}…", short(&restored.volume_id)),
    );
    let restore_b = Placement::new(
        cluster,
        NODE_B,
        "app-2",
        &restored.volume_id,
        "demo-restore",
    );
    attach(cluster, n, &restore_b).await?;
    let copy = restore_b.target.join("hello.txt");
    let copied = std::fs::read_to_string(&copy)
        .with_context(|| format!("reading {} on node-b", copy.display()))?;
    ensure!(
        copied == greeting,
        "restored hello.txt holds {copied:?}, expected {greeting:?}"
    );
    n.done(
        "read hello.txt through node-b's target of demo-restore",
        format!("{copied:?} — the snapshot's data"),
    );
    node_unpublish(cluster, n, &restore_b).await?;
    node_unstage(cluster, n, &restore_b).await?;
    controller_unpublish(cluster, n, &restore_b, "detached").await?;

    n.section("fence node-a while a process there still writes");
    let log = data_a.target.join("writer.log");
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"exec 3>>"$1"; while :; do echo x >&3; sleep 0.05; done"#)
        .arg("writer")
        .arg(&log)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the writer (sh)")?;
    let pid = child.id().unwrap_or_default();
    let child = writer.insert(child);
    let started = Instant::now();
    while file_size(&log) < 8 {
        ensure!(
            started.elapsed() < Duration::from_secs(3),
            "the writer did not write to {} within 3 s",
            log.display()
        );
        if let Some(status) = child.try_wait()? {
            bail!("the writer exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let early = file_size(&log);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let growing = file_size(&log);
    ensure!(
        growing > early,
        "the writer stopped writing before any fencing"
    );
    n.done(
        "start a writer on node-a",
        format!(
            "pid {pid} appends \"x\" to {} every 50 ms: {early} B, 0.3 s later {growing} B",
            n.path(&log),
        ),
    );

    let refused = controller
        .controller_publish_volume(
            csi::ControllerPublishVolumeRequest {
                volume_id: created.volume_id.clone(),
                node_id: NODE_B.into(),
                volume_capability: Some(capability()),
                ..Default::default()
            },
            T,
        )
        .await;
    match refused {
        Err(status) if status.code() == Code::FailedPrecondition => n.done(
            "ControllerPublishVolume demo-data → node-b while on node-a",
            format!(
                "refused as it must be: {} ({})",
                code_name(status.code()),
                status.message()
            ),
        ),
        Err(status) => bail!(
            "ControllerPublishVolume demo-data → node-b while on node-a: expected \
             FAILED_PRECONDITION, got {} ({})",
            code_name(status.code()),
            status.message()
        ),
        Ok(_) => bail!(
            "ControllerPublishVolume demo-data → node-b succeeded while the single-node \
             volume is published to node-a"
        ),
    }

    let before = file_size(&log);
    let fenced_at = Instant::now();
    controller_unpublish(
        cluster,
        n,
        &data_a,
        format!("detached at +0.00 s while the writer runs ({before} B written)").as_str(),
    )
    .await?;

    // Watch the file through node-a's target for 1.5 s: it must stop growing, and the
    // writer must be gone, within FENCE_BOUND of the unpublish.
    let mut exited: Option<(Duration, std::process::ExitStatus)> = None;
    let mut size = file_size(&log);
    let mut last_growth = Duration::ZERO;
    let mut samples = vec![format!("+0.00 s  writer.log {size} B  writer running")];
    let mut tick = 0;
    while fenced_at.elapsed() < Duration::from_millis(1500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tick += 1;
        let now = fenced_at.elapsed();
        let current = file_size(&log);
        if current != size {
            size = current;
            last_growth = now;
        }
        if exited.is_none()
            && let Some(status) = child.try_wait()?
        {
            exited = Some((now, status));
        }
        let just_exited = exited.is_some_and(|(at, _)| at == now);
        if tick % 5 == 0 || just_exited {
            let state = match exited {
                None => "writer running".to_string(),
                Some((_, status)) => match status.signal() {
                    Some(9) => "writer gone (SIGKILL)".to_string(),
                    _ => format!("writer gone ({status})"),
                },
            };
            samples.push(format!(
                "+{:.2} s  writer.log {current} B  {state}",
                now.as_secs_f64()
            ));
        }
    }
    let Some((exit_time, status)) = exited else {
        bail!("the writer on fenced node-a is still running 1.5 s after ControllerUnpublish");
    };
    ensure!(
        exit_time <= FENCE_BOUND + Duration::from_millis(50),
        "the writer on node-a exited only {:.2} s after ControllerUnpublish (bound: {:?})",
        exit_time.as_secs_f64(),
        FENCE_BOUND
    );
    ensure!(
        last_growth <= FENCE_BOUND,
        "writer.log still grew {:.2} s after ControllerUnpublish (bound: {:?})",
        last_growth.as_secs_f64(),
        FENCE_BOUND
    );
    n.done(
        "watch writer.log on node-a for 1.5 s",
        format!(
            "writer {} by +{:.2} s; file last grew at +{:.2} s, frozen at {size} B",
            if status.signal() == Some(9) {
                "killed (SIGKILL)".to_string()
            } else {
                format!("exited ({status})")
            },
            exit_time.as_secs_f64(),
            last_growth.as_secs_f64()
        ),
    );
    for sample in &samples {
        n.detail(sample);
    }
    *writer = None;
    let frozen = size;

    let probe = data_a.target.join("after-fence.txt");
    match std::fs::write(&probe, "late write\n") {
        Ok(()) => bail!("a write to {} on fenced node-a succeeded", probe.display()),
        Err(error) => n.done(
            "write through node-a's target, as root",
            format!("refused: {error}"),
        ),
    }

    let health = rpc(
        data_a
            .csi(cluster)
            .node_get_volume_health(
                csi::NodeGetVolumeHealthRequest {
                    volume_id: data_a.volume_id.clone(),
                    volume_publish_path: data_a.target.display().to_string(),
                    staging_target_path: data_a.staging.display().to_string(),
                },
                T,
            )
            .await,
        "NodeGetVolumeHealth demo-data on node-a",
    )?;
    let fenced = health
        .volume_health
        .context("NodeGetVolumeHealth returned no volume health")?
        .health_statuses
        .into_iter()
        .find(|h| h.reason == "NodeFenced")
        .context("node-a reports demo-data without NodeFenced after fencing")?;
    n.done(
        "NodeGetVolumeHealth demo-data on node-a",
        format!("{}: {}", fenced.reason, fenced.message),
    );

    n.section("move the volume to node-b");
    let data_b = Placement::new(cluster, NODE_B, "app-1", &created.volume_id, "demo-data");
    attach(cluster, n, &data_b).await?;
    let seen = std::fs::read_to_string(data_b.target.join("hello.txt"))
        .context("reading hello.txt on node-b")?;
    ensure!(seen == greeting, "hello.txt on node-b holds {seen:?}");
    let moved = file_size(&data_b.target.join("writer.log"));
    ensure!(
        moved == frozen,
        "writer.log on node-b has {moved} B, node-a's writer left {frozen} B"
    );
    n.done(
        "read demo-data through node-b's target",
        format!("hello.txt intact, writer.log {moved} B = what node-a wrote before fencing"),
    );

    n.section("tear down");
    node_unpublish(cluster, n, &data_b).await?;
    node_unstage(cluster, n, &data_b).await?;
    // node-a's mounts were fenced (read-only), not removed: its kubelet still cleans up.
    node_unpublish(cluster, n, &data_a).await?;
    node_unstage(cluster, n, &data_a).await?;
    controller_unpublish(cluster, n, &data_b, "detached").await?;
    rpc(
        controller
            .delete_snapshot(
                csi::DeleteSnapshotRequest {
                    snapshot_id: snapshot.snapshot_id.clone(),
                    ..Default::default()
                },
                T,
            )
            .await,
        "DeleteSnapshot demo-snap",
    )?;
    n.done("DeleteSnapshot demo-snap", "deleted");
    for (name, id) in [
        ("demo-restore", &restored.volume_id),
        ("demo-data", &created.volume_id),
    ] {
        rpc(
            controller
                .delete_volume(
                    csi::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        ..Default::default()
                    },
                    T,
                )
                .await,
            &format!("DeleteVolume {name}"),
        )?;
        n.done(&format!("DeleteVolume {name}"), "deleted");
    }
    let left = mounts_under(&cluster.root);
    ensure!(
        left.is_empty(),
        "mounts left under {}: {left:?}",
        cluster.root.display()
    );
    n.done(
        "look for mounts under the root in /proc/self/mountinfo",
        "none left",
    );
    Ok(())
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
