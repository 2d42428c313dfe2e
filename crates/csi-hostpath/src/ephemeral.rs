//! CSI ephemeral inline volumes (a pod's `volumes: - csi: {driver: ...}`), as upstream's
//! hostpath driver serves them: the kubelet calls NodePublishVolume, without staging, with
//! `csi.storage.k8s.io/ephemeral: "true"` in `volume_context` (sent when the CSIDriver has
//! `podInfoOnMount: true`), and its NodeUnpublishVolume once the pod is gone. The node makes
//! the volume on the fly (a directory volume of [`EPHEMERAL_VOLUME_SIZE`] in its own capacity
//! pool, `kind` from the volume attributes), publishes it, and deletes it on unpublishing.
//!
//! A crash must not leak one. The record comes first, `Creating` with this instance as its
//! creator and the target path it is for; then the data and the mount; then, in one
//! transaction, `Ready` and published. Deletion marks the record `Deleting` before it unmounts
//! the target and removes the target directory, the data and last the record. Whatever a crash
//! cuts short the next node start finishes: it deletes this node's ephemeral volumes left
//! `Creating` by a gone instance or `Deleting` (the kubelet's retry makes the volume anew). A
//! NodeUnpublishVolume finds what is left in any phase and deletes it, and one of a volume no
//! record names (a non-UUID ID: the kubelet's `csi-<sha256>`, never a persistent volume's) only
//! removes the empty target directory, so it stays idempotent.

use std::collections::BTreeMap;
use std::path::Path;

use csi_proto::csi::v1 as csi;

use crate::beneath::NodePath;
use crate::driver::Driver;
use crate::error::DriverError;
use crate::rules::{self, required};
use crate::state::{AccessType, Ephemeral, Layout, Phase, Target, Volume};

/// The `volume_context` key the kubelet sets on an ephemeral inline volume.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// The prefix of the keys the kubelet adds to `volume_context` (pod name, namespace, UID,
/// service account, its tokens): never recorded.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// The size of an ephemeral volume, as upstream's hostpath driver (100 MiB); no attribute sets
/// another.
pub const EPHEMERAL_VOLUME_SIZE: u64 = 100 << 20;

/// Whether a NodePublishVolume asks for an ephemeral inline volume.
pub fn requested(context: &std::collections::HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
}

/// An ephemeral volume's ID names its data directory and record: letters, digits, `-`, `_`
/// (no `.`: the data directory's name up to its first `.` is the record's ID), and never a
/// UUID, the form of the persistent volumes' IDs.
pub(crate) fn is_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !rules::looks_like_id(id)
}

fn check_id(id: &str) -> Result<(), DriverError> {
    if is_id(id) {
        Ok(())
    } else {
        Err(DriverError::InvalidEphemeralId { id: id.to_string() })
    }
}

impl Driver {
    pub(crate) fn publish_ephemeral(
        &self,
        request: &csi::NodePublishVolumeRequest,
    ) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        check_id(id)?;
        let target_at = self.allowed(&request.target_path, "target_path")?;
        if !request.staging_target_path.is_empty() {
            return Err(DriverError::EphemeralStaged);
        }
        let capability = request.volume_capability.as_ref();
        let (access_type, mode) = rules::required_capability(capability)?;
        if access_type == AccessType::Block {
            return Err(DriverError::EphemeralBlock);
        }
        if let Some(csi::volume_capability::AccessType::Mount(mount)) =
            capability.and_then(|c| c.access_type.as_ref())
            && !mount.fs_type.is_empty()
        {
            return Err(DriverError::EphemeralFsType {
                fs_type: mount.fs_type.clone(),
            });
        }
        let flags = rules::mount_options(capability)?;
        let readonly = request.readonly || rules::read_only_mode(mode) || flags.readonly;
        let options = flags.read_only_if(readonly);
        let _guard = self.locks.acquire(&[id])?;
        crate::node::need_mounts()?;
        let target = target_at.path();
        let target_key = target.display().to_string();
        let node = self.config.node_id.clone();
        let volume = self.store.update(|state| {
            if let Some(existing) = state.volumes.get_mut(id) {
                // Persistent volumes have UUIDs, which check_id refused.
                let Some(ephemeral) = &existing.ephemeral else {
                    return Err(DriverError::InvalidEphemeralId { id: id.to_string() });
                };
                if ephemeral.node != node || ephemeral.target != target_key {
                    return Err(DriverError::EphemeralElsewhere {
                        id: id.to_string(),
                        node: ephemeral.node.clone(),
                        target: ephemeral.target.clone(),
                    });
                }
                match existing.phase {
                    Phase::Deleting => {
                        return Err(DriverError::BeingDeleted {
                            name: id.to_string(),
                        });
                    }
                    Phase::Creating => {
                        self.claim_creation(&mut existing.creator, "volume", id)?;
                    }
                    Phase::Ready => {}
                }
                return Ok(existing.clone());
            }
            let name = format!("ephemeral-{id}");
            if state.volume_by_name_mut(&name).is_some() {
                return Err(DriverError::ExistsWithOtherParameters {
                    kind: "volume",
                    name,
                    how: "as a persistent volume",
                });
            }
            let size = EPHEMERAL_VOLUME_SIZE;
            if size > self.config.max_volume_size {
                return Err(DriverError::AboveMaximumSize {
                    size,
                    max: self.config.max_volume_size,
                });
            }
            let kind = request
                .volume_context
                .get("kind")
                .cloned()
                .unwrap_or_default();
            let (home_node, _) = self.place(state, None, &kind, size)?;
            let volume = Volume {
                id: id.to_string(),
                name,
                capacity_bytes: size,
                access_type: AccessType::Mount,
                filesystem: None,
                phase: Phase::Creating,
                home_node,
                kind,
                accessible_nodes: vec![node.clone()],
                parameters: attributes(&request.volume_context),
                mutable_parameters: BTreeMap::new(),
                source: None,
                published: BTreeMap::new(),
                nodes: BTreeMap::new(),
                fenced: BTreeMap::new(),
                exports: BTreeMap::new(),
                creator: Some(self.instance.id.clone()),
                ephemeral: Some(Ephemeral {
                    node: node.clone(),
                    target: target_key.clone(),
                }),
            };
            state.volumes.insert(volume.id.clone(), volume.clone());
            Ok(volume)
        })?;
        let data = self.store.volume_data(id, Layout::Directory);
        if volume.phase == Phase::Ready {
            let recorded = volume
                .nodes
                .get(&node)
                .and_then(|u| u.targets.get(&target_key));
            if let Some(existing) = recorded
                && (existing.readonly != readonly
                    || existing.access_mode != mode as i32
                    || existing.options != flags)
            {
                return Err(DriverError::PublishedWithOtherOptions {
                    id: id.to_string(),
                    target: target_key,
                });
            }
            // Gone since (a restart of the machine): mounted again below.
            if crate::node::same_object(target, &data)? {
                return Ok(());
            }
        }
        let made = self.mount_ephemeral(&target_at, &data, &options);
        let published = made.and_then(|()| {
            self.store.update(|state| {
                let volume =
                    state
                        .volumes
                        .get_mut(id)
                        .ok_or_else(|| DriverError::DeletedMeanwhile {
                            kind: "volume",
                            name: id.to_string(),
                        })?;
                volume.phase = Phase::Ready;
                volume.creator = None;
                volume
                    .nodes
                    .entry(node.clone())
                    .or_default()
                    .targets
                    .insert(
                        target_key.clone(),
                        Target {
                            readonly,
                            access_mode: mode as i32,
                            options: flags,
                        },
                    );
                Ok::<_, DriverError>(())
            })
        });
        if let Err(error) = published {
            if volume.phase != Phase::Ready {
                // Nothing of a volume that never was published is kept.
                if let Err(cleanup) = self.delete_ephemeral(&volume, &target_at) {
                    tracing::warn!(volume = id, %cleanup, "cannot undo a failed ephemeral publish; the next NodeUnpublishVolume or node start finishes it");
                }
            }
            return Err(error);
        }
        tracing::info!(volume = id, target = %target.display(), "ephemeral inline volume published");
        Ok(())
    }

    /// Makes the data directory (kept if a crash left it) and mounts it at the target.
    fn mount_ephemeral(
        &self,
        target_at: &NodePath,
        data: &Path,
        options: &crate::options::MountOptions,
    ) -> Result<(), DriverError> {
        std::fs::create_dir_all(data)
            .map_err(|e| DriverError::io("creating the ephemeral volume's data", e))?;
        target_at.create_dir_all()?;
        let target = target_at.path();
        if !crate::node::is_mount_point(target)? {
            return target_at.bind_from(data, options);
        }
        if !crate::node::same_object(target, data)? {
            return Err(DriverError::OtherMountAt {
                id: data
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: target.display().to_string(),
            });
        }
        // Ours, from a publishing a crash cut short: maybe without its flags yet.
        if options.ask_anything() {
            target_at.apply(options)?;
        }
        Ok(())
    }

    /// NodeUnpublishVolume of an ephemeral volume at its target: deletes it. `None` when the
    /// request is not for an ephemeral volume's own target (the caller unpublishes as usual).
    pub(crate) fn unpublish_ephemeral(
        &self,
        id: &str,
        target_at: &NodePath,
    ) -> Option<Result<(), DriverError>> {
        let state = match self.store.read() {
            Ok(state) => state,
            Err(error) => return Some(Err(error.into())),
        };
        let Some(volume) = state.volumes.get(id) else {
            // A persistent volume's ID is a UUID, and no ephemeral volume leaves a mount
            // without its record: either is NOT_FOUND, as ever.
            let mounted = crate::node::is_mount_point(target_at.path());
            return match mounted {
                Ok(false) if !rules::looks_like_id(id) => {
                    Some(remove_empty_target(target_at.path()))
                }
                Ok(_) => None,
                Err(error) => Some(Err(error)),
            };
        };
        let ephemeral = volume.ephemeral.as_ref()?;
        if ephemeral.node != self.config.node_id || Path::new(&ephemeral.target) != target_at.path()
        {
            return None;
        }
        let mut volume = volume.clone();
        if volume.phase == Phase::Creating
            && let Err(error) = self.claim_creation(&mut volume.creator, "volume", id)
        {
            return Some(Err(error));
        }
        Some(self.delete_ephemeral(&volume, target_at).inspect(|()| {
            tracing::info!(
                volume = id,
                "ephemeral inline volume unpublished and deleted"
            );
        }))
    }

    /// Deletes an ephemeral volume: marked `Deleting`, its mount at `target_at` taken away
    /// (refused if something else is mounted there), the target directory, the data, the
    /// record.
    fn delete_ephemeral(&self, volume: &Volume, target_at: &NodePath) -> Result<(), DriverError> {
        self.store.update(|state| {
            if let Some(v) = state.volumes.get_mut(&volume.id) {
                v.phase = Phase::Deleting;
            }
            Ok::<_, DriverError>(())
        })?;
        let target = target_at.path();
        // Something else mounted at the target is left there, but it holds none of the
        // volume's data, which goes all the same; the caller hears of the mount.
        let unmounted = match self.unmount_volume(volume, target, None) {
            Err(other @ DriverError::OtherMountAt { .. }) => Err(other),
            unmounted => {
                unmounted?;
                remove_empty_target(target)
            }
        };
        self.finish_deleting_volume(&volume.id, Layout::Directory)?;
        unmounted
    }

    /// At the node's start: deletes this node's ephemeral volumes a crash left half made (their
    /// creator gone) or half deleted.
    pub fn recover_ephemeral(&self) -> Result<(), DriverError> {
        let node = &self.config.node_id;
        let abandoned: Vec<Volume> = self
            .store
            .read()?
            .volumes
            .values()
            .filter(|v| v.ephemeral.as_ref().is_some_and(|e| e.node == *node))
            .filter(|v| match v.phase {
                Phase::Creating => v
                    .creator
                    .as_deref()
                    .is_none_or(|c| !self.store.instance_alive(c)),
                Phase::Deleting => true,
                Phase::Ready => false,
            })
            .cloned()
            .collect();
        for volume in abandoned {
            let target = volume.ephemeral.as_ref().map(|e| e.target.clone());
            let deleted = self
                .allowed(target.as_deref().unwrap_or_default(), "target_path")
                .and_then(|target_at| self.delete_ephemeral(&volume, &target_at));
            match deleted {
                Ok(()) => {
                    tracing::info!(volume = %volume.id, "deleted an ephemeral volume a crash left behind")
                }
                Err(error) => {
                    tracing::warn!(volume = %volume.id, %error, "cannot delete an ephemeral volume a crash left behind")
                }
            }
        }
        Ok(())
    }

    /// `FAILED_PRECONDITION` for `rpc` on an ephemeral volume, which only its node's
    /// NodePublishVolume and NodeUnpublishVolume handle.
    pub(crate) fn not_ephemeral(
        &self,
        volume: &Volume,
        rpc: &'static str,
    ) -> Result<(), DriverError> {
        match volume.ephemeral {
            Some(_) => Err(DriverError::Ephemeral {
                id: volume.id.clone(),
                rpc,
            }),
            None => Ok(()),
        }
    }
}

/// The volume attributes an ephemeral volume keeps: the pod's, without what the kubelet adds
/// (pod identity, service account tokens).
fn attributes(context: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    context
        .iter()
        .filter(|(key, _)| !key.starts_with(KUBELET_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Removes the target directory of an unpublished volume if it is empty (never data: a
/// non-empty directory or anything else is refused and left).
pub(crate) fn remove_empty_target(target: &Path) -> Result<(), DriverError> {
    match std::fs::remove_dir(target) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        removed => removed
            .map_err(|e| DriverError::io(format!("removing target path {}", target.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn ephemeral_ids_name_one_directory_and_never_a_persistent_volume() {
        let sha = "csi-0f4b0f1e7d3c3a2b9e8d7c6b5a49382716f5e4d3c2b1a0918273645546372819";
        for good in [sha, "a", "pod_volume-1"] {
            assert!(check_id(good).is_ok(), "{good}");
        }
        for bad in [
            "../x",
            "a/b",
            "a.b",
            ".",
            "a b",
            "a\0b",
            "é",
            "6f1c2b9e-3c51-4c1e-9d4a-2b1f0c3d4e5f",
        ] {
            let error = check_id(bad).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn the_kubelet_s_keys_are_not_kept() {
        let context = [
            ("kind", "fast"),
            ("color", "blue"),
            (EPHEMERAL_KEY, "true"),
            ("csi.storage.k8s.io/pod.name", "p"),
            ("csi.storage.k8s.io/serviceAccount.tokens", "{\"secret\"}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(requested(&context));
        let kept: Vec<String> = attributes(&context).into_keys().collect();
        assert_eq!(kept, ["color", "kind"]);
        let not = [(EPHEMERAL_KEY.to_string(), "false".to_string())].into();
        assert!(!requested(&not));
    }
}
