//! Volume and storage health (CSI v1.13's health RPCs), from what this driver can observe
//! itself: a volume's data missing, unreadable or on a failing or read-only file system, a
//! directory volume holding more than its capacity, nodes fenced from a volume, a staged or
//! published path of this node no longer mounted, and the state directory's file system full,
//! read-only or unreachable. Healthy is the empty list.
//!
//! The same conditions answer the VolumeCondition generation (`--volume-health=v1.12|both`):
//! [`legacy_condition`] folds a list into v1.12's `{abnormal, message}`, so both generations
//! report one truth.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::Path;

use clap::ValueEnum;
use csi::StorageHealthErrorType as StorageStatus;
use csi::VolumeHealthErrorType as Status;
use csi::node_get_storage_health_response::StorageBackendHealth;
use csi::volume_health::VolumeHealthEntry;
use csi_proto::csi::v1 as csi;
use csi_proto::csi::v1_12;

use crate::data;
use crate::driver::Driver;
use crate::mounts;
use crate::state::{AccessType, Layout, Volume};

/// Which generation of the health API the driver advertises and serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HealthApi {
    /// CSI v1.13: the health RPCs and their capabilities.
    #[value(name = "v1.13")]
    V1_13,
    /// CSI v1.0-v1.12: VOLUME_CONDITION, conditions in ListVolumes, ControllerGetVolume and
    /// NodeGetVolumeStats; the health RPCs are UNIMPLEMENTED.
    #[value(name = "v1.12")]
    V1_12,
    /// Both at once.
    #[value(name = "both")]
    Both,
}

impl HealthApi {
    /// Serves the v1.13 health RPCs.
    pub fn rpcs(self) -> bool {
        matches!(self, Self::V1_13 | Self::Both)
    }

    /// Fills v1.12's `volume_condition`.
    pub fn volume_condition(self) -> bool {
        matches!(self, Self::V1_12 | Self::Both)
    }
}

/// The paths a node-side health check looks at besides the ones recorded for this node.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodePaths<'a> {
    pub publish: Option<&'a str>,
    pub staging: Option<&'a str>,
}

/// Conditions of one volume, keyed by (status, reason): the spec allows one entry per pair,
/// so observations of the same kind are merged into one message.
#[derive(Debug, Default)]
struct Conditions(BTreeMap<(i32, &'static str), Vec<String>>);

impl Conditions {
    fn add(&mut self, status: Status, reason: &'static str, message: String) {
        self.0
            .entry((status as i32, reason))
            .or_default()
            .push(message);
    }

    fn entries(self) -> Vec<VolumeHealthEntry> {
        self.0
            .into_iter()
            .map(|((status, reason), messages)| VolumeHealthEntry {
                status,
                reason: reason.to_string(),
                message: messages.join("; "),
            })
            .collect()
    }
}

impl Driver {
    /// A volume's health from the controller's side: its data, the file system holding it,
    /// its capacity, and the nodes fenced from it (they lost access; the others have it).
    pub fn volume_health(&self, volume: &Volume) -> Vec<VolumeHealthEntry> {
        let mut conditions = self.data_conditions(volume);
        if !volume.fenced.is_empty() {
            let nodes: Vec<&str> = volume.fenced.keys().map(String::as_str).collect();
            conditions.add(
                Status::Degraded,
                "NodeFenced",
                format!(
                    "fenced from node(s) {}: unpublished while still in use, writes there are stopped",
                    nodes.join(", ")
                ),
            );
        }
        conditions.entries()
    }

    /// A volume's health from this node's side: its data, this node's fence, and whether the
    /// paths staged and published here (recorded, or named by the CO) are still mounted.
    pub fn node_volume_health(
        &self,
        volume: &Volume,
        paths: NodePaths<'_>,
    ) -> Vec<VolumeHealthEntry> {
        let mut conditions = self.data_conditions(volume);
        let node = &self.config.node_id;
        if volume.fenced.contains_key(node) {
            conditions.add(
                Status::Inaccessible,
                "NodeFenced",
                format!("node {node} is fenced from the volume: it was unpublished from this node while in use"),
            );
        }
        let usage = volume.nodes.get(node);
        let staged = usage
            .and_then(|u| u.staged.as_ref())
            .map(|s| s.path.as_str());
        // A block volume's staging is a loop device, not a mount.
        if volume.access_type == AccessType::Mount {
            let named = paths.staging.filter(|p| Some(*p) != staged);
            for path in staged.into_iter().chain(named) {
                if !mounted(path) {
                    conditions.add(
                        Status::Inaccessible,
                        "StagingPathNotMounted",
                        format!("staging path {path} is not mounted"),
                    );
                }
            }
        }
        let targets: Vec<&str> = usage
            .map(|u| u.targets.keys().map(String::as_str).collect())
            .unwrap_or_default();
        // NodeGetVolumeStats names either path as its one `volume_path`.
        let named = paths
            .publish
            .filter(|p| !targets.contains(p) && Some(*p) != staged && Some(*p) != paths.staging);
        for path in targets.iter().copied().chain(named) {
            if !mounted(path) {
                conditions.add(
                    Status::Inaccessible,
                    "PublishPathNotMounted",
                    format!("publish path {path} is not mounted"),
                );
            }
        }
        conditions.entries()
    }

    /// Conditions both sides see: the data itself and the file system under it.
    fn data_conditions(&self, volume: &Volume) -> Conditions {
        let mut conditions = Conditions::default();
        let layout = volume.layout();
        let path = self.store.volume_data(&volume.id, layout);
        let shown = path.display();
        let metadata = match fs::symlink_metadata(&path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                conditions.add(
                    Status::DataLoss,
                    "VolumeDataMissing",
                    format!("the volume's data is gone: {shown} does not exist"),
                );
                return conditions;
            }
            Err(error) => {
                conditions.add(
                    Status::Inaccessible,
                    "BackingFilesystemError",
                    format!("cannot look up {shown}: {error}"),
                );
                return conditions;
            }
        };
        let expected_dir = layout == Layout::Directory;
        if metadata.is_dir() != expected_dir || (!expected_dir && !metadata.is_file()) {
            let expected = if expected_dir {
                "a directory"
            } else {
                "an image file"
            };
            conditions.add(
                Status::Inaccessible,
                "VolumeDataUnreadable",
                format!("{shown} is no longer {expected}"),
            );
            return conditions;
        }
        if let Err(error) = read_some(&path, expected_dir) {
            // EIO is the file system failing under the data, anything else the data itself.
            let reason = if error.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) {
                "BackingFilesystemError"
            } else {
                "VolumeDataUnreadable"
            };
            conditions.add(
                Status::Inaccessible,
                reason,
                format!("cannot read {shown}: {error}"),
            );
            return conditions;
        }
        match rustix::fs::statvfs(&path) {
            Ok(fs) if fs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) => conditions.add(
                Status::Degraded,
                "BackingFilesystemReadOnly",
                format!(
                    "the file system holding {shown} is read-only: the volume cannot be written"
                ),
            ),
            Ok(_) => {}
            Err(error) => conditions.add(
                Status::Inaccessible,
                "BackingFilesystemError",
                format!("cannot query the file system holding {shown}: {error}"),
            ),
        }
        if layout == Layout::Directory {
            match data::usage(&path) {
                Ok((used, _)) if used > volume.capacity_bytes => conditions.add(
                    Status::Degraded,
                    "CapacityExceeded",
                    format!(
                        "the volume holds {used} bytes, more than its capacity of {} bytes",
                        volume.capacity_bytes
                    ),
                ),
                Ok(_) => {}
                Err(error) => conditions.add(
                    Status::Inaccessible,
                    "VolumeDataUnreadable",
                    format!("cannot measure {shown}: {error}"),
                ),
            }
        }
        conditions
    }

    /// The state directory's file system from this node: unreachable, read-only or full.
    pub fn storage_health(&self) -> Vec<StorageBackendHealth> {
        let dir = self.store.dir();
        let shown = dir.display();
        let condition =
            |status: StorageStatus, reason: &str, message: String| StorageBackendHealth {
                status: status as i32,
                reason: reason.to_string(),
                message,
                volume_capability: None,
            };
        if let Err(error) = fs::read_dir(dir) {
            return vec![condition(
                StorageStatus::StorageUnreachable,
                "StateDirectoryUnreadable",
                format!("cannot read the state directory {shown}: {error}"),
            )];
        }
        let fs = match rustix::fs::statvfs(dir) {
            Ok(fs) => fs,
            Err(error) => {
                return vec![condition(
                    StorageStatus::StorageUnreachable,
                    "StateDirectoryUnreadable",
                    format!("cannot query the file system of {shown}: {error}"),
                )];
            }
        };
        let mut conditions = Vec::new();
        if fs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
            conditions.push(condition(
                StorageStatus::StorageDegraded,
                "StorageReadOnly",
                format!(
                    "the file system of {shown} is read-only: no volume can be created or written"
                ),
            ));
        }
        if fs.f_bavail == 0 || fs.f_favail == 0 {
            let what = if fs.f_bavail == 0 { "space" } else { "inodes" };
            conditions.push(condition(
                StorageStatus::StorageDegraded,
                "StorageFull",
                format!("the file system of {shown} has no free {what} left"),
            ));
        }
        conditions
    }
}

/// Reads the first byte of an image, or the first entry of a directory: what any user of the
/// volume does first.
fn read_some(path: &Path, directory: bool) -> io::Result<()> {
    if directory {
        fs::read_dir(path)?.next().transpose()?;
    } else {
        // Any answer, even 0 bytes (an empty image), proves the data can be read.
        let mut byte = [0u8; 1];
        let _read = fs::File::open(path)?.read(&mut byte)?;
    }
    Ok(())
}

/// Whether `path` is a mount point; an unreadable mount table counts as not mounted, which
/// a health report may say (the staging and publishing RPCs report the error itself).
fn mounted(path: &str) -> bool {
    mounts::is_mount_point(Path::new(path)).unwrap_or(false)
}

/// v1.12's condition of a volume from its v1.13 conditions: abnormal when there is any,
/// their messages as the message.
pub fn legacy_condition(entries: &[VolumeHealthEntry]) -> v1_12::VolumeCondition {
    if entries.is_empty() {
        return v1_12::VolumeCondition {
            abnormal: false,
            message: "volume is healthy".into(),
        };
    }
    v1_12::VolumeCondition {
        abnormal: true,
        message: entries
            .iter()
            .map(|entry| format!("{}: {}", entry.reason, entry.message))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(status: Status, reason: &str, message: &str) -> VolumeHealthEntry {
        VolumeHealthEntry {
            status: status as i32,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn one_entry_per_status_and_reason() {
        let mut conditions = Conditions::default();
        conditions.add(Status::Inaccessible, "PublishPathNotMounted", "a".into());
        conditions.add(Status::Inaccessible, "PublishPathNotMounted", "b".into());
        conditions.add(Status::Degraded, "NodeFenced", "c".into());
        assert_eq!(
            conditions.entries(),
            [
                entry(Status::Degraded, "NodeFenced", "c"),
                entry(Status::Inaccessible, "PublishPathNotMounted", "a; b"),
            ]
        );
    }

    #[test]
    fn legacy_conditions_fold_the_entries() {
        assert_eq!(
            legacy_condition(&[]),
            v1_12::VolumeCondition {
                abnormal: false,
                message: "volume is healthy".into()
            }
        );
        let entries = [
            entry(Status::DataLoss, "VolumeDataMissing", "gone"),
            entry(Status::Degraded, "NodeFenced", "fenced from n1"),
        ];
        assert_eq!(
            legacy_condition(&entries),
            v1_12::VolumeCondition {
                abnormal: true,
                message: "VolumeDataMissing: gone; NodeFenced: fenced from n1".into()
            }
        );
    }
}
