//! Pure request checks shared by the services: required fields, capabilities, paths.

use std::path::{Component, Path, PathBuf};

use csi_proto::csi::v1::VolumeCapability;
use csi_proto::csi::v1::volume_capability::access_mode::Mode;
use csi_proto::csi::v1::volume_capability::{AccessMode, AccessType as CapabilityAccess};

use crate::error::DriverError;
use crate::options::MountOptions;
use crate::state::{AccessType, Filesystem};

/// The CSI spec's size limits (its "Size Limits" table): a string field, and all the keys and
/// values of a map, or of a repeated string field such as `mount_flags`. Paths are the
/// kernel's `PATH_MAX`: the kubelet's are longer than 128 bytes. Node IDs may be as long as a
/// Kubernetes node name (a DNS subdomain, 253). `volume_context` and `secrets` are not
/// bounded here: the kubelet puts service account tokens in `volume_context`, past 4 KiB.
pub const MAX_STRING: usize = 128;
pub const MAX_MAP: usize = 4096;
pub const MAX_PATH: usize = 4096;
pub const MAX_NODE_ID: usize = 256;

/// `INVALID_ARGUMENT` unless `value` is non-empty and within [`MAX_STRING`]: names and IDs.
pub fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str, DriverError> {
    required_within(value, field, MAX_STRING)
}

/// `INVALID_ARGUMENT` unless `value` is non-empty and within `limit` bytes.
pub fn required_within<'a>(
    value: &'a str,
    field: &'static str,
    limit: usize,
) -> Result<&'a str, DriverError> {
    if value.is_empty() {
        return Err(DriverError::Missing { field });
    }
    within(value.len(), field, limit)?;
    Ok(value)
}

/// `INVALID_ARGUMENT` if the keys and values of `map` exceed [`MAX_MAP`] bytes.
pub fn bounded_map<'a>(
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
    field: &'static str,
) -> Result<(), DriverError> {
    let size = map.into_iter().map(|(k, v)| k.len() + v.len()).sum();
    within(size, field, MAX_MAP)
}

fn within(size: usize, field: &'static str, limit: usize) -> Result<(), DriverError> {
    if size > limit {
        return Err(DriverError::TooLarge { field, size, limit });
    }
    Ok(())
}

/// The access type and mode of one capability; both are required.
pub fn capability(capability: &VolumeCapability) -> Result<(AccessType, Mode), DriverError> {
    let access_type = match &capability.access_type {
        Some(CapabilityAccess::Mount(mount)) => {
            let flags = mount.mount_flags.iter().map(String::len).sum();
            within(flags, "mount_flags", MAX_MAP)?;
            MountOptions::parse(&mount.mount_flags)?;
            AccessType::Mount
        }
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

/// The mount flags of a capability (see [`crate::options`]); a block capability has none.
pub fn mount_options(given: Option<&VolumeCapability>) -> Result<MountOptions, DriverError> {
    match given.and_then(|c| c.access_type.as_ref()) {
        Some(CapabilityAccess::Mount(mount)) => MountOptions::parse(&mount.mount_flags),
        _ => Ok(MountOptions::default()),
    }
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
    let text = required_within(path, field, MAX_PATH)?;
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

/// A recorded staging or target path as the driver spells it now: below its allowed root's
/// real place. Records written before the driver resolved a root that is a symbolic link
/// carry the link's spelling; `roots` pairs each configured root with its real place.
/// `None` when the path is spelled right already (or lies under no root).
pub fn real_spelling(path: &str, roots: &[(PathBuf, PathBuf)]) -> Option<String> {
    let path = Path::new(path);
    roots
        .iter()
        .filter(|(root, real)| root != real && path.starts_with(root))
        .max_by_key(|(root, _)| root.components().count())
        .and_then(|(root, real)| {
            let relative = path.strip_prefix(root).ok()?;
            Some(real.join(relative).display().to_string())
        })
}

/// Paging tokens are the last returned ID; anything else is a bad token (`ABORTED`).
pub fn page_start(
    token: &str,
    valid_id: impl Fn(&str) -> bool,
) -> Result<Option<String>, DriverError> {
    if token.is_empty() {
        return Ok(None);
    }
    within(token.len(), "starting_token", MAX_STRING)?;
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
    fn sizes_are_bounded_as_the_csi_spec_says_and_never_echoed() {
        let long = |n: usize| "x".repeat(n);
        let map =
            |bytes: usize| std::collections::HashMap::from([("k".to_string(), long(bytes - 1))]);
        let roots = [PathBuf::from("/var/lib/kubelet")];
        let path = |n: usize| format!("/var/lib/kubelet/{}", long(n - 17));
        let state = Path::new("/state");
        // What is checked, and whether it passes.
        let table: [(&str, Result<(), DriverError>, bool); 12] = [
            ("name of 128", required(&long(128), "name").map(drop), true),
            ("name of 129", required(&long(129), "name").map(drop), false),
            (
                "node of 256",
                required_within(&long(256), "node_id", MAX_NODE_ID).map(drop),
                true,
            ),
            (
                "node of 257",
                required_within(&long(257), "node_id", MAX_NODE_ID).map(drop),
                false,
            ),
            ("map of 4096", bounded_map(&map(4096), "parameters"), true),
            ("map of 4097", bounded_map(&map(4097), "parameters"), false),
            (
                "path of 4096",
                allowed_path(&path(4096), "target_path", &roots, state).map(drop),
                true,
            ),
            (
                "path of 4097",
                allowed_path(&path(4097), "target_path", &roots, state).map(drop),
                false,
            ),
            (
                "token of 129",
                page_start(&long(129), |_| true).map(drop),
                false,
            ),
            ("empty token", page_start("", |_| false).map(drop), true),
            (
                "flags of 4096",
                capability(&mount_with_flags(vec!["ro".to_string(); 2048])).map(drop),
                true,
            ),
            (
                "flags of 4098",
                capability(&mount_with_flags(vec!["ro".to_string(); 2049])).map(drop),
                false,
            ),
        ];
        for (case, result, passes) in table {
            match result {
                Ok(()) => assert!(passes, "{case}: accepted"),
                Err(error) => {
                    assert!(!passes, "{case}: {error}");
                    assert_eq!(error.code(), Code::InvalidArgument, "{case}");
                    assert!(error.to_string().len() < 100, "{case}: {error}");
                }
            }
        }
    }

    fn mount_with_flags(mount_flags: Vec<String>) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(CapabilityAccess::Mount(
                csi_proto::csi::v1::volume_capability::MountVolume {
                    mount_flags,
                    ..Default::default()
                },
            )),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter.into(),
            }),
        }
    }

    #[test]
    fn records_of_a_symlinked_root_are_respelled_below_its_real_place() {
        let roots = [
            (
                PathBuf::from("/var/lib/kubelet"),
                PathBuf::from("/data/kubelet"),
            ),
            (PathBuf::from("/plain"), PathBuf::from("/plain")),
        ];
        for (path, spelled) in [
            ("/var/lib/kubelet/pods/p/v", Some("/data/kubelet/pods/p/v")),
            ("/data/kubelet/pods/p/v", None),
            ("/plain/t", None),
            ("/var/lib/kubeletx/t", None),
            ("/elsewhere/t", None),
        ] {
            assert_eq!(real_spelling(path, &roots).as_deref(), spelled, "{path}");
        }
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
