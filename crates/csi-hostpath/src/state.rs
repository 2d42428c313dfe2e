//! The driver's persistent state, shared by every instance on the machine through the state
//! directory. Each change is a transaction under an exclusive `flock` on `state.lock`: catch
//! up on what other instances committed, apply the change, and commit the rows it changed to
//! the state file (see [`crate::journal`]: appended and fdatasynced, so a change costs the rows
//! it touched, not the number of volumes). A crash at any point leaves every acknowledged change
//! on disk and no torn one. Each process keeps the state in memory and reads only what others
//! appended since. A file that does not parse is never overwritten: the driver refuses to work
//! with it and names it.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::journal::{self, Position};
use crate::options::MountOptions;
use crate::table::{Row, Table};

const STATE_FILE: &str = "state.log";
/// The state file of drivers before the journal: the whole state, rewritten on every change.
/// Read once, when found without a `state.log`, and replaced by one.
const WHOLE_STATE_FILE: &str = "state.json";
const LOCK_FILE: &str = "state.lock";
const STATE_VERSION: u32 = 1;
const INSTANCES: &str = "instances";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file {path} is corrupt ({reason}); refusing to use or overwrite it")]
    Corrupt { path: PathBuf, reason: String },
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessType {
    Mount,
    Block,
}

/// The filesystem a mount volume carries. Without one (no fsType) the volume is a directory on
/// the state disk; with ext4 it is an image file each node reaches only through its own loop
/// device (its export), which ControllerUnpublishVolume cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Filesystem {
    Ext4,
}

/// How a volume's or snapshot's data is kept in the state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A directory (a mount volume without fsType); its snapshots are tar archives.
    Directory,
    /// A sparse image file (a block volume); its snapshots are copies.
    Image,
    /// An ext4 filesystem in a sparse image file; its snapshots are copies.
    Ext4Image,
}

impl Layout {
    pub fn of(access_type: AccessType, filesystem: Option<Filesystem>) -> Self {
        match (access_type, filesystem) {
            (AccessType::Block, _) => Self::Image,
            (AccessType::Mount, None) => Self::Directory,
            (AccessType::Mount, Some(Filesystem::Ext4)) => Self::Ext4Image,
        }
    }

    /// Image layouts are copied as files; a directory is walked.
    pub fn is_image(self) -> bool {
        self != Self::Directory
    }
}

/// Where a volume is in its life; only `Ready` volumes are visible to the CO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Recorded before its data exists; a repeated CreateVolume finishes it.
    Creating,
    Ready,
    /// Data removal started; a repeated DeleteVolume (or restart) finishes it.
    Deleting,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "id")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

impl ContentSource {
    /// What the source is, as messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Snapshot(_) => "snapshot",
            Self::Volume(_) => "volume",
        }
    }
}

/// A ControllerPublishVolume to one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub readonly: bool,
}

/// What one node instance has done with a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUse {
    /// Staging path, and the loop device of a block volume.
    pub staged: Option<Staging>,
    /// Target path → publication details.
    pub targets: BTreeMap<String, Target>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    pub path: String,
    pub device: Option<String>,
    /// The mount flags the staging mount was made with.
    #[serde(default, skip_serializing_if = "is_default")]
    pub options: MountOptions,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub readonly: bool,
    /// Access mode of the NodePublishVolume (prost enum value).
    pub access_mode: i32,
    /// The mount flags the publication was made with.
    #[serde(default, skip_serializing_if = "is_default")]
    pub options: MountOptions,
}

fn is_default(options: &MountOptions) -> bool {
    !options.ask_anything()
}

/// What makes a volume a CSI ephemeral inline volume: made by NodePublishVolume on `node` for
/// the one `target` path (a pod's), and deleted by its NodeUnpublishVolume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ephemeral {
    pub node: String,
    pub target: String,
}

/// A node's own way to an ext4 volume's data: a loop device on the image, mounted at
/// [`Store::export_path`]. NodeStageVolume bind-mounts the export; cutting it ends every access
/// through it, whatever mounts or open files the node still has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    pub device: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub capacity_bytes: u64,
    pub access_type: AccessType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Filesystem>,
    pub phase: Phase,
    /// Node whose capacity the volume uses.
    pub home_node: String,
    /// Capacity pool (StorageClass parameter `kind`).
    pub kind: String,
    /// Nodes the volume is accessible from (empty: every node).
    pub accessible_nodes: Vec<String>,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    pub source: Option<ContentSource>,
    /// ControllerPublishVolume state by node.
    pub published: BTreeMap<String, Publication>,
    /// Node-side state by node.
    pub nodes: BTreeMap<String, NodeUse>,
    /// Nodes whose access was fenced after ControllerUnpublishVolume, with the time (ms).
    pub fenced: BTreeMap<String, u64>,
    /// Exports of an ext4 volume by node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exports: BTreeMap<String, Export>,
    /// The instance creating the volume's data (see [`Store::register_instance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
    /// Set on an ephemeral inline volume, which its node alone makes and deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<Ephemeral>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: u64,
    pub access_type: AccessType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Filesystem>,
    pub phase: Phase,
    pub created_unix_nanos: u128,
    /// The group snapshot this snapshot belongs to, if any.
    #[serde(default)]
    pub group_snapshot_id: Option<String>,
    /// The instance taking the snapshot (see [`Store::register_instance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
}

/// A VolumeGroupSnapshot: member snapshots taken together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub id: String,
    pub name: String,
    pub source_volume_ids: Vec<String>,
    pub snapshot_ids: Vec<String>,
    pub phase: Phase,
    pub created_unix_nanos: u128,
    /// The instance taking the member snapshots (see [`Store::register_instance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    pub volumes: Table<Volume>,
    pub snapshots: Table<Snapshot>,
    #[serde(default)]
    pub groups: Table<GroupSnapshot>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            version: STATE_VERSION,
            volumes: Table::default(),
            snapshots: Table::default(),
            groups: Table::default(),
        }
    }
}

/// The rows one transaction changed (`None`: removed): one line of the state file. Unknown
/// fields are refused: a damaged name must not read as "no change".
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, Option<Volume>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, Option<Snapshot>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, Option<GroupSnapshot>>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty() && self.snapshots.is_empty() && self.groups.is_empty()
    }
}

/// What volumes are summed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VolumeTally {
    /// Bytes of a capacity pool (`kind`) on a node.
    Capacity { node: String, kind: String },
    /// Volumes ControllerPublished to a node.
    Published { node: String },
}

impl Row for Volume {
    type Tally = VolumeTally;

    fn name(&self) -> &str {
        &self.name
    }

    fn tallies(&self) -> Vec<(VolumeTally, u64)> {
        let capacity = VolumeTally::Capacity {
            node: self.home_node.clone(),
            kind: self.kind.clone(),
        };
        let published = self.published.keys().map(|node| {
            let node = node.clone();
            (VolumeTally::Published { node }, 1)
        });
        std::iter::once((capacity, self.capacity_bytes))
            .chain(published)
            .collect()
    }
}

impl Row for Snapshot {
    type Tally = std::convert::Infallible;

    fn name(&self) -> &str {
        &self.name
    }
}

impl Row for GroupSnapshot {
    type Tally = std::convert::Infallible;

    fn name(&self) -> &str {
        &self.name
    }
}

impl Volume {
    pub fn layout(&self) -> Layout {
        Layout::of(self.access_type, self.filesystem)
    }
}

impl Snapshot {
    pub fn layout(&self) -> Layout {
        Layout::of(self.access_type, self.filesystem)
    }
}

impl State {
    pub fn volume_by_name_mut(&mut self, name: &str) -> Option<&mut Volume> {
        self.volumes.by_name_mut(name)
    }

    pub fn snapshot_by_name_mut(&mut self, name: &str) -> Option<&mut Snapshot> {
        self.snapshots.by_name_mut(name)
    }

    /// Ends the open transaction, keeping its changes.
    pub(crate) fn commit(&mut self) -> Change {
        Change {
            volumes: self.volumes.commit(),
            snapshots: self.snapshots.commit(),
            groups: self.groups.commit(),
        }
    }

    /// Ends the open transaction, undoing it.
    fn roll_back(&mut self) {
        self.volumes.roll_back();
        self.snapshots.roll_back();
        self.groups.roll_back();
    }

    /// Applies a change another transaction committed.
    pub(crate) fn apply(&mut self, change: Change) {
        self.volumes.apply(change.volumes);
        self.snapshots.apply(change.snapshots);
        self.groups.apply(change.groups);
    }

    fn check_version(&self) -> Result<(), String> {
        if self.version == STATE_VERSION {
            Ok(())
        } else {
            Err(format!("unsupported version {}", self.version))
        }
    }

    /// Bytes used on `node` in pool `kind`.
    pub fn used_bytes(&self, node: &str, kind: &str) -> u64 {
        self.volumes.total(&VolumeTally::Capacity {
            node: node.to_string(),
            kind: kind.to_string(),
        })
    }

    /// Volumes published to `node`.
    pub fn published_count(&self, node: &str) -> usize {
        let node = node.to_string();
        usize::try_from(self.volumes.total(&VolumeTally::Published { node })).unwrap_or(usize::MAX)
    }
}

/// The state directory: data of volumes and snapshots, the state file, heartbeats.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// The state as this process last read or wrote it; shared by every clone.
    cache: Arc<Mutex<Cache>>,
}

#[derive(Debug, Default)]
struct Cache {
    state: Arc<State>,
    /// How much of the state file `state` holds: `None` before the first read and after a
    /// failed one or a failed write (the next access reads the file whole).
    position: Option<Position>,
}

impl Store {
    /// Opens (creating if needed) the state directory and checks the state file loads.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        for sub in ["", "volumes", "snapshots", "nodes", INSTANCES] {
            let path = dir.join(sub);
            fs::create_dir_all(&path).map_err(io_error(&path))?;
        }
        let store = Self {
            dir: dir.to_path_buf(),
            cache: Arc::default(),
        };
        store.adopt_whole_state_file()?;
        store.read()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state_file(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Where a volume's data lives: a directory or an image file.
    pub fn volume_data(&self, id: &str, layout: Layout) -> PathBuf {
        match layout {
            Layout::Directory => self.dir.join("volumes").join(id),
            Layout::Image | Layout::Ext4Image => self.dir.join("volumes").join(format!("{id}.img")),
        }
    }

    /// Where a snapshot's data lives: a tar archive (directory) or an image copy.
    pub fn snapshot_data(&self, id: &str, layout: Layout) -> PathBuf {
        match layout {
            Layout::Directory => self.dir.join("snapshots").join(format!("{id}.tar")),
            Layout::Image | Layout::Ext4Image => {
                self.dir.join("snapshots").join(format!("{id}.img"))
            }
        }
    }

    /// Where a node's export of an ext4 volume is mounted.
    pub fn export_path(&self, node: &str, id: &str) -> PathBuf {
        self.dir.join("exports").join(node).join(id)
    }

    /// Volume and snapshot data no record names. The directories are listed before the state
    /// is read: data is only ever made after its record, so whatever was listed and has no
    /// record in the state read next was never recorded, or was deleted meanwhile.
    pub fn data_without_record(&self) -> Result<Vec<PathBuf>, StoreError> {
        let list = |sub: &str| {
            let dir = self.dir.join(sub);
            let entries = fs::read_dir(&dir).map_err(io_error(&dir))?;
            let mut found = Vec::new();
            for entry in entries {
                let path = entry.map_err(io_error(&dir))?.path();
                // `<id>`, `<id>.img`, `<id>.tar`, `<id>.tar.partial`, ...
                let id = path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .and_then(|name| name.split('.').next())
                    .unwrap_or_default()
                    .to_string();
                found.push((id, path));
            }
            Ok::<_, StoreError>(found)
        };
        let (volumes, snapshots) = (list("volumes")?, list("snapshots")?);
        let state = self.read()?;
        let volumes = volumes
            .into_iter()
            .filter(|(id, _)| !state.volumes.contains_key(id));
        let snapshots = snapshots
            .into_iter()
            .filter(|(id, _)| !state.snapshots.contains_key(id));
        Ok(volumes.chain(snapshots).map(|(_, path)| path).collect())
    }

    /// The heartbeat file of a node instance.
    pub fn heartbeat(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    /// The current state, caught up under a shared lock. Cheap: the state is shared with the
    /// cache until the next change (which then copies it if it is still held).
    pub fn read(&self) -> Result<Arc<State>, StoreError> {
        let mut cache = self.cache();
        let lock = self.lock_file_to_read()?;
        lock.lock_shared()
            .map_err(io_error(&self.dir.join(LOCK_FILE)))?;
        self.catch_up(&mut cache)?;
        Ok(Arc::clone(&cache.state))
    }

    /// Runs `change` on the current state under the exclusive lock and commits the rows it
    /// changed, if any. An error from `change` leaves the state untouched.
    pub fn update<T, E>(&self, change: impl FnOnce(&mut State) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let mut cache = self.cache();
        let lock = self.lock_file()?;
        lock.lock().map_err(io_error(&self.dir.join(LOCK_FILE)))?;
        self.catch_up(&mut cache)?;
        let state = Arc::make_mut(&mut cache.state);
        let output = match change(state) {
            Ok(output) => output,
            Err(error) => {
                state.roll_back();
                return Err(error);
            }
        };
        let committed = state.commit();
        if !committed.is_empty()
            && let Err(error) = self.persist(&mut cache, &committed)
        {
            // What reached the disk decides: read it whole next time.
            cache.position = None;
            return Err(error.into());
        }
        Ok(output)
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| {
            // A transaction panicked half way: forget what this process holds.
            let mut cache = poisoned.into_inner();
            cache.position = None;
            cache
        })
    }

    fn lock_file(&self) -> Result<File, StoreError> {
        let path = self.dir.join(LOCK_FILE);
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))
    }

    /// The lock file opened for reading, which a shared lock needs no more than: the state
    /// stays readable (and the health RPCs keep reporting) on a file system gone read-only.
    fn lock_file_to_read(&self) -> Result<File, StoreError> {
        let path = self.dir.join(LOCK_FILE);
        match File::open(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => self.lock_file(),
            opened => opened.map_err(io_error(&path)),
        }
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            path: self.state_file(),
            reason,
        }
    }

    /// Brings the cache up to the state file (under the lock): the changes appended since it
    /// last looked, or the whole file when it was compacted meanwhile or never read.
    fn catch_up(&self, cache: &mut Cache) -> Result<(), StoreError> {
        let result = self.catch_up_inner(cache);
        if result.is_err() {
            cache.position = None;
        }
        result
    }

    fn catch_up_inner(&self, cache: &mut Cache) -> Result<(), StoreError> {
        let path = self.state_file();
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                // Nothing committed yet: no other instance can have changed anything.
                if cache.position.is_none() {
                    cache.state = Arc::default();
                }
                return Ok(());
            }
            Err(error) => return Err(io_error(&path)(error)),
        };
        if let Some(position) = &mut cache.position {
            let mut prefix = [0; journal::HEADER_PREFIX_BYTES];
            let read = file.read_at(&mut prefix, 0).map_err(io_error(&path))?;
            let generation =
                journal::read_generation(&prefix[..read]).map_err(|e| self.corrupt(e))?;
            if generation == position.generation {
                let mut tail = Vec::new();
                file.seek(SeekFrom::Start(position.applied))
                    .and_then(|_| file.read_to_end(&mut tail))
                    .map_err(io_error(&path))?;
                if tail.is_empty() {
                    // Nothing new: the state readers may still hold is not copied.
                    position.torn = false;
                    return Ok(());
                }
                return journal::catch_up(Arc::make_mut(&mut cache.state), position, &tail)
                    .map_err(|e| self.corrupt(e));
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_error(&path))?;
        let parsed = journal::parse(&bytes, State::check_version).map_err(|e| self.corrupt(e))?;
        cache.state = Arc::new(parsed.state);
        cache.position = Some(parsed.position);
        Ok(())
    }

    /// Commits `change`, already applied to the cache: one appended line, or a compaction.
    fn persist(&self, cache: &mut Cache, change: &Change) -> Result<(), StoreError> {
        let path = self.state_file();
        match cache.position {
            Some(ref mut position) if !position.wants_compaction() => {
                let line = journal::encode_change(change).map_err(|e| self.corrupt(e))?;
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_error(&path))?;
                if position.torn {
                    file.set_len(position.applied).map_err(io_error(&path))?;
                }
                file.write_all_at(&line, position.applied)
                    .and_then(|()| file.sync_data())
                    .map_err(io_error(&path))?;
                position.applied += line.len() as u64;
                position.torn = false;
                Ok(())
            }
            _ => {
                let generation = cache.position.map_or(1, |p| p.generation + 1);
                self.compact(cache, generation)
            }
        }
    }

    /// Replaces the state file by one holding the cache's whole state as `generation`.
    fn compact(&self, cache: &mut Cache, generation: u64) -> Result<(), StoreError> {
        let path = self.state_file();
        let bytes = journal::encode_base(generation, &cache.state).map_err(|e| self.corrupt(e))?;
        csi_grpc::durable::replace(&path, &bytes).map_err(io_error(&path))?;
        let length = bytes.len() as u64;
        cache.position = Some(Position {
            generation,
            applied: length,
            base: length,
            torn: false,
        });
        Ok(())
    }

    /// A state directory of a driver before the journal has `state.json` and no `state.log`:
    /// its state becomes the first generation of `state.log`, then `state.json` goes.
    fn adopt_whole_state_file(&self) -> Result<(), StoreError> {
        let whole = self.dir.join(WHOLE_STATE_FILE);
        if !whole.exists() {
            return Ok(());
        }
        let lock = self.lock_file()?;
        lock.lock().map_err(io_error(&self.dir.join(LOCK_FILE)))?;
        if !self.state_file().exists() {
            let text = match fs::read(&whole) {
                Ok(text) => text,
                // Another instance adopted it first.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(error) => return Err(io_error(&whole)(error)),
            };
            let corrupt = |reason: String| StoreError::Corrupt {
                path: whole.clone(),
                reason,
            };
            let state: State = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
            state.check_version().map_err(corrupt)?;
            let mut cache = self.cache();
            cache.state = Arc::new(state);
            self.compact(&mut cache, 1)?;
            tracing::info!(from = %whole.display(), to = %self.state_file().display(), "state file converted");
        }
        fs::remove_file(&whole).map_err(io_error(&whole))?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error(&self.dir))
    }

    /// Marks `node`'s storage link down (`up == false`) or up again: a node whose link is down
    /// stops beating, so the podmon extension reports it disconnected. Fault injection for
    /// tests of a storage network failure; the node's fencing keeps working (the array side).
    pub fn set_link(&self, node: &str, up: bool) -> Result<(), StoreError> {
        let marker = self.link_down_marker(node);
        let result = if up {
            fs::remove_file(&marker).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        } else {
            fs::write(&marker, b"")
        };
        result.map_err(io_error(&marker))
    }

    fn link_down_marker(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(format!(".{node}.link-down"))
    }

    /// Records that `node`'s instance is alive now (unless its storage link is down). A beat
    /// is the heartbeat file's modification time: setting it writes no data block, so a full
    /// state filesystem (ENOSPC) does not make a live node look disconnected.
    pub fn beat(&self, node: &str) -> Result<(), StoreError> {
        if self.link_down_marker(node).exists() {
            return Ok(());
        }
        let path = self.heartbeat(node);
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_error(&path))?;
        file.set_modified(SystemTime::now())
            .map_err(io_error(&path))
    }

    /// Milliseconds since `node` last beat, or `None` if it never did.
    pub fn heartbeat_age_ms(&self, node: &str) -> Option<u64> {
        if !valid_node_name(node) {
            return None;
        }
        let beat = fs::metadata(self.heartbeat(node)).ok()?.modified().ok()?;
        let age = SystemTime::now().duration_since(beat).unwrap_or_default();
        Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
    }

    /// Nodes that ever registered a heartbeat.
    pub fn known_nodes(&self) -> Vec<String> {
        fs::read_dir(self.dir.join("nodes"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|name| !name.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A running instance of the driver, known to every other instance on the state directory
/// by a file it holds an exclusive `flock` on until it exits: the kernel releases the lock
/// however the process ends, so a record whose creator's lock is free was abandoned by a
/// crash, and one whose creator's lock is held is still being worked on.
#[derive(Debug)]
pub struct Instance {
    pub id: String,
    _lock: File,
}

impl Store {
    pub fn register_instance(&self) -> Result<Instance, StoreError> {
        let id = uuid::Uuid::new_v4().to_string();
        let path = self.dir.join(INSTANCES).join(&id);
        let lock = File::create(&path).map_err(io_error(&path))?;
        lock.lock().map_err(io_error(&path))?;
        Ok(Instance { id, _lock: lock })
    }

    /// Whether the instance `id` still runs. Only a registered instance's own file is ever
    /// locked, so one found unlocked is gone for good and its file is removed.
    pub fn instance_alive(&self, id: &str) -> bool {
        if uuid::Uuid::parse_str(id).is_err() {
            return false;
        }
        let path = self.dir.join(INSTANCES).join(id);
        let Ok(file) = File::open(&path) else {
            return false;
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = fs::remove_file(&path);
                false
            }
            Err(std::fs::TryLockError::WouldBlock) => true,
            Err(std::fs::TryLockError::Error(error)) => {
                tracing::warn!(instance = id, %error, "cannot tell whether an instance runs; assuming it does");
                true
            }
        }
    }

    /// Removes the files of instances that are gone.
    pub fn forget_gone_instances(&self) {
        let entries = fs::read_dir(self.dir.join(INSTANCES)).into_iter().flatten();
        for name in entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
        {
            self.instance_alive(&name);
        }
    }
}

/// Node IDs name heartbeat files; one that could escape the nodes directory names no node.
pub fn valid_node_name(node: &str) -> bool {
    !node.is_empty() && !node.contains('/') && !node.starts_with('.')
}

pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use super::*;

    pub(crate) fn volume(id: &str) -> Volume {
        Volume {
            id: id.into(),
            name: format!("name-{id}"),
            capacity_bytes: 10,
            access_type: AccessType::Mount,
            filesystem: None,
            phase: Phase::Ready,
            home_node: "n1".into(),
            kind: String::new(),
            accessible_nodes: vec![],
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            source: None,
            published: BTreeMap::new(),
            nodes: BTreeMap::new(),
            fenced: BTreeMap::new(),
            exports: BTreeMap::new(),
            creator: None,
            ephemeral: None,
        }
    }

    #[derive(Debug)]
    enum TestError {
        Store,
        Refused,
    }
    impl From<StoreError> for TestError {
        fn from(_: StoreError) -> Self {
            Self::Store
        }
    }

    #[test]
    fn updates_persist_and_failed_updates_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .update(|s| {
                s.volumes.insert("a".into(), volume("a"));
                Ok::<_, TestError>(())
            })
            .unwrap();
        let result = store.update(|s| {
            s.volumes.insert("b".into(), volume("b"));
            Err::<(), _>(TestError::Refused)
        });
        assert!(matches!(result, Err(TestError::Refused)));
        let reopened = Store::open(dir.path()).unwrap().read().unwrap();
        assert_eq!(reopened.volumes.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(reopened.used_bytes("n1", ""), 10);
        assert!(!dir.path().join("state.log.tmp").exists());
    }

    #[test]
    fn corrupt_state_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("state.json"), b"{ not json").unwrap();
        let error = Store::open(dir.path()).unwrap_err().to_string();
        assert!(error.contains("state.json"), "{error}");
        assert!(error.contains("corrupt"), "{error}");
        assert_eq!(
            fs::read(dir.path().join("state.json")).unwrap(),
            b"{ not json"
        );
    }

    #[test]
    fn concurrent_writers_lose_no_update() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let store = store.clone();
                scope.spawn(move || {
                    for i in 0..25 {
                        let id = format!("{t}-{i}");
                        store
                            .update(|s| {
                                s.volumes.insert(id.clone(), volume(&id));
                                Ok::<_, TestError>(())
                            })
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(store.read().unwrap().volumes.len(), 100);
    }

    fn add(store: &Store, id: &str) {
        store
            .update(|s| {
                s.volumes.insert(id.into(), volume(id));
                Ok::<_, TestError>(())
            })
            .unwrap();
    }

    fn ids(store: &Store) -> Vec<String> {
        store.read().unwrap().volumes.keys().cloned().collect()
    }

    #[test]
    fn a_change_appends_only_the_rows_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for i in 0..300 {
            add(&store, &format!("v{i:03}"));
        }
        let size = || fs::metadata(store.state_file()).unwrap().len();
        let before = size();
        store
            .update(|s| {
                s.volumes.get_mut("v150").unwrap().capacity_bytes = 20;
                Ok::<_, TestError>(())
            })
            .unwrap();
        let line = size() - before;
        let one_volume = serde_json::to_vec(&volume("v150")).unwrap().len() as u64;
        assert!(
            line < 2 * one_volume,
            "{line} bytes for one volume of {one_volume}"
        );
        // Nothing changed: nothing written.
        store
            .update(|s| {
                s.volumes.get_mut("v150").unwrap().capacity_bytes = 20;
                Ok::<_, TestError>(())
            })
            .unwrap();
        assert_eq!(size(), before + line);
    }

    #[test]
    fn reads_share_the_state_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        add(&store, "a");
        let held = store.read().unwrap();
        assert!(
            Arc::ptr_eq(&held, &store.read().unwrap()),
            "nothing new: the same state"
        );
        add(&store, "b");
        let now = store.read().unwrap();
        assert!(!Arc::ptr_eq(&held, &now));
        assert_eq!(
            held.volumes.len(),
            1,
            "a held state does not change under its reader"
        );
        assert_eq!(now.volumes.len(), 2);
    }

    #[test]
    fn instances_see_each_others_changes_across_compactions() {
        let dir = tempfile::tempdir().unwrap();
        let (one, other) = (
            Store::open(dir.path()).unwrap(),
            Store::open(dir.path()).unwrap(),
        );
        add(&one, "a");
        assert_eq!(ids(&other), ["a"]);
        add(&other, "b");
        assert_eq!(ids(&one), ["a", "b"]);
        // Enough changes to compact the file several times over.
        let mut generations = BTreeSet::new();
        for i in 0..5000 {
            let store = if i % 3 == 0 { &other } else { &one };
            store
                .update(|s| {
                    s.volumes.get_mut("a").unwrap().capacity_bytes = i;
                    Ok::<_, TestError>(())
                })
                .unwrap();
            generations.insert(store.cache().position.unwrap().generation);
        }
        assert!(generations.len() > 2, "compacted: {generations:?}");
        assert!(
            fs::metadata(one.state_file()).unwrap().len()
                < 2 * journal::MIN_COMPACTION_BYTES + 4096
        );
        for store in [&one, &other, &Store::open(dir.path()).unwrap()] {
            let state = store.read().unwrap();
            assert_eq!(state.volumes.get("a").unwrap().capacity_bytes, 4999);
            assert_eq!(state.volumes.len(), 2);
        }
    }

    /// A power cut while a change is appended leaves any prefix of its line, or the line with
    /// a page of zeros: the change is not there after a restart, everything before it is, and
    /// the next change is kept.
    #[test]
    fn a_torn_append_is_ignored_and_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        add(&store, "a");
        add(&store, "b");
        let whole = fs::read(store.state_file()).unwrap();
        add(&store, "c");
        let with_c = fs::read(store.state_file()).unwrap();
        for cut in whole.len()..with_c.len() {
            fs::write(store.state_file(), &with_c[..cut]).unwrap();
            let restarted = Store::open(dir.path()).unwrap();
            assert_eq!(ids(&restarted), ["a", "b"], "cut at {cut}");
            add(&restarted, "d");
            assert_eq!(
                ids(&Store::open(dir.path()).unwrap()),
                ["a", "b", "d"],
                "cut at {cut}"
            );
        }
        // A lost page inside the last line (zeros, its newline kept) is a torn append too.
        let mut lost_page = with_c.clone();
        lost_page[whole.len() + 1..with_c.len() - 3].fill(0);
        fs::write(store.state_file(), &lost_page).unwrap();
        let restarted = Store::open(dir.path()).unwrap();
        assert_eq!(ids(&restarted), ["a", "b"]);
        add(&restarted, "d");
        assert_eq!(ids(&Store::open(dir.path()).unwrap()), ["a", "b", "d"]);
        // A damaged line that is not the last one is corruption, refused and kept.
        let mut damaged = with_c.clone();
        damaged[whole.len() + 2] = b'V';
        damaged.extend(&with_c[whole.len()..]);
        fs::write(store.state_file(), &damaged).unwrap();
        let error = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("state.log") && error.contains("corrupt"),
            "{error}"
        );
        assert_eq!(fs::read(store.state_file()).unwrap(), damaged);
    }

    #[test]
    fn a_whole_state_file_of_an_older_driver_is_converted() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = State::default();
        old.volumes.insert("a".into(), volume("a"));
        old.commit();
        fs::write(
            dir.path().join("state.json"),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(ids(&store), ["a"]);
        assert!(!dir.path().join("state.json").exists());
        add(&store, "b");
        assert_eq!(ids(&Store::open(dir.path()).unwrap()), ["a", "b"]);
    }

    #[test]
    fn heartbeats() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.heartbeat_age_ms("n1"), None);
        store.beat("n1").unwrap();
        assert!(store.heartbeat_age_ms("n1").unwrap() < 5_000);
        assert_eq!(store.known_nodes(), ["n1"]);
        assert_eq!(store.heartbeat_age_ms("../state.json"), None);
        assert_eq!(store.heartbeat_age_ms(".n1.beat"), None);
    }

    #[test]
    fn a_node_whose_link_is_down_stops_beating() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let beat_at = || {
            fs::metadata(store.heartbeat("n1"))
                .unwrap()
                .modified()
                .unwrap()
        };
        store.beat("n1").unwrap();
        let first = beat_at();
        store.set_link("n1", false).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        store.beat("n1").unwrap();
        assert_eq!(beat_at(), first);
        assert_eq!(store.known_nodes(), ["n1"], "the marker names no node");
        store.set_link("n1", true).unwrap();
        store.set_link("n1", true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        store.beat("n1").unwrap();
        assert_ne!(beat_at(), first);
    }

    #[test]
    fn an_instance_is_alive_while_its_process_holds_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let instance = store.register_instance().unwrap();
        let id = instance.id.clone();
        assert!(store.instance_alive(&id));
        assert!(store.instance_alive(&id), "asking does not end it");
        drop(instance);
        assert!(!store.instance_alive(&id));
        assert!(
            !dir.path().join("instances").join(&id).exists(),
            "forgotten"
        );
        assert!(!store.instance_alive("../state.json"));
    }
}
