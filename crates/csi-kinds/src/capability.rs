//! Kubernetes access modes and volume modes as CSI volume capabilities — the one mapping the
//! provisioner, the attacher and the (simulated) kubelet all use (upstream: external-provisioner
//! `getAccessMode`, external-attacher `GetVolumeCapabilities`, kubelet `asCSIAccessModeV1`).

use csi_proto::csi::v1::VolumeCapability;
use csi_proto::csi::v1::volume_capability::access_mode::Mode;
use csi_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

/// csi-lib-utils' texts (`accessmodes.ToCSIAccessMode`), which upstream's attacher and
/// resizer report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// No mode CSI knows, or none at all; the list as Go's `%+v` prints it.
    #[error("unsupported AccessMode combination: [{}]", .0.join(" "))]
    Unsupported(Vec<String>),
    #[error(
        "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume"
    )]
    ReadWriteOncePodNotAlone,
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    ReadOnlyWithReadWriteOnce,
}

/// The one CSI access mode for a volume's Kubernetes access modes, as external-attacher sends it
/// in ControllerPublishVolume (csi-lib-utils `accessmodes.ToCSIAccessMode`): ReadWriteOncePod
/// must stand alone; ReadWriteMany wins; ReadOnlyMany with ReadWriteOnce is an error; else the
/// single mode's mapping ([`access_mode`]).
pub fn volume_access_mode(
    modes: &[String],
    single_node_multi_writer: bool,
) -> Result<Mode, CapabilityError> {
    let has = |mode: &str| modes.iter().any(|m| m == mode);
    if has("ReadWriteOncePod") {
        if modes.len() > 1 {
            return Err(CapabilityError::ReadWriteOncePodNotAlone);
        }
        return access_mode("ReadWriteOncePod", single_node_multi_writer);
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has("ReadOnlyMany"), has("ReadWriteOnce")) {
        (true, true) => Err(CapabilityError::ReadOnlyWithReadWriteOnce),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) => access_mode("ReadWriteOnce", single_node_multi_writer),
        (false, false) => Err(CapabilityError::Unsupported(modes.to_vec())),
    }
}

/// The CSI access mode for a Kubernetes one. With the driver's SINGLE_NODE_MULTI_WRITER
/// capability, ReadWriteOnce (several pods of one node may write) becomes
/// SINGLE_NODE_MULTI_WRITER and ReadWriteOncePod becomes SINGLE_NODE_SINGLE_WRITER; without it
/// both are SINGLE_NODE_WRITER.
pub fn access_mode(
    kubernetes_mode: &str,
    single_node_multi_writer: bool,
) -> Result<Mode, CapabilityError> {
    Ok(match (kubernetes_mode, single_node_multi_writer) {
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadWriteOnce" | "ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        (other, _) => return Err(CapabilityError::Unsupported(vec![other.to_string()])),
    })
}

/// How the volume is presented: a filesystem (with fsType and mount flags) or a raw block
/// device (`volumeMode: Block`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessKind {
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
    },
    Block,
}

impl AccessKind {
    /// From a PV/PVC `volumeMode` (absent means Filesystem).
    pub fn from_volume_mode(
        volume_mode: Option<&str>,
        fs_type: impl Into<String>,
        mount_flags: Vec<String>,
    ) -> Self {
        if volume_mode == Some("Block") {
            AccessKind::Block
        } else {
            AccessKind::Mount {
                fs_type: fs_type.into(),
                mount_flags,
            }
        }
    }
}

/// One VolumeCapability.
pub fn volume_capability(kind: &AccessKind, mode: Mode) -> VolumeCapability {
    let access_type = match kind {
        AccessKind::Block => AccessType::Block(BlockVolume {}),
        AccessKind::Mount {
            fs_type,
            mount_flags,
        } => AccessType::Mount(MountVolume {
            fs_type: fs_type.clone(),
            mount_flags: mount_flags.clone(),
            volume_mount_group: String::new(),
        }),
    };
    VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes() {
        let table = [
            ("ReadWriteOnce", false, Mode::SingleNodeWriter),
            ("ReadWriteOnce", true, Mode::SingleNodeMultiWriter),
            ("ReadWriteOncePod", false, Mode::SingleNodeWriter),
            ("ReadWriteOncePod", true, Mode::SingleNodeSingleWriter),
            ("ReadOnlyMany", false, Mode::MultiNodeReaderOnly),
            ("ReadOnlyMany", true, Mode::MultiNodeReaderOnly),
            ("ReadWriteMany", false, Mode::MultiNodeMultiWriter),
            ("ReadWriteMany", true, Mode::MultiNodeMultiWriter),
        ];
        for (kubernetes, multi, expected) in table {
            assert_eq!(
                access_mode(kubernetes, multi),
                Ok(expected),
                "{kubernetes} multi={multi}"
            );
        }
        assert_eq!(
            access_mode("WriteSometimes", false),
            Err(CapabilityError::Unsupported(vec!["WriteSometimes".into()]))
        );
    }

    #[test]
    fn capabilities() {
        let mount = AccessKind::from_volume_mode(None, "ext4", vec!["noatime".into()]);
        let capability = volume_capability(&mount, Mode::SingleNodeWriter);
        assert_eq!(
            capability.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }))
        );
        assert_eq!(
            capability.access_mode.map(|m| m.mode),
            Some(Mode::SingleNodeWriter as i32)
        );
        let block = AccessKind::from_volume_mode(Some("Block"), "ext4", vec![]);
        assert_eq!(block, AccessKind::Block);
        assert_eq!(
            volume_capability(&block, Mode::MultiNodeMultiWriter).access_type,
            Some(AccessType::Block(BlockVolume {}))
        );
    }

    #[test]
    fn a_volume_has_one_access_mode_as_the_attacher_maps_it() {
        use CapabilityError as E;
        let modes = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: Vec<(&[&str], bool, Result<Mode, E>)> = vec![
            (&["ReadWriteOncePod"], false, Ok(Mode::SingleNodeWriter)),
            (
                &["ReadWriteOncePod"],
                true,
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                true,
                Err(E::ReadWriteOncePodNotAlone),
            ),
            (
                &["ReadWriteMany", "ReadOnlyMany"],
                false,
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadWriteMany", "ReadWriteOnce"],
                true,
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                false,
                Err(E::ReadOnlyWithReadWriteOnce),
            ),
            (&["ReadOnlyMany"], true, Ok(Mode::MultiNodeReaderOnly)),
            (&["ReadWriteOnce"], false, Ok(Mode::SingleNodeWriter)),
            (&["ReadWriteOnce"], true, Ok(Mode::SingleNodeMultiWriter)),
            (&[], false, Err(E::Unsupported(vec![]))),
            (
                &["Sometimes", "Never"],
                false,
                Err(E::Unsupported(modes(&["Sometimes", "Never"]))),
            ),
        ];
        for (given, multi_writer, expected) in cases {
            assert_eq!(
                volume_access_mode(&modes(given), multi_writer),
                expected,
                "{given:?} with SINGLE_NODE_MULTI_WRITER={multi_writer}"
            );
        }
        let texts = [
            (
                E::Unsupported(vec![]),
                "unsupported AccessMode combination: []",
            ),
            (
                E::Unsupported(modes(&["Sometimes", "Never"])),
                "unsupported AccessMode combination: [Sometimes Never]",
            ),
            (
                E::ReadOnlyWithReadWriteOnce,
                "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
            ),
        ];
        for (error, text) in texts {
            assert_eq!(error.to_string(), text);
        }
    }
}
