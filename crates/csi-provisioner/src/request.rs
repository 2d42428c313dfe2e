//! The pure pieces of a provisioning: the volume name, fsType, capabilities, extra metadata,
//! the classification of CreateVolume errors, the PV's size and node affinity — as
//! external-provisioner builds them (pkg/controller/controller.go `prepareProvision`,
//! `Provision`, `checkError`, `makeVolumeName`) — and when a PV the API server refuses
//! costs the volume.

use std::collections::{BTreeMap, HashMap};

use csi_kinds::capability::{AccessKind, CapabilityError, access_mode, volume_capability};
use csi_proto::csi::v1 as csi;
use tonic::Code;

use crate::provision::ProvisionPlan;

/// The StorageClass parameter for the filesystem type.
pub const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// The deprecated, unprefixed spelling (any case).
const DEPRECATED_FSTYPE_KEY: &str = "fstype";
/// `--extra-create-metadata` parameters.
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("volume name prefix cannot be empty")]
    EmptyPrefix,
    #[error("corrupted PVC object, it is missing UID")]
    MissingUid,
    /// Go's message for the slice upstream takes, which panics there.
    #[error(
        "--volume-name-uuid-length {length}: no claim UID has that many characters (runtime error: slice bounds out of range [:{length}] with length {available})"
    )]
    UuidLength { length: i64, available: usize },
    #[error("fstype specified in parameters with both \"fstype\" and \"{FSTYPE_KEY}\" keys")]
    ConflictingFsType,
    #[error("claim has no access modes")]
    NoAccessModes,
    #[error(transparent)]
    AccessMode(#[from] CapabilityError),
}

/// `<prefix>-<claim uid>`; with `--volume-name-uuid-length` N ≥ 0, the UID without dashes cut
/// to N characters (0: `<prefix>-`, for every claim, as upstream). The name is CreateVolume's
/// idempotency key and the PV's name.
pub fn volume_name(
    prefix: &str,
    claim_uid: &str,
    uuid_length: i64,
) -> Result<String, RequestError> {
    if prefix.is_empty() {
        return Err(RequestError::EmptyPrefix);
    }
    if claim_uid.is_empty() {
        return Err(RequestError::MissingUid);
    }
    if uuid_length == -1 {
        return Ok(format!("{prefix}-{claim_uid}"));
    }
    let compact: String = claim_uid.chars().filter(|c| *c != '-').collect();
    let cut = usize::try_from(uuid_length)
        .ok()
        .and_then(|length| compact.get(..length))
        .ok_or(RequestError::UuidLength {
            length: uuid_length,
            available: compact.len(),
        })?;
    Ok(format!("{prefix}-{cut}"))
}

/// The fsType: the class's `csi.storage.k8s.io/fstype`, or the deprecated `fstype` (any
/// case), never both; else `--default-fstype`.
pub fn fs_type(
    parameters: &BTreeMap<String, String>,
    default: &str,
) -> Result<String, RequestError> {
    let prefixed = parameters.get(FSTYPE_KEY);
    let deprecated = parameters
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(DEPRECATED_FSTYPE_KEY))
        .map(|(_, v)| v);
    match (prefixed, deprecated) {
        (Some(_), Some(_)) => Err(RequestError::ConflictingFsType),
        (Some(value), None) => Ok(value.clone()),
        (None, Some(value)) => {
            tracing::warn!(
                "the StorageClass parameter \"fstype\" is deprecated; use \"{FSTYPE_KEY}\""
            );
            Ok(value.clone())
        }
        (None, None) => Ok(default.to_string()),
    }
}

/// One VolumeCapability per access mode of the claim; Block claims get `block{}`, others
/// `mount{fsType, mountOptions}`.
pub fn volume_capabilities(
    access_modes: &[String],
    volume_mode: Option<&str>,
    fs_type: &str,
    mount_options: &[String],
    single_node_multi_writer: bool,
) -> Result<Vec<csi::VolumeCapability>, RequestError> {
    if access_modes.is_empty() {
        return Err(RequestError::NoAccessModes);
    }
    let kind = AccessKind::from_volume_mode(volume_mode, fs_type, mount_options.to_vec());
    access_modes
        .iter()
        .map(|mode| {
            Ok(volume_capability(
                &kind,
                access_mode(mode, single_node_multi_writer)?,
            ))
        })
        .collect()
}

/// `--extra-create-metadata`: the claim's and the PV's names as parameters.
pub fn add_extra_metadata(
    parameters: &mut BTreeMap<String, String>,
    claim_name: &str,
    claim_namespace: &str,
    pv_name: &str,
) {
    parameters.insert(PVC_NAME_KEY.to_string(), claim_name.to_string());
    parameters.insert(PVC_NAMESPACE_KEY.to_string(), claim_namespace.to_string());
    parameters.insert(PV_NAME_KEY.to_string(), pv_name.to_string());
}

/// What a failed CreateVolume means for the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The driver may still be working on it: keep retrying with the same request.
    InBackground,
    /// Final for this attempt: retry with backoff, inputs may change.
    Finished,
    /// Give the scheduler another choice: remove `selected-node`.
    Reschedule,
    /// InvalidArgument: retried slowly (infeasible).
    Infeasible,
}

/// `checkError` plus the library's infeasible check: which errors may mean the volume is
/// still being created.
pub fn classify(code: Code, topology_supported: bool, has_selected_node: bool) -> Outcome {
    match code {
        Code::InvalidArgument => Outcome::Infeasible,
        Code::ResourceExhausted if topology_supported && has_selected_node => Outcome::Reschedule,
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted => {
            Outcome::InBackground
        }
        _ => Outcome::Finished,
    }
}

/// The size a PV records: the driver's, or the requested one when the driver says 0
/// ("unknown", allowed by the CSI spec). `None` when the driver returned less than asked.
pub fn provisioned_bytes(requested: i64, returned: i64) -> Option<i64> {
    match returned {
        0 => Some(requested),
        n if n < requested => None,
        n => Some(n),
    }
}

/// The CreateVolumeRequest of a plan, with the provisioner secret's data and the content
/// source (a snapshot's handle is read when the plan is carried out).
pub fn create_volume(
    plan: &ProvisionPlan,
    secrets: HashMap<String, String>,
    content_source: Option<csi::VolumeContentSource>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: plan.name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: plan.requested_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: plan.capabilities.clone(),
        parameters: plan.parameters.clone().into_iter().collect(),
        secrets,
        volume_content_source: content_source,
        accessibility_requirements: plan.accessibility.clone(),
        mutable_parameters: plan.mutable_parameters.clone().into_iter().collect(),
    }
}

/// A content source of a snapshot's handle.
pub fn snapshot_content(snapshot_id: String) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource { snapshot_id },
        )),
    }
}

/// A content source of a volume's handle.
pub fn volume_content(volume_id: String) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource { volume_id },
        )),
    }
}

/// A CreateVolume answer the PV cannot be made of.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreatedVolumeError {
    #[error("CreateVolume returned no volume")]
    NoVolume,
    #[error("created volume capacity {returned} less than requested capacity {requested}")]
    TooSmall {
        volume_id: String,
        returned: i64,
        requested: i64,
    },
    #[error("volume content source missing")]
    NoContentSource { volume_id: String },
}

impl CreatedVolumeError {
    /// The message when deleting the volume `pv` (its name) failed too, as upstream words it.
    pub fn cleanup_failed(&self, pv: &str, status: &tonic::Status) -> String {
        let cleanup = match self {
            CreatedVolumeError::NoContentSource { .. } => "cleanup",
            _ => "Cleanup",
        };
        format!(
            "{self}. {cleanup} of volume {pv} failed, volume is orphaned: {}",
            csi_grpc::conn::GoStatus(status)
        )
    }

    /// The volume that was created but no PV will record: it is deleted again.
    pub fn abandoned_volume(&self) -> Option<&str> {
        match self {
            CreatedVolumeError::NoVolume => None,
            CreatedVolumeError::TooSmall { volume_id, .. }
            | CreatedVolumeError::NoContentSource { volume_id } => Some(volume_id),
        }
    }
}

/// The created volume and the size its PV records, checked against the request: not smaller
/// than asked, and carrying the data source it was asked to copy.
pub fn created_volume(
    response: csi::CreateVolumeResponse,
    requested: i64,
    from_source: bool,
) -> Result<(csi::Volume, i64), CreatedVolumeError> {
    let volume = response.volume.ok_or(CreatedVolumeError::NoVolume)?;
    let Some(bytes) = provisioned_bytes(requested, volume.capacity_bytes) else {
        return Err(CreatedVolumeError::TooSmall {
            volume_id: volume.volume_id,
            returned: volume.capacity_bytes,
            requested,
        });
    };
    if from_source && volume.content_source.is_none() {
        return Err(CreatedVolumeError::NoContentSource {
            volume_id: volume.volume_id,
        });
    }
    Ok((volume, bytes))
}

/// How many times the API server may refuse a new volume's PV before the volume is deleted
/// and provisioning starts over: sig-storage-lib-external-provisioner's default
/// `createProvisionedPVRetryCount`. (external-provisioner retries the PV for good instead,
/// and the volume outlives its claim when the refusal is permanent.)
pub const PV_SAVE_REFUSALS: u32 = 5;

/// What one failed PV create leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveFailure {
    /// Retry; the claim's PV has been refused `refusals` times.
    Retry { refusals: u32 },
    /// Delete the volume: its PV was refused [`PV_SAVE_REFUSALS`] times.
    DeleteVolume,
}

/// `refusals` earlier refusals, then a failure with HTTP status `code` (`None`: no answer).
/// Only a refusal counts: a 4xx status says the server did not create the PV and will not
/// for the same object (a timeout, a conflict, throttling or an authentication error may
/// pass, and a lost answer may hide a created PV, whose volume must stay).
pub fn save_failure(refusals: u32, code: Option<u16>) -> SaveFailure {
    let refused =
        code.is_some_and(|c| (400..500).contains(&c) && ![401, 408, 409, 429].contains(&c));
    if !refused {
        return SaveFailure::Retry { refusals };
    }
    match refusals + 1 {
        n if n >= PV_SAVE_REFUSALS => SaveFailure::DeleteVolume,
        n => SaveFailure::Retry { refusals: n },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_volumes_are_checked_and_refusals_read_as_upstreams() {
        let response = |bytes: i64, with_source: bool| csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: bytes,
                content_source: with_source.then(|| volume_content("src".into())),
                ..Default::default()
            }),
        };
        let sizes = |result: Result<(csi::Volume, i64), CreatedVolumeError>| {
            result.map(|(volume, bytes)| (volume.volume_id, bytes))
        };
        assert_eq!(
            sizes(created_volume(response(2048, false), 1024, false)),
            Ok(("vol-1".into(), 2048))
        );
        assert_eq!(
            sizes(created_volume(response(0, false), 1024, false)),
            Ok(("vol-1".into(), 1024)),
            "0 is unknown: the request is recorded"
        );
        let small = created_volume(response(512, false), 1024, false).unwrap_err();
        assert_eq!(small.abandoned_volume(), Some("vol-1"));
        assert_eq!(
            small.to_string(),
            "created volume capacity 512 less than requested capacity 1024"
        );
        let unavailable = tonic::Status::unavailable("driver restarting");
        assert_eq!(
            small.cleanup_failed("pvc-1", &unavailable),
            "created volume capacity 512 less than requested capacity 1024. Cleanup of volume pvc-1 \
             failed, volume is orphaned: rpc error: code = Unavailable desc = driver restarting"
        );
        let sourceless = created_volume(response(2048, false), 1024, true).unwrap_err();
        assert_eq!(sourceless.abandoned_volume(), Some("vol-1"));
        assert_eq!(
            sourceless.cleanup_failed("pvc-1", &unavailable),
            "volume content source missing. cleanup of volume pvc-1 failed, volume is orphaned: \
             rpc error: code = Unavailable desc = driver restarting"
        );
        assert!(created_volume(response(2048, true), 1024, true).is_ok());
        let none = created_volume(csi::CreateVolumeResponse { volume: None }, 1, false);
        assert_eq!(none.unwrap_err().abandoned_volume(), None);
    }

    #[test]
    fn refused_pvs_cost_the_volume_after_five_refusals() {
        let retry = |refusals| SaveFailure::Retry { refusals };
        let table = [
            ("the first 422", 0, Some(422), retry(1)),
            ("a 403", 2, Some(403), retry(3)),
            ("the fifth refusal", 4, Some(422), SaveFailure::DeleteVolume),
            (
                "refused again after a failed delete",
                5,
                Some(400),
                SaveFailure::DeleteVolume,
            ),
            ("no answer", 4, None, retry(4)),
            ("a server error", 4, Some(500), retry(4)),
            ("a timeout", 4, Some(504), retry(4)),
            ("throttled", 4, Some(429), retry(4)),
            ("unauthenticated", 4, Some(401), retry(4)),
            ("a conflict", 4, Some(409), retry(4)),
            ("a request timeout", 4, Some(408), retry(4)),
        ];
        for (what, refusals, code, expected) in table {
            assert_eq!(save_failure(refusals, code), expected, "{what}");
        }
    }

    const UID: &str = "0b6f1c2e-5d4a-4c3b-9a8f-112233445566";

    #[test]
    fn volume_names() {
        let table: [(&str, i64, Result<&str, RequestError>); 7] = [
            ("pvc", -1, Ok("pvc-0b6f1c2e-5d4a-4c3b-9a8f-112233445566")),
            ("vol", 8, Ok("vol-0b6f1c2e")),
            ("vol", 0, Ok("vol-")),
            ("", -1, Err(RequestError::EmptyPrefix)),
            ("vol", 32, Ok("vol-0b6f1c2e5d4a4c3b9a8f112233445566")),
            (
                "pvc",
                33,
                Err(RequestError::UuidLength {
                    length: 33,
                    available: 32,
                }),
            ),
            (
                "pvc",
                -2,
                Err(RequestError::UuidLength {
                    length: -2,
                    available: 32,
                }),
            ),
        ];
        for (prefix, length, expected) in table {
            assert_eq!(
                volume_name(prefix, UID, length),
                expected.map(str::to_string),
                "{prefix} {length}"
            );
        }
        assert_eq!(volume_name("pvc", "", -1), Err(RequestError::MissingUid));
    }

    #[test]
    fn fs_types() {
        let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let table = [
            (params(&[(FSTYPE_KEY, "xfs")]), Ok("xfs")),
            (params(&[("FsType", "ext3")]), Ok("ext3")),
            (params(&[]), Ok("ext4")),
            (
                params(&[(FSTYPE_KEY, "xfs"), ("fstype", "ext3")]),
                Err(RequestError::ConflictingFsType),
            ),
        ];
        for (parameters, expected) in table {
            assert_eq!(
                fs_type(&parameters, "ext4"),
                expected.map(str::to_string),
                "{parameters:?}"
            );
        }
    }

    #[test]
    fn one_capability_per_access_mode() {
        use csi::volume_capability::AccessType;
        use csi::volume_capability::access_mode::Mode;
        let modes = vec!["ReadWriteOnce".to_string(), "ReadOnlyMany".to_string()];
        let capabilities =
            volume_capabilities(&modes, None, "ext4", &["noatime".into()], true).unwrap();
        let got: Vec<i32> = capabilities
            .iter()
            .map(|c| c.access_mode.unwrap().mode)
            .collect();
        assert_eq!(
            got,
            [
                Mode::SingleNodeMultiWriter as i32,
                Mode::MultiNodeReaderOnly as i32
            ]
        );
        assert!(
            matches!(&capabilities[0].access_type, Some(AccessType::Mount(m)) if m.fs_type == "ext4" && m.mount_flags == ["noatime"])
        );
        let block = volume_capabilities(&modes[..1], Some("Block"), "ext4", &[], false).unwrap();
        assert!(matches!(block[0].access_type, Some(AccessType::Block(_))));
        assert_eq!(
            volume_capabilities(&[], None, "", &[], false),
            Err(RequestError::NoAccessModes)
        );
        assert!(matches!(
            volume_capabilities(&["Sometimes".into()], None, "", &[], false),
            Err(RequestError::AccessMode(_))
        ));
    }

    #[test]
    fn create_volume_errors_are_classified_like_upstream() {
        let table = [
            (Code::InvalidArgument, true, true, Outcome::Infeasible),
            (Code::ResourceExhausted, true, true, Outcome::Reschedule),
            (Code::ResourceExhausted, false, true, Outcome::Finished),
            (Code::ResourceExhausted, true, false, Outcome::Finished),
            (Code::DeadlineExceeded, true, true, Outcome::InBackground),
            (Code::Unavailable, false, false, Outcome::InBackground),
            (Code::Aborted, false, false, Outcome::InBackground),
            (Code::Cancelled, false, false, Outcome::InBackground),
            (Code::Internal, true, true, Outcome::Finished),
            (Code::NotFound, true, true, Outcome::Finished),
        ];
        for (code, topology, selected, expected) in table {
            assert_eq!(classify(code, topology, selected), expected, "{code:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(provisioned_bytes(100, 0), Some(100));
        assert_eq!(provisioned_bytes(100, 150), Some(150));
        assert_eq!(provisioned_bytes(100, 99), None);
    }

    #[test]
    fn extra_metadata() {
        let mut parameters = BTreeMap::from([("type".to_string(), "fast".to_string())]);
        add_extra_metadata(&mut parameters, "data", "apps", "pvc-1");
        assert_eq!(parameters[PVC_NAME_KEY], "data");
        assert_eq!(parameters[PVC_NAMESPACE_KEY], "apps");
        assert_eq!(parameters[PV_NAME_KEY], "pvc-1");
        assert_eq!(parameters["type"], "fast");
    }
}
