//! The CSI Node service of one (simulated) node, and its fencing: once a volume is
//! ControllerUnpublished from this node while the node still has it staged or published, the
//! node's writers to it are killed and its mounts remounted read-only.
//!
//! A record of what is staged or published is a claim, not a proof: a restart of the machine
//! takes every mount and loop device away and keeps the records, and loop numbers are reused,
//! so a recorded device may be another volume's by now. Before a record is trusted (an
//! idempotent answer, a device handed to a pod, detached or grown) the mount or device is
//! checked to be this volume's: the same file or directory (device and inode) as its data, or
//! a loop device bound to its image. What no longer is gets staged or published again; a
//! mount that is something else's is refused and left alone.
//!
//! A crash can also come between a step and its record. Each step is therefore one a retry
//! finds done and takes over (the volume's own mount at the path, the loop device bound to
//! its image), and an unstaging without a record still undoes what such a staging left.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi::node_server::Node;
use csi::node_service_capability::rpc::Type as Rpc;
use csi_grpc::conn::LEGACY_NODE_VOLUME_CONDITION;
use csi_proto::csi::v1 as csi;

use crate::beneath::NodePath;
use crate::data;
use crate::driver::{Driver, ready_volume};
use crate::ephemeral;
use crate::error::DriverError;
use crate::export;
use crate::health::NodePaths;
use crate::mounts;
use crate::rules::{self, required};
use crate::state::{AccessType, Layout, NodeUse, Staging, Target, Volume, now_millis};

#[derive(Debug, Clone)]
pub struct NodeService {
    driver: Arc<Driver>,
}

impl NodeService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

pub(crate) fn need_mounts() -> Result<(), DriverError> {
    if mounts::can_mount() {
        Ok(())
    } else {
        Err(DriverError::MissingPrivilege {
            action: "mounting",
            privilege: "root privileges (CAP_SYS_ADMIN)",
        })
    }
}

impl Driver {
    /// Respells this node's records under an allowed root that is a symbolic link to lie below
    /// its real place, as requests are resolved: records of a driver that kept the link's
    /// spelling would otherwise never match their NodeUnstage and NodeUnpublish. Run once, as
    /// the node instance starts.
    pub fn respell_node_records(&self) -> Result<(), DriverError> {
        let roots: Vec<(PathBuf, PathBuf)> = self
            .config
            .allowed_path_roots
            .iter()
            .map(|root| {
                let real = fs::canonicalize(root).unwrap_or_else(|_| root.clone());
                (root.clone(), real)
            })
            .filter(|(root, real)| root != real)
            .collect();
        if roots.is_empty() {
            return Ok(());
        }
        let node = &self.config.node_id;
        let respell = |usage: &mut NodeUse| {
            if let Some(staged) = &mut usage.staged
                && let Some(real) = rules::real_spelling(&staged.path, &roots)
            {
                staged.path = real;
            }
            usage.targets = std::mem::take(&mut usage.targets)
                .into_iter()
                .map(|(path, target)| (rules::real_spelling(&path, &roots).unwrap_or(path), target))
                .collect();
        };
        let stale = |usage: &NodeUse| {
            let staged = usage.staged.iter().map(|s| s.path.as_str());
            staged
                .chain(usage.targets.keys().map(String::as_str))
                .any(|path| rules::real_spelling(path, &roots).is_some())
        };
        let ids: Vec<String> = self
            .store
            .read()?
            .volumes
            .values()
            .filter(|v| v.nodes.get(node).is_some_and(stale))
            .map(|v| v.id.clone())
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        tracing::info!(
            volumes = ids.len(),
            "respelling records under symlinked allowed roots"
        );
        self.store.update(|state| {
            for id in &ids {
                if let Some(usage) = state
                    .volumes
                    .get_mut(id)
                    .and_then(|v| v.nodes.get_mut(node))
                {
                    respell(usage);
                }
            }
            Ok::<_, DriverError>(())
        })
    }

    /// A staging or target path of a request, checked (see [`rules::allowed_path`] and
    /// [`NodePath::check`]).
    pub(crate) fn allowed(&self, path: &str, field: &'static str) -> Result<NodePath, DriverError> {
        let roots = &self.config.allowed_path_roots;
        let path = rules::allowed_path(path, field, roots, &self.config.state_dir)?;
        // The innermost root the path lies under (allowed_path found at least one).
        let root = roots
            .iter()
            .filter(|root| path.starts_with(root))
            .max_by_key(|root| root.components().count())
            .cloned()
            .unwrap_or_default();
        let checked = NodePath::new(field, &root, &path);
        checked.check()?;
        Ok(checked)
    }

    fn ready_volume(&self, id: &str) -> Result<Volume, DriverError> {
        ready_volume(&*self.store.read()?, id).cloned()
    }

    fn record_node_use(
        &self,
        id: &str,
        change: impl FnOnce(&mut crate::state::NodeUse),
    ) -> Result<(), DriverError> {
        let node = self.config.node_id.clone();
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(id) {
                let usage = volume.nodes.entry(node.clone()).or_default();
                change(usage);
                if usage.staged.is_none() && usage.targets.is_empty() {
                    volume.nodes.remove(&node);
                }
            }
            Ok::<_, DriverError>(())
        })
    }

    fn node_stage(&self, request: &csi::NodeStageVolumeRequest) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let staging_at = self.allowed(&request.staging_target_path, "staging_target_path")?;
        let staging = staging_at.path();
        let (access_type, _) = rules::required_capability(request.volume_capability.as_ref())?;
        let flags = rules::mount_options(request.volume_capability.as_ref())?;
        let _guard = self.locks.acquire(&[id])?;
        let volume = self.lift_fence_if_republished(self.ready_volume(id)?)?;
        self.not_ephemeral(&volume, "NodeStageVolume")?;
        let node = &self.config.node_id;
        if volume.access_type != access_type {
            return Err(DriverError::AccessTypeMismatch);
        }
        let publication = volume.published.get(node);
        if self.config.enable_attach && publication.is_none() {
            return Err(DriverError::NotPublished {
                id: id.to_string(),
                node: node.clone(),
            });
        }
        if let Some(staged) = volume.nodes.get(node).and_then(|u| u.staged.as_ref()) {
            if Path::new(&staged.path) != staging {
                return Err(DriverError::StagedElsewhere {
                    id: id.to_string(),
                    path: staged.path.clone(),
                });
            }
            if staged.options != flags {
                return Err(DriverError::StagedWithOtherOptions { id: id.to_string() });
            }
            if self.staging_intact(&volume, staged)? {
                return Ok(());
            }
            tracing::warn!(
                volume = id,
                path = %staging.display(),
                "recorded as staged, but no longer is (a restart, or a reused loop device): staging again"
            );
        }
        need_mounts()?;
        let layout = volume.layout();
        let data = match layout {
            Layout::Ext4Image => self.export_of(&volume)?,
            Layout::Directory | Layout::Image => self.store.volume_data(id, layout),
        };
        let device = match access_type {
            AccessType::Mount => {
                staging_at.create_dir_all()?;
                let options = flags.read_only_if(publication.is_some_and(|p| p.readonly));
                if !is_mount_point(staging)? {
                    staging_at.bind_from(&data, &options)?;
                } else if !same_object(staging, &data)? {
                    return Err(DriverError::OtherMountAt {
                        id: id.to_string(),
                        path: staging.display().to_string(),
                    });
                } else if options.ask_anything() {
                    // Ours, from a staging a crash cut short: maybe without its flags yet.
                    staging_at.apply(&options)?;
                }
                None
            }
            AccessType::Block => Some(
                mounts::loop_attach(&data)
                    .map_err(|e| DriverError::io("attaching a loop device", e))?,
            ),
        };
        self.record_node_use(id, |usage| {
            usage.staged = Some(Staging {
                path: staging.display().to_string(),
                device,
                options: flags,
            });
        })
    }

    fn node_unstage(&self, request: &csi::NodeUnstageVolumeRequest) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let staging_at = self.allowed(&request.staging_target_path, "staging_target_path")?;
        let staging = staging_at.path();
        let _guard = self.locks.acquire(&[id])?;
        let volume = self.ready_volume(id)?;
        let staged = volume
            .nodes
            .get(&self.config.node_id)
            .and_then(|u| u.staged.clone());
        match staged {
            Some(staged) if Path::new(&staged.path) != staging => return Ok(()),
            Some(staged) => self.unstage_recorded(&volume, &staged)?,
            // Without the privilege nothing was staged.
            None if !mounts::can_mount() => return Ok(()),
            None => self.unstage_unrecorded(&volume, staging)?,
        }
        if !self.config.enable_attach {
            self.end_export(&volume, &self.config.node_id, true)?;
        }
        self.record_node_use(id, |usage| usage.staged = None)
    }

    fn unstage_recorded(&self, volume: &Volume, staged: &Staging) -> Result<(), DriverError> {
        need_mounts()?;
        let Some(device) = &staged.device else {
            return self.unmount_volume(volume, Path::new(&staged.path), None);
        };
        // A block volume mounts nothing at its staging path.
        if self.device_of_volume(volume, device)? {
            mounts::loop_detach(device)
                .map_err(|e| DriverError::io("detaching the loop device", e))?;
        } else {
            tracing::warn!(
                volume = %volume.id,
                device,
                "the recorded loop device is no longer bound to the volume: left alone"
            );
        }
        Ok(())
    }

    /// Undoes what a NodeStageVolume a crash cut short before its record did (the CO unstages
    /// a volume whose staging it is unsure of): the volume's mount at `staging`, or the loop
    /// device bound to a block volume's image, unless another node has it staged (the nodes
    /// of a machine share that device).
    fn unstage_unrecorded(&self, volume: &Volume, staging: &Path) -> Result<(), DriverError> {
        if volume.access_type == AccessType::Mount {
            return self.unmount_volume(volume, staging, None);
        }
        if volume.nodes.values().any(|u| u.staged.is_some()) {
            return Ok(());
        }
        let image = self.store.volume_data(&volume.id, volume.layout());
        let device = mounts::loop_device_of(&image)
            .map_err(|e| DriverError::io("finding the loop device", e))?;
        if let Some(device) = device {
            mounts::loop_detach(&device)
                .map_err(|e| DriverError::io("detaching the loop device", e))?;
        }
        Ok(())
    }

    /// Where this node reaches an ext4 volume: its export. With attach enabled the export is
    /// ControllerPublishVolume's to make; without, staging makes it.
    fn export_of(&self, volume: &Volume) -> Result<PathBuf, DriverError> {
        let node = &self.config.node_id;
        let at = self.store.export_path(node, &volume.id);
        if !self.config.enable_attach {
            self.ensure_export(volume, node)?;
        } else if !volume.exports.contains_key(node) || !is_mount_point(&at)? {
            return Err(DriverError::NoExport {
                id: volume.id.clone(),
                node: node.clone(),
            });
        }
        Ok(export::volume_root(&at))
    }

    /// What this node's mounts of a filesystem volume show once staged: the volume's
    /// directory, or the root of its ext4 export (looked up only; nothing is made here).
    fn mounted_data(&self, volume: &Volume) -> PathBuf {
        match volume.layout() {
            Layout::Ext4Image => {
                export::volume_root(&self.store.export_path(&self.config.node_id, &volume.id))
            }
            layout => self.store.volume_data(&volume.id, layout),
        }
    }

    /// Whether `device` is a loop device bound to `volume`'s image.
    fn device_of_volume(&self, volume: &Volume, device: &str) -> Result<bool, DriverError> {
        let image = self.store.volume_data(&volume.id, volume.layout());
        export::loop_bound_to(device, &image)
            .map_err(|e| DriverError::io("checking the loop device's image", e))
    }

    /// The loop device this node has bound to a block volume's image: the staged one while
    /// it is, else any other.
    fn loop_device_of(&self, volume: &Volume) -> Result<Option<String>, DriverError> {
        let staged = volume
            .nodes
            .get(&self.config.node_id)
            .and_then(|u| u.staged.as_ref()?.device.clone());
        if let Some(device) = staged
            && self.device_of_volume(volume, &device)?
        {
            return Ok(Some(device));
        }
        let image = self.store.volume_data(&volume.id, volume.layout());
        mounts::loop_device_of(&image).map_err(|e| DriverError::io("finding the loop device", e))
    }

    /// Unmounts every layer of `volume` mounted at `path` (its data, or for a block volume
    /// its loop `device`), and refuses, leaving it alone, a mount there that is something
    /// else's.
    pub(crate) fn unmount_volume(
        &self,
        volume: &Volume,
        path: &Path,
        device: Option<&str>,
    ) -> Result<(), DriverError> {
        while is_mount_point(path)? {
            let ours = match (device, volume.layout()) {
                (Some(device), _) => same_block_device(path, Path::new(device))?,
                (None, Layout::Image) => false,
                (None, Layout::Directory) => same_object(path, &self.mounted_data(volume))?,
                // A cut export (a fence) leaves the node's mounts of the filesystem with
                // nothing to compare them with: they are taken as the volume's.
                (None, Layout::Ext4Image) => {
                    let export = self.store.export_path(&self.config.node_id, &volume.id);
                    same_object(path, &self.mounted_data(volume))? || !is_mount_point(&export)?
                }
            };
            if !ours {
                return Err(DriverError::OtherMountAt {
                    id: volume.id.clone(),
                    path: path.display().to_string(),
                });
            }
            need_mounts()?;
            mounts::unmount_top(path).map_err(|e| DriverError::io("unmounting", e))?;
        }
        Ok(())
    }

    /// Whether what `staged` records is still there: the volume's data mounted at its path
    /// (filesystem), or its loop device still bound to the volume's image (block).
    fn staging_intact(&self, volume: &Volume, staged: &Staging) -> Result<bool, DriverError> {
        match &staged.device {
            Some(device) => self.device_of_volume(volume, device),
            None => same_object(Path::new(&staged.path), &self.mounted_data(volume)),
        }
    }

    /// Whether `target` still shows what publishing put there over the intact `staged`: the
    /// volume's data (filesystem) or its loop device (block).
    fn target_intact(
        &self,
        volume: &Volume,
        staged: &Staging,
        target: &Path,
    ) -> Result<bool, DriverError> {
        match &staged.device {
            Some(device) => same_block_device(target, Path::new(device)),
            None => same_object(target, &self.mounted_data(volume)),
        }
    }

    fn node_publish(&self, request: &csi::NodePublishVolumeRequest) -> Result<(), DriverError> {
        if ephemeral::requested(&request.volume_context) {
            return self.publish_ephemeral(request);
        }
        let id = required(&request.volume_id, "volume_id")?;
        let target_at = self.allowed(&request.target_path, "target_path")?;
        let target = target_at.path();
        let staging = self
            .allowed(&request.staging_target_path, "staging_target_path")?
            .path()
            .to_path_buf();
        let (access_type, mode) = rules::required_capability(request.volume_capability.as_ref())?;
        let flags = rules::mount_options(request.volume_capability.as_ref())?;
        let readonly = request.readonly || rules::read_only_mode(mode) || flags.readonly;
        let options = flags.read_only_if(readonly);
        let _guard = self.locks.acquire(&[id])?;
        let volume = self.lift_fence_if_republished(self.ready_volume(id)?)?;
        if volume.access_type != access_type {
            return Err(DriverError::AccessTypeMismatch);
        }
        let usage = volume
            .nodes
            .get(&self.config.node_id)
            .cloned()
            .unwrap_or_default();
        let not_staged = || DriverError::NotStaged {
            id: id.to_string(),
            path: staging.display().to_string(),
        };
        let Some(staged) = usage
            .staged
            .as_ref()
            .filter(|s| Path::new(&s.path) == staging)
        else {
            return Err(not_staged());
        };
        // Gone since (a restart): the caller stages again first.
        if !self.staging_intact(&volume, staged)? {
            return Err(not_staged());
        }
        let target_key = target.display().to_string();
        if let Some(existing) = usage.targets.get(&target_key) {
            if existing.readonly != readonly
                || existing.access_mode != mode as i32
                || existing.options != flags
            {
                return Err(DriverError::PublishedWithOtherOptions {
                    id: id.to_string(),
                    target: target_key,
                });
            }
            if self.target_intact(&volume, staged, target)? {
                return Ok(());
            }
        }
        if rules::single_writer(mode) && usage.targets.keys().any(|t| *t != target_key) {
            return Err(DriverError::SingleWriterInUse { id: id.to_string() });
        }
        need_mounts()?;
        if is_mount_point(target)? {
            if !self.target_intact(&volume, staged, target)? {
                return Err(DriverError::OtherMountAt {
                    id: id.to_string(),
                    path: target_key,
                });
            }
            if options.ask_anything() {
                // Ours, from a publishing a crash cut short: maybe without its flags yet.
                target_at.apply(&options)?;
            }
        } else {
            let source = match (access_type, &staged.device) {
                (AccessType::Mount, _) => {
                    target_at.create_dir_all()?;
                    staging.clone()
                }
                (AccessType::Block, Some(device)) => {
                    target_at.create_file()?;
                    PathBuf::from(device)
                }
                (AccessType::Block, None) => {
                    return Err(DriverError::NoLoopDevice { id: id.to_string() });
                }
            };
            target_at.bind_from(&source, &options)?;
        }
        self.record_node_use(id, |usage| {
            usage.targets.insert(
                target_key,
                Target {
                    readonly,
                    access_mode: mode as i32,
                    options: flags,
                },
            );
        })
    }

    fn node_unpublish(&self, request: &csi::NodeUnpublishVolumeRequest) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let target_at = self.allowed(&request.target_path, "target_path")?;
        let target = target_at.path();
        let _guard = self.locks.acquire(&[id])?;
        if let Some(done) = self.unpublish_ephemeral(id, &target_at) {
            return done;
        }
        let volume = self.ready_volume(id)?;
        let device = match volume.access_type {
            AccessType::Mount => None,
            AccessType::Block => self.loop_device_of(&volume)?,
        };
        self.unmount_volume(&volume, target, device.as_deref())?;
        // Only an empty directory or our placeholder file: never delete data recursively.
        let removed = match fs::symlink_metadata(target) {
            Ok(meta) if meta.is_dir() => fs::remove_dir(target),
            Ok(_) => fs::remove_file(target),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        };
        removed.map_err(|e| {
            DriverError::io(format!("removing target path {}", target.display()), e)
        })?;
        let key = target.display().to_string();
        self.record_node_use(id, |usage| {
            usage.targets.remove(&key);
        })
    }

    /// The volume, if `path` is one of its staging or target paths on this node.
    fn volume_at(&self, id: &str, path: &str) -> Result<Volume, DriverError> {
        let volume = self.ready_volume(id)?;
        let usage = volume.nodes.get(&self.config.node_id);
        // Recorded as staging and publishing checked them; a path that fails the check is
        // none of them.
        let key = match self.allowed(path, "volume_path") {
            Ok(checked) => checked.path().display().to_string(),
            Err(_) => path.to_string(),
        };
        let known = usage.is_some_and(|u| {
            u.targets.contains_key(&key) || u.staged.as_ref().is_some_and(|s| s.path == key)
        });
        if known {
            Ok(volume)
        } else {
            Err(DriverError::NotAtPath {
                id: id.to_string(),
                path: path.to_string(),
            })
        }
    }

    pub(crate) fn stats(
        &self,
        request: &csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, DriverError> {
        use csi::volume_usage::Unit;
        let id = required(&request.volume_id, "volume_id")?;
        let path = rules::required_within(&request.volume_path, "volume_path", rules::MAX_PATH)?;
        let volume = self.volume_at(id, path)?;
        let layout = volume.layout();
        let data = self.store.volume_data(id, layout);
        let total = i64::try_from(volume.capacity_bytes).unwrap_or(i64::MAX);
        let mut usage = vec![];
        match layout {
            Layout::Image => usage.push(csi::VolumeUsage {
                available: 0,
                total,
                used: 0,
                unit: Unit::Bytes as i32,
            }),
            Layout::Ext4Image => {
                let fs =
                    rustix::fs::statvfs(path).map_err(|e| DriverError::io("statvfs", e.into()))?;
                let bytes = |blocks: u64| {
                    i64::try_from(blocks.saturating_mul(fs.f_frsize)).unwrap_or(i64::MAX)
                };
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                usage.push(csi::VolumeUsage {
                    available: bytes(fs.f_bavail),
                    total: bytes(fs.f_blocks),
                    used: bytes(fs.f_blocks.saturating_sub(fs.f_bfree)),
                    unit: Unit::Bytes as i32,
                });
                usage.push(csi::VolumeUsage {
                    available: count(fs.f_ffree),
                    total: count(fs.f_files),
                    used: count(fs.f_files.saturating_sub(fs.f_ffree)),
                    unit: Unit::Inodes as i32,
                });
            }
            Layout::Directory => {
                let (bytes, inodes) =
                    data::usage(&data).map_err(|e| DriverError::io("measuring usage", e))?;
                let used = i64::try_from(bytes).unwrap_or(i64::MAX);
                usage.push(csi::VolumeUsage {
                    available: (total - used).max(0),
                    total,
                    used,
                    unit: Unit::Bytes as i32,
                });
                let fs =
                    rustix::fs::statvfs(&data).map_err(|e| DriverError::io("statvfs", e.into()))?;
                let used_inodes = i64::try_from(inodes).unwrap_or(i64::MAX);
                let free_inodes = i64::try_from(fs.f_ffree).unwrap_or(i64::MAX);
                usage.push(csi::VolumeUsage {
                    available: free_inodes,
                    total: used_inodes.saturating_add(free_inodes),
                    used: used_inodes,
                    unit: Unit::Inodes as i32,
                });
            }
        }
        Ok(csi::NodeGetVolumeStatsResponse { usage })
    }

    /// A volume's health from this node, including for paths where staging or publishing
    /// failed (the CO may name where it attempted them).
    pub(crate) fn node_volume_health_of(
        &self,
        volume_id: &str,
        paths: NodePaths<'_>,
    ) -> Result<csi::VolumeHealth, DriverError> {
        let id = required(volume_id, "volume_id")?;
        for path in [paths.publish, paths.staging].into_iter().flatten() {
            rules::required_within(path, "volume path", rules::MAX_PATH)?;
        }
        let volume = self.ready_volume(id)?;
        Ok(csi::VolumeHealth {
            volume_id: id.to_string(),
            health_statuses: self.node_volume_health(&volume, paths),
        })
    }

    fn node_health(
        &self,
        request: &csi::NodeGetVolumeHealthRequest,
    ) -> Result<csi::NodeGetVolumeHealthResponse, DriverError> {
        self.health_rpcs_served("NodeGetVolumeHealth")?;
        let paths = NodePaths {
            publish: Some(request.volume_publish_path.as_str()).filter(|p| !p.is_empty()),
            staging: Some(request.staging_target_path.as_str()).filter(|p| !p.is_empty()),
        };
        Ok(csi::NodeGetVolumeHealthResponse {
            volume_health: Some(self.node_volume_health_of(&request.volume_id, paths)?),
        })
    }

    fn node_expand(
        &self,
        request: &csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let path = rules::required_within(&request.volume_path, "volume_path", rules::MAX_PATH)?;
        if let Some(capability) = &request.volume_capability {
            rules::capability(capability)?;
        }
        let volume = self.volume_at(id, path)?;
        if let Some(export) = volume.exports.get(&self.config.node_id) {
            let bytes = export::device_bytes(&export.device)
                .map_err(|e| DriverError::io("reading the export's size", e))?;
            export::resize_filesystem(Path::new(path), bytes).map_err(|error| {
                if error.kind() == std::io::ErrorKind::PermissionDenied {
                    DriverError::MissingPrivilege {
                        action: "growing an ext4 filesystem online",
                        privilege: "CAP_SYS_RESOURCE",
                    }
                } else {
                    DriverError::io("growing the ext4 filesystem", error)
                }
            })?;
        }
        if let Some(device) = volume
            .nodes
            .get(&self.config.node_id)
            .and_then(|u| u.staged.as_ref()?.device.clone())
        {
            if !self.device_of_volume(&volume, &device)? {
                return Err(DriverError::NoLoopDevice { id: id.to_string() });
            }
            mounts::loop_refresh(&device)
                .map_err(|e| DriverError::io("refreshing the loop device size", e))?;
        }
        let required_bytes = request
            .capacity_range
            .as_ref()
            .map_or(0, |r| r.required_bytes);
        let capacity = i64::try_from(volume.capacity_bytes)
            .unwrap_or(i64::MAX)
            .max(required_bytes);
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: capacity,
        })
    }

    /// Keeps this node's access to every volume in line with ControllerPublishVolume:
    /// fences the volumes unpublished from this node while it still uses them (kill its
    /// writers, remount read-only, record it), and lifts the fence once a volume is published
    /// to this node again. Returns the volumes whose fencing changed.
    pub fn reconcile_fencing(&self) -> Result<Vec<String>, DriverError> {
        if !self.config.enable_attach {
            return Ok(Vec::new());
        }
        let node = &self.config.node_id;
        let mut changed = Vec::new();
        for volume in self.store.read()?.volumes.values() {
            // Never ControllerPublished: an ephemeral volume is its node's alone.
            let Some(usage) = volume
                .nodes
                .get(node)
                .filter(|_| volume.ephemeral.is_none())
            else {
                continue;
            };
            let published = volume.published.contains_key(node);
            let fenced = volume.fenced.contains_key(node);
            if !published && !fenced && self.fence(volume, usage)? {
                changed.push(volume.id.clone());
            } else if published && fenced {
                self.unfence(volume)?;
                changed.push(volume.id.clone());
            }
        }
        Ok(changed)
    }

    fn fence(&self, volume: &Volume, usage: &NodeUse) -> Result<bool, DriverError> {
        let node = &self.config.node_id;
        // Re-read right before acting: a volume published again meanwhile keeps its writers.
        let current = self.store.read()?;
        if current
            .volumes
            .get(&volume.id)
            .is_none_or(|v| v.published.contains_key(node))
        {
            return Ok(false);
        }
        let paths: Vec<PathBuf> = usage
            .targets
            .keys()
            .map(PathBuf::from)
            .chain(usage.staged.iter().map(|s| PathBuf::from(&s.path)))
            .collect();
        let (killed, stuck) = fence_paths(&paths);
        if !stuck.is_empty() {
            tracing::warn!(volume = %volume.id, node = %node, ?stuck, "fencing incomplete, retrying");
            return Ok(false);
        }
        let republished = self.store.update(|state| {
            let Some(v) = state.volumes.get_mut(&volume.id) else {
                return Ok::<_, DriverError>(false);
            };
            if v.published.contains_key(node) {
                return Ok(true);
            }
            v.fenced.insert(node.clone(), now_millis());
            Ok(false)
        })?;
        if republished {
            // Published again while we fenced: give the access back at once.
            self.restore_access(volume)?;
            return Ok(false);
        }
        tracing::warn!(volume = %volume.id, node = %node, writers_killed = killed, ?paths, "fenced node from unpublished volume");
        Ok(true)
    }

    /// A volume published to this node again must be writable before staging or publishing
    /// reuses its mounts, so the fence is lifted here too, not only by the periodic loop.
    fn lift_fence_if_republished(&self, volume: Volume) -> Result<Volume, DriverError> {
        let node = &self.config.node_id;
        if volume.fenced.contains_key(node) && volume.published.contains_key(node) {
            self.unfence(&volume)?;
            return self.ready_volume(&volume.id);
        }
        Ok(volume)
    }

    /// Lifts this node's fence on a volume published to it again.
    fn unfence(&self, volume: &Volume) -> Result<(), DriverError> {
        self.restore_access(volume)?;
        let node = &self.config.node_id;
        self.store.update(|state| {
            if let Some(v) = state.volumes.get_mut(&volume.id) {
                v.fenced.remove(node);
            }
            Ok::<_, DriverError>(())
        })?;
        tracing::info!(volume = %volume.id, node = %node, "lifted fencing: volume published to this node again");
        Ok(())
    }

    /// Remounts this node's mounts of `volume` writable again, except read-only ones.
    fn restore_access(&self, volume: &Volume) -> Result<(), DriverError> {
        let node = &self.config.node_id;
        let Some(usage) = volume.nodes.get(node) else {
            return Ok(());
        };
        let published_readonly = volume.published.get(node).is_some_and(|p| p.readonly);
        let mounts = usage
            .staged
            .iter()
            .map(|s| {
                let readonly = published_readonly || s.options.readonly;
                (PathBuf::from(&s.path), readonly)
            })
            .chain(
                usage
                    .targets
                    .iter()
                    .map(|(path, target)| (PathBuf::from(path), target.readonly)),
            );
        for (path, readonly) in mounts {
            if !readonly && mounts::is_mount_point(&path).unwrap_or(false) {
                mounts::remount_read_write(&path).map_err(|e| {
                    DriverError::io(format!("remounting {} writable", path.display()), e)
                })?;
            }
        }
        Ok(())
    }

    fn node_info(&self) -> csi::NodeGetInfoResponse {
        csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node,
            accessible_topology: Some(self.topology(&self.config.node_id)),
        }
    }

    fn node_capabilities(&self) -> csi::NodeGetCapabilitiesResponse {
        let mut rpcs = [
            Rpc::StageUnstageVolume,
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            Rpc::SingleNodeMultiWriter,
        ]
        .map(|rpc| rpc as i32)
        .to_vec();
        if self.config.volume_health.rpcs() {
            rpcs.extend([Rpc::GetVolumeHealth as i32, Rpc::GetStorageHealth as i32]);
        }
        if self.config.volume_health.volume_condition() {
            rpcs.push(LEGACY_NODE_VOLUME_CONDITION);
        }
        csi::NodeGetCapabilitiesResponse {
            capabilities: rpcs
                .into_iter()
                .map(|rpc| csi::NodeServiceCapability {
                    r#type: Some(csi::node_service_capability::Type::Rpc(
                        csi::node_service_capability::Rpc { r#type: rpc },
                    )),
                })
                .collect(),
        }
    }
}

/// Whether `a` and `b` are one file or directory (device and inode): a bind mount shows its
/// source's. A path that does not exist is no match.
pub(crate) fn same_object(a: &Path, b: &Path) -> Result<bool, DriverError> {
    let (Some(a), Some(b)) = (metadata(a)?, metadata(b)?) else {
        return Ok(false);
    };
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// Whether `target` is a block device node of the same device number as `device`.
fn same_block_device(target: &Path, device: &Path) -> Result<bool, DriverError> {
    let (Some(target), Some(device)) = (metadata(target)?, metadata(device)?) else {
        return Ok(false);
    };
    Ok(target.file_type().is_block_device()
        && device.file_type().is_block_device()
        && target.rdev() == device.rdev())
}

fn metadata(path: &Path) -> Result<Option<fs::Metadata>, DriverError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(Some(meta)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(DriverError::io(
            format!("reading {}", path.display()),
            error,
        )),
    }
}

/// [`mounts::is_mount_point`], its failure an `INTERNAL` one.
pub(crate) fn is_mount_point(path: &Path) -> Result<bool, DriverError> {
    mounts::is_mount_point(path).map_err(|e| DriverError::io("reading mounts", e))
}

/// Stops writes under `paths`: kill the processes writing there, wait (bounded) until they
/// have let go of their files, and remount the mounts read-only so nothing can start writing
/// again. Returns how many writers were killed and the mounts that could not be made
/// read-only (still busy: the caller retries).
fn fence_paths(paths: &[PathBuf]) -> (usize, Vec<PathBuf>) {
    let mut killed = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        let writers = mounts::writers_under(paths);
        if writers.is_empty() || std::time::Instant::now() >= deadline {
            break;
        }
        for pid in writers {
            mounts::kill(pid);
            killed += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stuck = paths
        .iter()
        .filter(|path| mounts::is_mount_point(path).unwrap_or(false))
        .filter(|path| mounts::remount_read_only(path).is_err())
        .cloned()
        .collect();
    (killed, stuck)
}

crate::driver::blocking_service! {
    NodeService: Node {
        node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse => |d, r| d.node_stage(&r).map(|()| csi::NodeStageVolumeResponse {});
        node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse => |d, r| d.node_unstage(&r).map(|()| csi::NodeUnstageVolumeResponse {});
        node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse => |d, r| d.node_publish(&r).map(|()| csi::NodePublishVolumeResponse {});
        node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse => |d, r| d.node_unpublish(&r).map(|()| csi::NodeUnpublishVolumeResponse {});
        node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse => |d, r| d.stats(&r);
        node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse => |d, r| d.node_expand(&r);
        node_get_capabilities(csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse => |d, _r| Ok(d.node_capabilities());
        node_get_volume_health(csi::NodeGetVolumeHealthRequest) -> csi::NodeGetVolumeHealthResponse => |d, r| d.node_health(&r);
        node_get_storage_health(csi::NodeGetStorageHealthRequest) -> csi::NodeGetStorageHealthResponse => |d, _r| {
            d.health_rpcs_served("NodeGetStorageHealth")?;
            Ok(csi::NodeGetStorageHealthResponse { backend_health: d.storage_health() })
        };
        node_get_info(csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse => |d, _r| Ok(d.node_info());
    }
}
