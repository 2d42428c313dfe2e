//! Node-side crash points (root and strace only: skipped with a reason otherwise, failed under
//! `CI=true`). The real `csi-hostpath` node instance is SIGKILLed by the kernel at the N-th call
//! of a system call that makes a step of NodeStageVolume, NodePublishVolume,
//! NodeUnpublishVolume or NodeUnstageVolume: strace, attached to the running driver just before
//! the operation, delivers the signal as the call is entered, so the driver needs no hook. For
//! every operation, every such system call and every N until the operation runs through
//! unkilled, on a fresh volume of each kind, the test restarts the driver on the same state,
//! retries the operation until it succeeds (or, for a staging or publishing, in a second round,
//! undoes it as the kubelet does once the pod is gone) and finishes the volume's lifecycle.
//! After every operation exactly what it makes must be there (one mount, never two stacked; one
//! loop device; the record), and the pod's path must reach this volume's data and no other's;
//! at the end nothing may be left: no mount, no loop device on the volume's image, no record.
//!
//! Whose call is killed: the driver's own calls kill the driver. The `losetup` the driver runs
//! is followed too: `execve` kills each one before it runs, `wait4` kills the driver once one
//! has finished, and `ioctl` (counted per process) kills whichever reaches its N-th first: a
//! `losetup` in the middle of its work, or the driver checking a device. A node that attaches
//! loop devices shares the machine with a neighbour volume, staged again after every kill so
//! that it takes the loop numbers a crash freed; a freed number that a record still names is
//! bound to the neighbour's image besides, and the driver must leave it so.

mod common;

use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_grpc::conn::CsiConnection;
use csi_hostpath::state::Store;
use csi_proto::csi::v1 as csi;
use tonic::{Code, Status};

/// Beyond this N a step would be a loop, not a step.
const MAX_CALLS: u32 = 40;
const NODE: &str = "node-a";
/// `losetup` found at the first try, so that `execve` #1 is the one that runs it.
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A directory, staged and published read-only: a crash must leave no writable mount.
    Directory,
    Block,
    /// ext4, exported to the node by ControllerPublishVolume; staged writable, published
    /// read-only.
    Ext4,
    /// ext4 without attach: NodeStageVolume opens the node's export (loop device and mount).
    Ext4NodeExport,
}

impl Kind {
    fn capability(self) -> csi::VolumeCapability {
        match self {
            Self::Directory => mount(Mode::SingleNodeWriter),
            Self::Block => block(Mode::SingleNodeWriter),
            Self::Ext4 | Self::Ext4NodeExport => csi::VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: "ext4".into(),
                    ..MountVolume::default()
                })),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
            },
        }
    }

    fn attach(self) -> bool {
        self != Self::Ext4NodeExport
    }

    /// Whether ControllerPublishVolume makes the volume read-only (its staging mount too).
    fn staging_readonly(self) -> bool {
        self == Self::Directory
    }

    fn publish_readonly(self) -> bool {
        matches!(self, Self::Directory | Self::Ext4)
    }

    /// Whether the node itself binds the volume's image to a loop device.
    fn node_loops(self) -> bool {
        matches!(self, Self::Block | Self::Ext4NodeExport)
    }

    /// The system calls that make the node's steps. strace counts each thread's calls, and the
    /// driver's background loops (heartbeat, fencing watch) make none of these, so the N-th is
    /// the operation's.
    fn steps(self) -> Vec<&'static str> {
        let mut calls = vec![
            // Paths below the kubelet's root, and the export's.
            "mkdir",
            "mkdirat",
            "openat2",
            "mount",
            "umount2",
            "rmdir",
            "unlink",
            // The state: an appended change, and a compaction's replaced file.
            "pwrite64",
            "fdatasync",
            "rename",
        ];
        if self.node_loops() {
            calls.extend(["execve", "wait4", "ioctl"]);
        }
        calls
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

const OPS: [Op; 4] = [Op::Stage, Op::Publish, Op::Unpublish, Op::Unstage];

impl Op {
    /// The operation that undoes this one, which the CO may call instead of a retry.
    fn undo(self) -> Option<Op> {
        match self {
            Op::Stage => Some(Op::Unstage),
            Op::Publish => Some(Op::Unpublish),
            Op::Unpublish | Op::Unstage => None,
        }
    }

    /// Whether the volume is staged once this operation succeeded.
    fn leaves_staged(self) -> bool {
        self != Op::Unstage
    }
}

/// What the CO does after an operation a kill cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// Retries it until it succeeds.
    Retry,
    /// Gives it up and undoes it: the kubelet unstages (unpublishes) a volume whose staging
    /// (publishing) it is unsure of once the pod is gone.
    GiveUp,
}

struct Vol {
    id: String,
    staging: PathBuf,
    target: PathBuf,
}

impl fmt::Display for Vol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// A driver process (not under strace: strace attaches for one operation).
struct Driver {
    child: Child,
    csi: CsiConnection,
}

impl Driver {
    async fn start(root: &Path, node: bool, attach: bool) -> Self {
        let name = if node { NODE } else { "controller" };
        let socket = root.join(format!("{name}.sock"));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join(format!("{name}.log")))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
            .arg(format!(
                "--mode={}",
                if node { "node" } else { "controller" }
            ))
            .arg(format!("--nodeid={name}"))
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--statedir={}", root.join("state").display()))
            .arg(format!(
                "--allowed-path-roots={}",
                root.join("kubelet").display()
            ))
            .arg(format!("--enable-attach={attach}"))
            .env("PATH", PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let csi = connect_ready(&socket).await;
        Self { child, csi }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `wait` for the process to end; whether it was killed by SIGKILL.
    fn killed_within(&mut self, wait: Duration) -> Result<bool, String> {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return match status.signal() {
                    Some(9) => Ok(true),
                    _ => Err(format!("the driver ended by itself: {status}")),
                };
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// strace attached to the driver, SIGKILLing whoever makes the `n`-th call of `syscall`.
struct Strace {
    child: Child,
    log: PathBuf,
}

impl Strace {
    fn attach(pid: u32, syscall: &str, n: u32, dir: &Path) -> Self {
        let log = dir.join("strace.log");
        let messages = dir.join("strace.messages");
        let child = Command::new("strace")
            .args(["-f", "-p", &pid.to_string(), "-o"])
            .arg(&log)
            .arg(format!("--trace={syscall}"))
            .arg(format!("--inject={syscall}:signal=KILL:when={n}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&messages).unwrap())
            .spawn()
            .unwrap();
        let mut strace = Self { child, log };
        // It says so once every thread is attached.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs::read_to_string(&messages)
            .unwrap_or_default()
            .contains("attached")
        {
            let exited = strace.child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "strace did not attach to {pid}: {}",
                fs::read_to_string(&messages).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        strace
    }

    /// Ends the tracing: strace leaves by itself once every tracee is gone, and detaches from
    /// the living on SIGINT. Returns the call that was killed, if one was.
    fn finish(mut self, driver_died: bool) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut interrupted = false;
        while self.child.try_wait().unwrap().is_none() {
            if (!driver_died || Instant::now() >= deadline) && !interrupted {
                let pid = rustix::process::Pid::from_child(&self.child);
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
                interrupted = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        if !log.contains("+++ killed by SIGKILL +++") {
            return None;
        }
        // The call entered and never returned.
        let call = log
            .lines()
            .find(|line| line.ends_with("= ?") || line.ends_with("<unfinished ...>"))
            .unwrap_or("(the call is not in strace's log)");
        Some(call.to_string())
    }
}

impl Drop for Strace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One kind's volumes, a controller and the node instance that is killed, under one root.
struct Rig {
    kind: Kind,
    node: Driver,
    controller: Driver,
    store: Store,
    /// Staged and published beside the volume under test, on loop devices too.
    neighbour: Option<Vol>,
    /// Crash points that killed something.
    kills: usize,
    /// How many killed, by operation and system call.
    tally: Vec<String>,
    /// How often the neighbour took a loop device a record of the volume under test named.
    taken_over: usize,
    failures: Vec<String>,
    root: PathBuf,
    _cleanup: LeftBehind,
    _dir: tempfile::TempDir,
}

/// Unmounts what is left under the root and detaches the loop devices of its images, even of
/// deleted ones, when a failing test ends.
struct LeftBehind(PathBuf);

impl Drop for LeftBehind {
    fn drop(&mut self) {
        drop_mounts_and_loop_devices(&self.0);
        for (device, _) in loop_devices_under(&self.0) {
            let _ = csi_hostpath::mounts::loop_detach(&device);
        }
    }
}

impl Rig {
    async fn new(kind: Kind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        fs::create_dir_all(root.join("kubelet")).unwrap();
        let cleanup = LeftBehind(root.clone());
        let node = Driver::start(&root, true, kind.attach()).await;
        let controller = Driver::start(&root, false, kind.attach()).await;
        let store = Store::open(&root.join("state")).unwrap();
        let mut rig = Self {
            kind,
            node,
            controller,
            store,
            neighbour: None,
            kills: 0,
            tally: Vec::new(),
            taken_over: 0,
            failures: Vec::new(),
            root,
            _cleanup: cleanup,
            _dir: dir,
        };
        if kind.node_loops() {
            let neighbour = rig.new_volume("neighbour").await.unwrap();
            for op in [Op::Stage, Op::Publish] {
                rig.run(&neighbour, op).await.unwrap();
            }
            rig.neighbour = Some(neighbour);
        }
        rig
    }

    /// Every crash point of every operation, each on a volume of its own.
    async fn explore(&mut self) {
        for op in OPS {
            let afters = [Some(After::Retry), op.undo().map(|_| After::GiveUp)];
            for after in afters.into_iter().flatten() {
                let mut killed = Vec::new();
                for syscall in self.kind.steps() {
                    let kills = self.explore_call(op, after, syscall).await;
                    if kills > 0 {
                        killed.push(format!("{syscall} {kills}"));
                    }
                }
                self.tally
                    .push(format!("{op:?} ({after:?}): {}", killed.join(", ")));
            }
        }
    }

    /// The crash points of `op` at each call of `syscall`; how many killed.
    async fn explore_call(&mut self, op: Op, after: After, syscall: &str) -> u32 {
        for n in 1..=MAX_CALLS {
            match self.crash_point(op, after, syscall, n).await {
                Ok(false) => return n - 1,
                Ok(true) => {}
                Err(failure) => self
                    .failures
                    .push(format!("{op:?} ({after:?}), {syscall} #{n}: {failure}")),
            }
        }
        self.failures.push(format!(
            "{op:?} ({after:?}): {syscall} still killed it at #{MAX_CALLS}"
        ));
        MAX_CALLS
    }

    async fn new_volume(&self, name: &str) -> Result<Vol, String> {
        let cap = self.kind.capability();
        let id = self
            .controller
            .csi
            .create_volume(create_request(name, self.bytes(), cap.clone()), T)
            .await
            .map_err(|e| format!("CreateVolume {name}: {e}"))?
            .volume
            .unwrap()
            .volume_id;
        if self.kind.attach() {
            let mut request = publish_to(&id, NODE, cap);
            request.readonly = self.kind.staging_readonly();
            self.controller
                .csi
                .controller_publish_volume(request, T)
                .await
                .map_err(|e| format!("ControllerPublishVolume {id}: {e}"))?;
        }
        // What the read-only published volumes show at their target.
        let data = match self.kind {
            Kind::Directory => Some(self.store.volume_data(&id, layout_of(self.kind))),
            Kind::Ext4 => Some(self.store.export_path(NODE, &id).join("volume")),
            Kind::Block | Kind::Ext4NodeExport => None,
        };
        if let Some(data) = data {
            fs::write(data.join("marker"), &id).unwrap();
        }
        let kubelet = self.root.join("kubelet").join(NODE);
        Ok(Vol {
            staging: kubelet.join("plugins").join(&id).join("globalmount"),
            target: kubelet.join("pods/pod-1/volumes").join(&id),
            id,
        })
    }

    fn bytes(&self) -> i64 {
        match self.kind {
            Kind::Ext4 | Kind::Ext4NodeExport => 32 << 20,
            Kind::Directory | Kind::Block => 4 << 20,
        }
    }

    async fn call(&self, vol: &Vol, op: Op) -> Result<(), Status> {
        let (csi, cap) = (&self.node.csi, self.kind.capability());
        match op {
            Op::Stage => csi
                .node_stage_volume(stage(&vol.id, &vol.staging, cap), T)
                .await
                .map(drop),
            Op::Publish => {
                let request = publish(
                    &vol.id,
                    &vol.staging,
                    &vol.target,
                    cap,
                    self.kind.publish_readonly(),
                );
                csi.node_publish_volume(request, T).await.map(drop)
            }
            Op::Unpublish => csi
                .node_unpublish_volume(unpublish(&vol.id, &vol.target), T)
                .await
                .map(drop),
            Op::Unstage => csi
                .node_unstage_volume(unstage(&vol.id, &vol.staging), T)
                .await
                .map(drop),
        }
    }

    /// Runs `op`, which must succeed, and checks what it left.
    async fn run(&self, vol: &Vol, op: Op) -> Result<(), String> {
        self.call(vol, op)
            .await
            .map_err(|e| format!("{op:?} of {vol}: {e}"))?;
        self.check(vol, op)
            .map_err(|e| format!("after {op:?} of {vol}: {e}"))
    }

    /// One crash point: `op` of a fresh volume with the `n`-th `syscall` killed, then the
    /// retries (of `op`, or of its undoing) and the rest of the lifecycle. Whether anything
    /// was killed.
    async fn crash_point(
        &mut self,
        op: Op,
        after: After,
        syscall: &str,
        n: u32,
    ) -> Result<bool, String> {
        let name = format!("{op:?}-{after:?}-{syscall}-{n}").to_lowercase();
        let vol = self.new_volume(&name).await?;
        for earlier in OPS.iter().filter(|o| **o < op) {
            self.run(&vol, *earlier).await?;
        }
        let strace = Strace::attach(self.node.pid(), syscall, n, &self.root);
        let result = self.call(&vol, op).await;
        let (killed, died) = kill_outcome(&mut self.node, strace, &result).await?;
        let Some(call) = killed else {
            result.map_err(|e| format!("{op:?} failed, nothing killed: {e}"))?;
            self.check(&vol, op)
                .map_err(|e| format!("after {op:?} of {vol}: {e}"))?;
            self.finish_lifecycle(&vol, op).await?;
            return Ok(false);
        };
        self.kills += 1;
        let whose = if died { "the driver" } else { "a child" };
        let context = |e: String| format!("{whose} killed at `{call}`: {e}");
        if died {
            self.node = Driver::start(&self.root, true, self.kind.attach()).await;
        }
        self.move_neighbour(&vol).await.map_err(context)?;
        let occupied = self.occupy_freed_device(&vol);
        let settled = match after {
            After::Retry => op,
            After::GiveUp => op
                .undo()
                .expect("only an operation with an undoing is given up"),
        };
        self.retry(&vol, settled).await.map_err(context)?;
        self.check(&vol, settled)
            .map_err(|e| context(format!("after the retried {settled:?}: {e}")))?;
        self.finish_lifecycle(&vol, settled)
            .await
            .map_err(context)?;
        if let Some((device, image)) = occupied {
            let bound = backing_file(&device);
            let _ = csi_hostpath::mounts::loop_detach(&device);
            if bound.as_deref() != Some(image.as_path()) {
                return Err(context(format!(
                    "{device}, which the neighbour's image had taken, is now bound to {bound:?}"
                )));
            }
        }
        Ok(true)
    }

    /// After a kill: a loop device that a record of `vol` names but that is free now is bound
    /// to the neighbour's image, as another volume may take a freed number; the driver must
    /// leave it so. Returns the device and the image.
    fn occupy_freed_device(&mut self, vol: &Vol) -> Option<(String, PathBuf)> {
        let neighbour = self.neighbour.as_ref()?;
        let device = self.recorded_device(vol)?;
        if backing_file(&device).is_some() {
            return None;
        }
        let image = self.store.volume_data(&neighbour.id, layout_of(self.kind));
        let bound = Command::new("losetup")
            .arg(&device)
            .arg(&image)
            .status()
            .is_ok_and(|status| status.success());
        // Another process may have taken it first.
        bound.then(|| {
            self.taken_over += 1;
            (device, image)
        })
    }

    /// Retries `op` as the kubelet does, until it succeeds (a few tries).
    async fn retry(&self, vol: &Vol, op: Op) -> Result<(), String> {
        let mut errors = Vec::new();
        for _ in 0..3 {
            match self.call(vol, op).await {
                Ok(()) => return Ok(()),
                Err(status) => errors.push(status.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("the retried {op:?} never succeeded: {errors:?}"))
    }

    /// The operations after `op`, ControllerUnpublishVolume and DeleteVolume; then nothing of
    /// the volume may be left.
    async fn finish_lifecycle(&self, vol: &Vol, op: Op) -> Result<(), String> {
        for later in OPS.iter().filter(|o| **o > op) {
            self.run(vol, *later).await?;
        }
        let controller = &self.controller.csi;
        if self.kind.attach() {
            let request = csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                node_id: NODE.into(),
                ..Default::default()
            };
            controller
                .controller_unpublish_volume(request, T)
                .await
                .map_err(|e| format!("ControllerUnpublishVolume: {e}"))?;
        }
        let request = csi::DeleteVolumeRequest {
            volume_id: vol.id.clone(),
            ..Default::default()
        };
        controller
            .delete_volume(request, T)
            .await
            .map_err(|e| format!("DeleteVolume: {e}"))?;
        let mounts: Vec<String> = mounts_under(&self.root)
            .into_iter()
            .filter(|point| point.contains(&vol.id))
            .collect();
        let loops = loop_devices_settled(&self.root, |file| file.contains(&vol.id), 0);
        let recorded = self.store.read().unwrap().volumes.contains_key(&vol.id);
        let export = self.store.export_path(NODE, &vol.id);
        if !mounts.is_empty() || !loops.is_empty() || recorded || export.exists() {
            return Err(format!(
                "left behind: mounts {mounts:?}, loop devices {loops:?}, record {recorded}, export directory {}",
                export.exists()
            ));
        }
        Ok(())
    }

    /// After a kill: the neighbour is unstaged and staged again, taking the loop numbers the
    /// kill freed (maybe one `vol`'s record still names), and must still reach its own data.
    async fn move_neighbour(&mut self, vol: &Vol) -> Result<(), String> {
        let Some(neighbour) = &self.neighbour else {
            return Ok(());
        };
        let named = self.recorded_device(vol);
        for op in OPS.iter().skip(2).chain(OPS.iter().take(2)) {
            self.run(neighbour, *op)
                .await
                .map_err(|e| format!("the neighbour: {e}"))?;
        }
        if named.is_some() && named == self.recorded_device(neighbour) {
            self.taken_over += 1;
        }
        Ok(())
    }

    /// The loop device the records of `vol` name on the node: its staging's or its export's.
    fn recorded_device(&self, vol: &Vol) -> Option<String> {
        let state = self.store.read().unwrap();
        let volume = state.volumes.get(&vol.id)?;
        match self.kind {
            Kind::Block => volume.nodes.get(NODE)?.staged.as_ref()?.device.clone(),
            _ => volume.exports.get(NODE).map(|export| export.device.clone()),
        }
    }

    /// What `after` leaves, and nothing else: mounts (one each), loop devices, records, and a
    /// published volume's path reaching its own data.
    fn check(&self, vol: &Vol, after: Op) -> Result<(), String> {
        let staged = after.leaves_staged();
        let published = after == Op::Publish;
        let image = self.store.volume_data(&vol.id, layout_of(self.kind));
        let export = self.store.export_path(NODE, &vol.id);
        let mounted = |path: &Path| mounts_at(path).len();
        let want_staging = usize::from(staged && self.kind != Kind::Block);
        let mut wrong = Vec::new();
        if mounted(&vol.staging) != want_staging {
            wrong.push(format!(
                "{} mounts at the staging path",
                mounted(&vol.staging)
            ));
        }
        if mounted(&vol.target) != usize::from(published) {
            wrong.push(format!(
                "{} mounts at the target path",
                mounted(&vol.target)
            ));
        }
        if !published && vol.target.exists() {
            wrong.push("the target path is still there".into());
        }
        let want_loops = match self.kind {
            Kind::Block | Kind::Ext4NodeExport => usize::from(staged),
            // The controller's export.
            Kind::Ext4 => 1,
            Kind::Directory => 0,
        };
        let loops =
            loop_devices_settled(&self.root, |file| Path::new(file) == image, want_loops).len();
        if loops != want_loops {
            wrong.push(format!("{loops} loop devices on the image"));
        }
        if self.kind == Kind::Ext4NodeExport && mounted(&export) != usize::from(staged) {
            wrong.push(format!("{} mounts at the export", mounted(&export)));
        }
        let readonly = [
            (&vol.staging, self.kind.staging_readonly()),
            (&vol.target, self.kind.publish_readonly()),
        ];
        for (path, _) in readonly.iter().filter(|(_, readonly)| *readonly) {
            let writable = mounts_at(path)
                .iter()
                .any(|options| !options.split(',').any(|o| o == "ro"));
            if writable {
                wrong.push(format!("{} is mounted writable", path.display()));
            }
        }
        let state = self.store.read().unwrap();
        let usage = state
            .volumes
            .get(&vol.id)
            .and_then(|v| v.nodes.get(NODE))
            .cloned()
            .unwrap_or_default();
        let recorded_staging = usage.staged.as_ref().map(|s| PathBuf::from(&s.path));
        if recorded_staging != staged.then(|| vol.staging.clone()) {
            wrong.push(format!("recorded as staged at {recorded_staging:?}"));
        }
        let targets: Vec<&String> = usage.targets.keys().collect();
        if targets.len() != usize::from(published) {
            wrong.push(format!("recorded as published at {targets:?}"));
        }
        if published && let Err(error) = self.reaches_own_data(vol) {
            wrong.push(error);
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }

    /// Whether the published target path reaches `vol`'s own data: a file the volume holds is
    /// read through it, or what is written through it lands in the volume's image or export.
    fn reaches_own_data(&self, vol: &Vol) -> Result<(), String> {
        let marker = vol.id.as_bytes();
        let landed = match self.kind {
            Kind::Directory | Kind::Ext4 => fs::read(vol.target.join("marker")).unwrap_or_default(),
            Kind::Block => {
                let mut device = fs::OpenOptions::new()
                    .write(true)
                    .open(&vol.target)
                    .map_err(|e| format!("opening the published device: {e}"))?;
                device.write_all(marker).unwrap();
                device.sync_all().unwrap();
                let mut image =
                    File::open(self.store.volume_data(&vol.id, layout_of(self.kind))).unwrap();
                let mut start = vec![0; marker.len()];
                image.read_exact(&mut start).unwrap();
                start
            }
            Kind::Ext4NodeExport => {
                fs::write(vol.target.join("marker"), marker)
                    .map_err(|e| format!("writing through the target: {e}"))?;
                let export = self.store.export_path(NODE, &vol.id);
                fs::read(export.join("volume/marker")).unwrap_or_default()
            }
        };
        if landed == marker {
            Ok(())
        } else {
            Err(format!(
                "the target reaches another volume's data: found {:?}",
                String::from_utf8_lossy(&landed)
            ))
        }
    }

    /// Unstages the neighbour, deletes it, and checks that nothing at all is left.
    async fn finish(mut self) {
        if let Some(neighbour) = self.neighbour.take()
            && let Err(error) = self.finish_lifecycle(&neighbour, Op::Publish).await
        {
            self.failures.push(format!("the neighbour: {error}"));
        }
        let mounts = mounts_under(&self.root);
        let loops = loop_devices_settled(&self.root, |_| true, 0);
        let records = self.store.read().unwrap().volumes.len();
        let failed = self.failures.len();
        assert!(
            self.failures.is_empty() && mounts.is_empty() && loops.is_empty() && records == 0,
            "{:?}: {failed} crash points failed (of {} that killed):\n{}\nleft: mounts {mounts:?}, loop devices {loops:?}, {records} records",
            self.kind,
            self.kills,
            self.failures.join("\n")
        );
        eprintln!(
            "{:?}: {} crash points, all converged ({} times the neighbour took a loop device a \
             record still named); kills by operation and call:\n{}",
            self.kind,
            self.kills,
            self.taken_over,
            self.tally.join("\n")
        );
    }
}

fn layout_of(kind: Kind) -> csi_hostpath::state::Layout {
    use csi_hostpath::state::Layout;
    match kind {
        Kind::Directory => Layout::Directory,
        Kind::Block => Layout::Image,
        Kind::Ext4 | Kind::Ext4NodeExport => Layout::Ext4Image,
    }
}

/// The loop devices on the files under `root` that `matches` accepts, once there are `want`
/// of them or a little time has passed: a device detaches on its last close, which may be
/// another process's (one listing the machine's loop devices).
fn loop_devices_settled(
    root: &Path,
    matches: impl Fn(&str) -> bool,
    want: usize,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found: Vec<(String, String)> = loop_devices_under(root)
            .into_iter()
            .filter(|(_, file)| matches(file))
            .collect();
        if found.len() == want || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The file the loop device `device` is bound to, if it is bound.
fn backing_file(device: &str) -> Option<PathBuf> {
    let name = device.strip_prefix("/dev/")?;
    let file = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(file.trim_end_matches('\n')))
}

/// What a kill did to the call that ended with `result`: the call that was killed (if one
/// was) and whether the driver died of it.
async fn kill_outcome<T: fmt::Debug>(
    node: &mut Driver,
    strace: Strace,
    result: &Result<T, Status>,
) -> Result<(Option<String>, bool), String> {
    // The client's names for a connection the driver's death broke; the driver itself never
    // answers them.
    let broken = result.as_ref().err().is_some_and(|status| {
        matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        )
    });
    let wait = if broken {
        Duration::from_secs(10)
    } else {
        Duration::ZERO
    };
    let mut died = node.killed_within(wait)?;
    let killed = strace.finish(died);
    // Whatever the client made of it, a killed driver answers no probe.
    if killed.is_some() && !died && node.csi.probe(csi::ProbeRequest {}, T).await.is_err() {
        died = node.killed_within(Duration::from_secs(10))?;
    }
    if broken && !died {
        return Err(format!(
            "the connection broke, the driver lives: {result:?}"
        ));
    }
    Ok((killed, died))
}

/// True when the crash points can run: root, and strace on the PATH. Under `CI=true` their
/// absence fails instead.
fn can_run(test: &str) -> bool {
    if !root_or_skip(test) {
        return false;
    }
    let strace = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status();
    if strace.is_ok_and(|status| status.success()) {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} needs strace (Debian: apt-get install strace), and CI must run it"
    );
    eprintln!("skipped {test}: strace is missing (Debian: apt-get install strace)");
    false
}

async fn crash_points(test: &str, kind: Kind) {
    if !can_run(test) {
        return;
    }
    let started = Instant::now();
    let mut rig = Rig::new(kind).await;
    rig.explore().await;
    eprintln!("{test}: {:?}", started.elapsed());
    rig.finish().await;
}

#[tokio::test]
async fn a_directory_volume_survives_a_kill_at_every_node_step() {
    crash_points(
        "a_directory_volume_survives_a_kill_at_every_node_step",
        Kind::Directory,
    )
    .await;
}

#[tokio::test]
async fn a_block_volume_survives_a_kill_at_every_node_step() {
    crash_points(
        "a_block_volume_survives_a_kill_at_every_node_step",
        Kind::Block,
    )
    .await;
}

#[tokio::test]
async fn an_ext4_volume_survives_a_kill_at_every_node_step() {
    crash_points(
        "an_ext4_volume_survives_a_kill_at_every_node_step",
        Kind::Ext4,
    )
    .await;
}

#[tokio::test]
async fn an_ext4_volume_the_node_exports_survives_a_kill_at_every_node_step() {
    crash_points(
        "an_ext4_volume_the_node_exports_survives_a_kill_at_every_node_step",
        Kind::Ext4NodeExport,
    )
    .await;
}

/// Ephemeral inline volumes: NodePublishVolume (without staging) makes the volume and
/// NodeUnpublishVolume deletes it. The node instance is killed at every step of either; its
/// restart alone must leave the volume whole (recorded `Ready`, its data mounted at the
/// target) or gone (no record, no data, no mount, no target directory), never half made; then
/// the kubelet retries, or gives a publishing up and unpublishes, and at the end nothing is left.
#[tokio::test]
async fn an_inline_volume_survives_a_kill_at_every_node_step() {
    let test = "an_inline_volume_survives_a_kill_at_every_node_step";
    if !can_run(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    fs::create_dir_all(root.join("kubelet")).unwrap();
    let _cleanup = LeftBehind(root.clone());
    let mut rig = Inline {
        node: Driver::start(&root, true, true).await,
        store: Store::open(&root.join("state")).unwrap(),
        root,
    };
    let (mut kills, mut failures, mut tally) = (0, Vec::new(), Vec::new());
    for (op, after) in [
        (Op::Publish, After::Retry),
        (Op::Publish, After::GiveUp),
        (Op::Unpublish, After::Retry),
    ] {
        let mut killed = Vec::new();
        // A directory volume's steps, and the removal of its data.
        let steps = Kind::Directory.steps().into_iter().chain(["unlinkat"]);
        for syscall in steps {
            for n in 1..=MAX_CALLS {
                let id = format!("csi-{op:?}-{after:?}-{syscall}-{n}").to_lowercase();
                match rig.crash_point(&id, op, after, syscall, n).await {
                    Ok(true) => kills += 1,
                    Ok(false) => {
                        if n > 1 {
                            killed.push(format!("{syscall} {}", n - 1));
                        }
                        break;
                    }
                    Err(failure) => {
                        kills += 1;
                        failures.push(format!("{op:?} ({after:?}), {syscall} #{n}: {failure}"));
                    }
                }
            }
        }
        tally.push(format!("{op:?} ({after:?}): {}", killed.join(", ")));
    }
    let mounts = mounts_under(&rig.root);
    let records = rig.store.read().unwrap().volumes.len();
    let data = fs::read_dir(rig.root.join("state/volumes"))
        .unwrap()
        .count();
    assert!(
        failures.is_empty() && mounts.is_empty() && records == 0 && data == 0,
        "{} crash points failed (of {kills} that killed):\n{}\nleft: mounts {mounts:?}, {records} records, {data} data directories",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{test}: {kills} crash points, all converged; kills by operation and call:\n{}",
        tally.join("\n")
    );
}

/// The node instance of [`an_inline_volume_survives_a_kill_at_every_node_step`].
struct Inline {
    node: Driver,
    store: Store,
    root: PathBuf,
}

impl Inline {
    fn target(&self, id: &str) -> PathBuf {
        self.root
            .join("kubelet")
            .join(NODE)
            .join("pods")
            .join(id)
            .join("volumes/kubernetes.io~csi/scratch/mount")
    }

    async fn call(&self, id: &str, op: Op) -> Result<(), Status> {
        let target = self.target(id);
        match op {
            Op::Publish => {
                fs::create_dir_all(target.parent().unwrap()).unwrap();
                let request = csi::NodePublishVolumeRequest {
                    volume_id: id.into(),
                    target_path: target.display().to_string(),
                    volume_capability: Some(mount(Mode::SingleNodeWriter)),
                    volume_context: [(
                        "csi.storage.k8s.io/ephemeral".to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                    ..Default::default()
                };
                self.node
                    .csi
                    .node_publish_volume(request, T)
                    .await
                    .map(drop)
            }
            _ => self
                .node
                .csi
                .node_unpublish_volume(unpublish(id, &target), T)
                .await
                .map(drop),
        }
    }

    /// `op`, which must succeed, and what it must leave.
    async fn run(&self, id: &str, op: Op) -> Result<(), String> {
        self.call(id, op)
            .await
            .map_err(|e| format!("{op:?} of {id}: {e}"))?;
        self.check(id, Some(op == Op::Publish))
            .map_err(|e| format!("after {op:?} of {id}: {e}"))
    }

    /// One crash point; whether anything was killed.
    async fn crash_point(
        &mut self,
        id: &str,
        op: Op,
        after: After,
        syscall: &str,
        n: u32,
    ) -> Result<bool, String> {
        if op == Op::Unpublish {
            self.run(id, Op::Publish).await?;
        }
        let strace = Strace::attach(self.node.pid(), syscall, n, &self.root);
        let result = self.call(id, op).await;
        let (killed, died) = kill_outcome(&mut self.node, strace, &result).await?;
        let Some(call) = killed else {
            result.map_err(|e| format!("{op:?} failed, nothing killed: {e}"))?;
            self.check(id, Some(op == Op::Publish))?;
            if op == Op::Publish {
                self.run(id, Op::Unpublish).await?;
            }
            return Ok(false);
        };
        let context = |e: String| format!("killed at `{call}`: {e}");
        if died {
            self.node = Driver::start(&self.root, true, true).await;
            self.check(id, None)
                .map_err(|e| context(format!("after the restart: {e}")))?;
        }
        let settled = match after {
            After::Retry => op,
            After::GiveUp => Op::Unpublish,
        };
        let mut errors = Vec::new();
        for _ in 0..3 {
            match self.run(id, settled).await {
                Ok(()) => break,
                Err(error) => errors.push(error),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if errors.len() == 3 {
            return Err(context(format!(
                "the retried {settled:?} never succeeded: {errors:?}"
            )));
        }
        if settled == Op::Publish {
            self.run(id, Op::Unpublish).await.map_err(context)?;
        }
        Ok(true)
    }

    /// The volume published (`Some(true)`), gone (`Some(false)`), or either (`None`), and
    /// nothing half way.
    fn check(&self, id: &str, published: Option<bool>) -> Result<(), String> {
        let target = self.target(id);
        let data = self
            .store
            .volume_data(id, csi_hostpath::state::Layout::Directory);
        let state = self.store.read().unwrap();
        let record = state.volumes.get(id);
        let whole = record.is_some_and(|v| {
            v.phase == csi_hostpath::state::Phase::Ready
                && v.nodes
                    .get(NODE)
                    .is_some_and(|u| u.targets.contains_key(&target.display().to_string()))
        }) && mounts_at(&target).len() == 1
            && data.is_dir();
        let gone =
            record.is_none() && mounts_at(&target).is_empty() && !data.exists() && !target.exists();
        let fine = match published {
            Some(true) => whole,
            Some(false) => gone,
            None => whole || gone,
        };
        if !fine {
            return Err(format!(
                "neither whole nor gone: record {:?}, {} mounts at the target, data {}, target {}",
                record.map(|v| v.phase),
                mounts_at(&target).len(),
                data.exists(),
                target.exists()
            ));
        }
        if whole {
            fs::write(target.join("marker"), id).map_err(|e| format!("writing: {e}"))?;
            if fs::read(data.join("marker")).ok().as_deref() != Some(id.as_bytes()) {
                return Err("the target does not reach the volume's data".into());
            }
        }
        Ok(())
    }
}
