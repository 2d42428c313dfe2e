//! Pure request checks shared by the services: required fields, capabilities, paths.

use std::path::{Component, Path, PathBuf};

use csi_proto::csi::v1::VolumeCapability;
use csi_proto::csi::v1::volume_capability::access_mode::Mode;
use csi_proto::csi::v1::volume_capability::{AccessMode, AccessType as CapabilityAccess};

use crate::error::DriverError;
use crate::state::{AccessType, Filesystem};

/// `INVALID_ARGUMENT` unless `value` is non-empty.
pub fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str, DriverError> {
    if value.is_empty() {
        Err(DriverError::Missing { field })
    } else {
        Ok(value)
    }
}

/// The access type and mode of one capability; both are required.
pub fn capability(capability: &VolumeCapability) -> Result<(AccessType, Mode), DriverError> {
    let access_type = match &capability.access_type {
        Some(CapabilityAccess::Mount(_)) => AccessType::Mount,
        Some(CapabilityAccess::Block(_)) => AccessType::Block,
        None => {
            return Err(DriverError::Missing {
                field: "volume capability access_type",
            });
        }
    };
    let mode = capability
        .access_mode
        .as_ref()
        .map(AccessMode::mode)
        .filter(|mode| *mode != Mode::Unknown)
        .ok_or(DriverError::Missing {
            field: "volume capability access_mode",
        })?;
    Ok((access_type, mode))
}

/// [`capability`] of a request's `volume_capability`, which is required.
pub fn required_capability(
    given: Option<&VolumeCapability>,
) -> Result<(AccessType, Mode), DriverError> {
    capability(given.ok_or(DriverError::Missing {
        field: "volume_capability",
    })?)
}

/// The one access type a list of capabilities asks for (mixing block and mount is invalid).
pub fn capabilities(list: &[VolumeCapability]) -> Result<AccessType, DriverError> {
    let mut found = None;
    for cap in list {
        let (access_type, _) = capability(cap)?;
        match found {
            None => found = Some(access_type),
            Some(previous) if previous != access_type => {
                return Err(DriverError::MixedAccessTypes);
            }
            Some(_) => {}
        }
    }
    found.ok_or(DriverError::Missing {
        field: "volume_capabilities",
    })
}

/// The filesystem the mount capabilities of a CreateVolume ask for: none (no fs_type: a
/// directory volume) or ext4. ext4 is not a cluster filesystem, so an ext4 volume is
/// single-node; every other fs_type is refused.
pub fn filesystem(list: &[VolumeCapability]) -> Result<Option<Filesystem>, DriverError> {
    let mut asked: Option<&str> = None;
    for cap in list {
        let Some(CapabilityAccess::Mount(mount)) = &cap.access_type else {
            continue;
        };
        match asked {
            Some(previous) if previous != mount.fs_type => {
                return Err(DriverError::MixedFsTypes {
                    first: previous.to_string(),
                    second: mount.fs_type.clone(),
                });
            }
            _ => asked = Some(&mount.fs_type),
        }
    }
    let filesystem = match asked.unwrap_or_default() {
        "" => return Ok(None),
        "ext4" => Filesystem::Ext4,
        other => {
            return Err(DriverError::UnsupportedFsType {
                fs_type: other.to_string(),
            });
        }
    };
    let multi_node = list
        .iter()
        .filter_map(|cap| cap.access_mode.as_ref())
        .any(|mode| !single_node(mode.mode()));
    if multi_node {
        return Err(DriverError::MultiNodeExt4);
    }
    Ok(Some(filesystem))
}

/// Modes that allow the volume on one node at a time.
pub fn single_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter
    )
}

/// Modes that allow one publication (target path) at a time.
pub fn single_writer(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeWriter | Mode::SingleNodeSingleWriter)
}

/// Modes that never write.
pub fn read_only_mode(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

/// Checks that a staging or target path is absolute, has no `..`, lies under one of the
/// allowed roots and not inside the state directory: the driver never mounts or deletes
/// anywhere else. Returns it normalized (`a//b/./c/` is `a/b/c`): one place, one path.
pub fn allowed_path(
    path: &str,
    field: &'static str,
    roots: &[PathBuf],
    state_dir: &Path,
) -> Result<PathBuf, DriverError> {
    let text = required(path, field)?;
    let path: PathBuf = Path::new(text).components().collect();
    let why = if text.contains('\0') {
        "must not contain NUL".to_string()
    } else if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir)) {
        "must be an absolute path without ..".to_string()
    } else if path.starts_with(state_dir) || state_dir.starts_with(&path) {
        "overlaps the driver's state directory".to_string()
    } else if !roots.iter().any(|root| path.starts_with(root)) {
        format!("is outside the allowed roots {roots:?}")
    } else {
        return Ok(path);
    };
    Err(DriverError::PathNotAllowed { field, path, why })
}

/// Paging tokens are the last returned ID; anything else is a bad token (`ABORTED`).
pub fn page_start(
    token: &str,
    valid_id: impl Fn(&str) -> bool,
) -> Result<Option<String>, DriverError> {
    if token.is_empty() {
        return Ok(None);
    }
    if valid_id(token) {
        Ok(Some(token.to_string()))
    } else {
        Err(DriverError::InvalidStartingToken {
            token: token.to_string(),
        })
    }
}

/// Volume and snapshot IDs are UUIDs.
pub fn looks_like_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok()
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::csi::v1::volume_capability::{BlockVolume, MountVolume};
    use tonic::Code;

    fn cap(access: Option<CapabilityAccess>, mode: Option<Mode>) -> VolumeCapability {
        VolumeCapability {
            access_type: access,
            access_mode: mode.map(|m| AccessMode { mode: m as i32 }),
        }
    }

    fn mount() -> Option<CapabilityAccess> {
        Some(CapabilityAccess::Mount(MountVolume::default()))
    }

    fn block() -> Option<CapabilityAccess> {
        Some(CapabilityAccess::Block(BlockVolume::default()))
    }

    #[test]
    fn capability_table() {
        let table = [
            (
                cap(mount(), Some(Mode::SingleNodeWriter)),
                Ok(AccessType::Mount),
            ),
            (
                cap(block(), Some(Mode::MultiNodeMultiWriter)),
                Ok(AccessType::Block),
            ),
            (
                cap(None, Some(Mode::SingleNodeWriter)),
                Err(Code::InvalidArgument),
            ),
            (cap(mount(), None), Err(Code::InvalidArgument)),
            (
                cap(mount(), Some(Mode::Unknown)),
                Err(Code::InvalidArgument),
            ),
        ];
        for (input, want) in table {
            let got = capability(&input).map(|(t, _)| t).map_err(|e| e.code());
            assert_eq!(got, want, "{input:?}");
        }
        assert_eq!(capabilities(&[]).unwrap_err().code(), Code::InvalidArgument);
        let mixed = [
            cap(mount(), Some(Mode::SingleNodeWriter)),
            cap(block(), Some(Mode::SingleNodeWriter)),
        ];
        assert_eq!(
            capabilities(&mixed).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn filesystem_table() {
        let fs = |fs_type: &str, mode: Mode| {
            cap(
                Some(CapabilityAccess::Mount(MountVolume {
                    fs_type: fs_type.into(),
                    ..MountVolume::default()
                })),
                Some(mode),
            )
        };
        let table = [
            (vec![fs("", Mode::MultiNodeMultiWriter)], Ok(None)),
            (vec![cap(block(), Some(Mode::SingleNodeWriter))], Ok(None)),
            (
                vec![fs("ext4", Mode::SingleNodeWriter)],
                Ok(Some(Filesystem::Ext4)),
            ),
            (
                vec![
                    fs("ext4", Mode::SingleNodeWriter),
                    fs("ext4", Mode::SingleNodeReaderOnly),
                ],
                Ok(Some(Filesystem::Ext4)),
            ),
            (
                vec![fs("ext4", Mode::MultiNodeReaderOnly)],
                Err(Code::InvalidArgument),
            ),
            (
                vec![fs("xfs", Mode::SingleNodeWriter)],
                Err(Code::InvalidArgument),
            ),
            (
                vec![
                    fs("ext4", Mode::SingleNodeWriter),
                    fs("", Mode::SingleNodeWriter),
                ],
                Err(Code::InvalidArgument),
            ),
        ];
        for (input, want) in table {
            let got = filesystem(&input).map_err(|e| e.code());
            assert_eq!(got, want, "{input:?}");
        }
    }

    #[test]
    fn mode_classes() {
        assert!(single_node(Mode::SingleNodeMultiWriter));
        assert!(!single_node(Mode::MultiNodeReaderOnly));
        assert!(single_writer(Mode::SingleNodeSingleWriter));
        assert!(!single_writer(Mode::SingleNodeMultiWriter));
        assert!(read_only_mode(Mode::MultiNodeReaderOnly));
    }

    #[test]
    fn paths_are_confined() {
        let roots = [PathBuf::from("/var/lib/kubelet"), PathBuf::from("/tmp")];
        let state = Path::new("/tmp/state");
        for spelling in [
            "/var/lib/kubelet/pods/x/volumes/v",
            "/var/lib/kubelet/pods/x/volumes/v/",
            "/var/lib/kubelet//pods/x/./volumes/v",
            "//var/lib/kubelet/pods/x/volumes/./v/.",
        ] {
            let ok = allowed_path(spelling, "target_path", &roots, state);
            assert_eq!(
                ok.unwrap(),
                PathBuf::from("/var/lib/kubelet/pods/x/volumes/v"),
                "{spelling:?} is one path"
            );
        }
        for bad in [
            "",
            "relative/path",
            "/etc/passwd",
            "/var/lib/kubelet/../../etc",
            "/tmp/state/volumes/x",
            "/tmp",
            "/var/lib/kubelet/pods/x\0/volumes/v",
        ] {
            let error = allowed_path(bad, "target_path", &roots, state).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn paging_tokens() {
        let id = new_id();
        assert_eq!(page_start("", looks_like_id).unwrap(), None);
        assert_eq!(page_start(&id, looks_like_id).unwrap(), Some(id));
        assert_eq!(
            page_start("garbage", looks_like_id).unwrap_err().code(),
            Code::Aborted
        );
    }
}
