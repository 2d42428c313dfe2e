//! Every way a driver operation fails, and the one mapping of those failures to gRPC codes.
//! The codes follow the CSI spec's error tables; messages name the objects concerned, never
//! secrets (no variant carries request secrets).

use std::path::PathBuf;

use tonic::{Code, Status};

use crate::state::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    // INVALID_ARGUMENT: the request itself is wrong.
    #[error("{field} is required")]
    Missing { field: &'static str },
    #[error("{field} is {size} bytes: at most {limit} are accepted")]
    TooLarge {
        field: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("{field} must not be negative")]
    Negative { field: &'static str },
    #[error("capacity_range asks for nothing: set required_bytes or limit_bytes")]
    EmptyCapacityRange,
    #[error("volume capabilities mix block and mount access types")]
    MixedAccessTypes,
    #[error("volume capabilities ask for different fs_types ({first:?} and {second:?})")]
    MixedFsTypes { first: String, second: String },
    #[error("fs_type {fs_type:?} is not supported: ext4, or none for a directory volume")]
    UnsupportedFsType { fs_type: String },
    #[error(
        "an ext4 volume is single-node: a multi-node access mode needs a volume without fs_type"
    )]
    MultiNodeExt4,
    #[error("volume_capability access type does not match the volume")]
    AccessTypeMismatch,
    #[error("source {kind} and new volume differ in access type or fs_type")]
    SourceLayoutMismatch { kind: &'static str },
    #[error(
        "mount flag {flag:?} is not supported: csi-hostpath applies only {} to its bind mounts",
        crate::options::APPLIED
    )]
    UnsupportedMountFlag { flag: String },
    #[error("an ephemeral inline volume is a filesystem volume: block access is not supported")]
    EphemeralBlock,
    #[error(
        "fs_type {fs_type:?} is not supported for an ephemeral inline volume: it is a directory (no fs_type)"
    )]
    EphemeralFsType { fs_type: String },
    #[error(
        "an ephemeral inline volume is published without staging: staging_target_path must be empty"
    )]
    EphemeralStaged,
    #[error(
        "volume_id {id:?} cannot name an ephemeral inline volume: 1 to 128 letters, digits, '-' or '_', and not a UUID (the driver's persistent volume IDs)"
    )]
    InvalidEphemeralId { id: String },
    #[error("{field} {} {why}", path.display())]
    PathNotAllowed {
        field: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("parameter kind={kind:?} names no configured capacity pool")]
    UnknownCapacityPool { kind: String },
    #[error("mutable parameter {name:?} is not accepted (accepted: {accepted:?})")]
    MutableParameterNotAccepted { name: String, accepted: Vec<String> },
    #[error("snapshot_ids do not match the members of group snapshot {group}")]
    GroupMembersMismatch { group: String },
    #[error(
        "base snapshot {base} (of volume {base_volume}) and target snapshot {target} (of volume {target_volume}) are not snapshots of the same volume"
    )]
    SnapshotsOfDifferentVolumes {
        base: String,
        base_volume: String,
        target: String,
        target_volume: String,
    },
    #[error(
        "target snapshot {target} was taken before base snapshot {base}: the target is the later snapshot"
    )]
    TargetBeforeBase { base: String, target: String },

    // OUT_OF_RANGE: a size the request asks for cannot be given.
    #[error("required_bytes {required} exceeds limit_bytes {limit}")]
    RequiredAboveLimit { required: u64, limit: u64 },
    #[error("requested {size} bytes exceeds the maximum volume size {max}")]
    AboveMaximumSize { size: u64, max: u64 },
    #[error("limit_bytes {limit} is below the volume's {current} bytes: volumes do not shrink")]
    LimitBelowSize { current: u64, limit: u64 },
    #[error("an ext4 volume needs at least {min} bytes; limit_bytes is {limit}")]
    LimitBelowExt4Minimum { min: u64, limit: u64 },
    #[error("volume smaller than source {kind} ({source_bytes} bytes)")]
    SmallerThanSource {
        kind: &'static str,
        source_bytes: u64,
    },
    #[error("source {kind} holds more data than the volume's {capacity} bytes")]
    SourceDataAboveCapacity { kind: &'static str, capacity: u64 },
    #[error("starting_offset {offset} is negative")]
    NegativeStartingOffset { offset: i64 },
    #[error("starting_offset {offset} is beyond the snapshot's volume of {capacity} bytes")]
    StartingOffsetBeyondCapacity { offset: u64, capacity: u64 },

    // NOT_FOUND
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("source {kind} {id} not found")]
    SourceNotFound { kind: &'static str, id: String },
    #[error("volume {id} is not staged or published at {path}")]
    NotAtPath { id: String, path: String },

    // ALREADY_EXISTS: the name or place is taken by something incompatible with the request.
    #[error("{kind} {name} exists {how}")]
    ExistsWithOtherParameters {
        kind: &'static str,
        name: String,
        how: &'static str,
    },
    #[error("volume {id} is already published to node {node} with readonly={readonly}")]
    PublishedWithOtherReadonly {
        id: String,
        node: String,
        readonly: bool,
    },
    #[error("volume {id} is already staged at {path}")]
    StagedElsewhere { id: String, path: String },
    #[error("volume {id} is already staged with other mount flags")]
    StagedWithOtherOptions { id: String },
    #[error("ephemeral inline volume {id} is already published at {target} on node {node}")]
    EphemeralElsewhere {
        id: String,
        node: String,
        target: String,
    },
    #[error("volume {id} is already published at {target} with other options")]
    PublishedWithOtherOptions { id: String, target: String },

    // FAILED_PRECONDITION: the request is valid but the state of things refuses it now.
    #[error("volume {id} is still published to {nodes:?}")]
    StillPublished { id: String, nodes: Vec<String> },
    #[error("volume {id} is single-node and already published to node {node}")]
    SingleNodeInUse { id: String, node: String },
    #[error("volume {id} is single-writer and already published at another target")]
    SingleWriterInUse { id: String },
    #[error("snapshot {id} belongs to group snapshot {group}; delete the group instead")]
    SnapshotInGroup { id: String, group: String },
    #[error("volume {id} is not published to node {node}")]
    NotPublished { id: String, node: String },
    #[error("volume {id} has no export to node {node}: ControllerPublishVolume makes it")]
    NoExport { id: String, node: String },
    #[error("volume {id} is not staged at {path}")]
    NotStaged { id: String, path: String },
    #[error("{path} has a mount that is not volume {id}'s: it is left alone")]
    OtherMountAt { id: String, path: String },
    #[error(
        "volume {id} is an ephemeral inline volume: {rpc} does not apply to it (its NodeUnpublishVolume deletes it)"
    )]
    Ephemeral { id: String, rpc: &'static str },
    #[error("{action} needs {privilege}, which this node plugin lacks")]
    MissingPrivilege {
        action: &'static str,
        privilege: &'static str,
    },
    #[error(
        "snapshot {id} is of a directory volume (a tar archive, no blocks): snapshot metadata is served for block and ext4 volumes only; back it up in full"
    )]
    NoBlockMetadata { id: String },

    // RESOURCE_EXHAUSTED
    #[error("not enough capacity on node {node} for {size} bytes")]
    NoCapacityOnNode { node: String, size: u64 },
    #[error("not enough capacity for {size} bytes on any of {nodes:?}")]
    NoCapacityOnAnyNode { size: u64, nodes: Vec<String> },
    #[error("not enough capacity on node {node} to grow volume {id} to {size} bytes")]
    NoCapacityToGrow { node: String, id: String, size: u64 },
    #[error("no node in the accessibility requirements is served by this driver (key {key})")]
    NoServedNode { key: String },
    #[error("node {node} already has the maximum of {max} volumes published")]
    NodeVolumeLimit { node: String, max: i64 },

    // ABORTED: another operation is (or was just) at work on the same object; retrying helps.
    #[error("an operation on {key} is already in progress")]
    OperationPending { key: String },
    #[error("{kind} {name} is being created by another driver instance")]
    CreatingElsewhere { kind: &'static str, name: String },
    #[error("volume {name} is being deleted")]
    BeingDeleted { name: String },
    #[error("{kind} {name} was deleted meanwhile")]
    DeletedMeanwhile { kind: &'static str, name: String },
    #[error("invalid starting_token {token:?}")]
    InvalidStartingToken { token: String },

    // UNIMPLEMENTED
    #[error("ControllerPublish/UnpublishVolume are disabled (--enable-attach=false)")]
    AttachDisabled,
    #[error("{rpc} is not served with --volume-health=v1.12")]
    HealthRpcsOff { rpc: &'static str },

    // INTERNAL
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("block volume {id} has no loop device")]
    NoLoopDevice { id: String },
    #[error("driver task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl DriverError {
    /// An I/O failure, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Self::NotFound {
            kind,
            id: id.into(),
        }
    }

    pub fn code(&self) -> Code {
        use DriverError::*;
        match self {
            Missing { .. }
            | TooLarge { .. }
            | Negative { .. }
            | EmptyCapacityRange
            | MixedAccessTypes
            | MixedFsTypes { .. }
            | UnsupportedFsType { .. }
            | MultiNodeExt4
            | AccessTypeMismatch
            | SourceLayoutMismatch { .. }
            | PathNotAllowed { .. }
            | UnsupportedMountFlag { .. }
            | EphemeralBlock
            | EphemeralFsType { .. }
            | EphemeralStaged
            | InvalidEphemeralId { .. }
            | UnknownCapacityPool { .. }
            | MutableParameterNotAccepted { .. }
            | GroupMembersMismatch { .. }
            | SnapshotsOfDifferentVolumes { .. }
            | TargetBeforeBase { .. } => Code::InvalidArgument,
            RequiredAboveLimit { .. }
            | AboveMaximumSize { .. }
            | LimitBelowSize { .. }
            | LimitBelowExt4Minimum { .. }
            | SmallerThanSource { .. }
            | SourceDataAboveCapacity { .. }
            | NegativeStartingOffset { .. }
            | StartingOffsetBeyondCapacity { .. } => Code::OutOfRange,
            NotFound { .. } | SourceNotFound { .. } | NotAtPath { .. } => Code::NotFound,
            ExistsWithOtherParameters { .. }
            | PublishedWithOtherReadonly { .. }
            | StagedElsewhere { .. }
            | StagedWithOtherOptions { .. }
            | EphemeralElsewhere { .. }
            | PublishedWithOtherOptions { .. } => Code::AlreadyExists,
            StillPublished { .. }
            | SingleNodeInUse { .. }
            | SingleWriterInUse { .. }
            | SnapshotInGroup { .. }
            | NotPublished { .. }
            | NoExport { .. }
            | NotStaged { .. }
            | OtherMountAt { .. }
            | Ephemeral { .. }
            | MissingPrivilege { .. }
            | NoBlockMetadata { .. } => Code::FailedPrecondition,
            NoCapacityOnNode { .. }
            | NoCapacityOnAnyNode { .. }
            | NoCapacityToGrow { .. }
            | NoServedNode { .. }
            | NodeVolumeLimit { .. } => Code::ResourceExhausted,
            OperationPending { .. }
            | CreatingElsewhere { .. }
            | BeingDeleted { .. }
            | DeletedMeanwhile { .. }
            | InvalidStartingToken { .. } => Code::Aborted,
            AttachDisabled | HealthRpcsOff { .. } => Code::Unimplemented,
            Io { .. } | Store(_) | NoLoopDevice { .. } | Task(_) => Code::Internal,
        }
    }
}

/// The longest status message sent: a message names what the request named (ids, names,
/// paths, tokens), and a request may name megabytes; the message travels in a header.
const MAX_MESSAGE: usize = 1024;

/// The only place the driver makes a gRPC status.
impl From<DriverError> for Status {
    fn from(error: DriverError) -> Self {
        Status::new(error.code(), bounded(error.to_string()))
    }
}

/// `message`, cut to [`MAX_MESSAGE`] bytes (at a character boundary) and saying so.
fn bounded(message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &message[..end], message.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_keep_the_code_and_the_message() {
        let status = Status::from(DriverError::PathNotAllowed {
            field: "target_path",
            path: PathBuf::from("/etc"),
            why: "overlaps the driver's state directory".into(),
        });
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "target_path /etc overlaps the driver's state directory"
        );
        let status = Status::from(DriverError::io(
            "reading mounts",
            std::io::Error::other("no /proc"),
        ));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "reading mounts: no /proc");
    }

    #[test]
    fn a_huge_request_is_not_echoed_whole() {
        let id = "é".repeat(1 << 20);
        let status = Status::from(DriverError::not_found("volume", id));
        assert_eq!(status.code(), Code::NotFound);
        assert!(
            status.message().len() < MAX_MESSAGE + 64,
            "{}",
            status.message().len()
        );
        assert!(status.message().starts_with("volume éé"));
        assert!(
            status.message().ends_with("… (2097169 bytes in all)"),
            "{}",
            &status.message()[1000..]
        );
    }
}
