//! Why a sync of a claim or PV failed. The workers log the error and back its key off; the
//! texts are the ones users see in logs and Events, so they stay as upstream words them.

use csi_sidecar::api_errors::GoApiError;
use csi_sidecar::finalizers::FinalizerError;

use crate::claims::ClaimError;
use crate::request::RequestError;

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Already published as a warning Event with `reason` (`ProvisioningFailed`,
    /// `VolumeFailedDelete`, `ProvisioningCleanupFailed`) and `message` on the object.
    #[error("{message}")]
    Reported {
        reason: &'static str,
        message: String,
    },
    #[error(transparent)]
    Finalizers(#[from] FinalizerError),
    /// An API request other than a finalizer patch; `what` names it.
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
    /// No name for the claim's volume; with `--volume-name-uuid-length` too long for claim
    /// UIDs, the provisioner stops.
    #[error(transparent)]
    VolumeName(RequestError),
    #[error("building the PV: {0}")]
    BuildPv(#[source] serde_json::Error),
    /// The claim's class cannot be written into the provisioning-protection record.
    #[error("recording the class: {0}")]
    ClassRecord(#[source] serde_json::Error),
    #[error("claim {0} is gone")]
    ClaimGone(String),
    /// The in-flight record could not take the claim: nothing is created until it can.
    #[error(transparent)]
    Record(crate::controller::RecordWriteError),
    /// A provisioning in flight whose claim is gone cannot be finished now.
    #[error("finishing the provisioning in flight of claim {uid}: {step}")]
    InFlight { uid: String, step: String },
    /// The claim's class is not cached; or its size, for a node's capacity check.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// A node's capacity check: its GetCapacity request, or the call.
    #[error(transparent)]
    Capacity(#[from] crate::capacity::CapacityError),
}

/// Why a snapshot cannot be restored from; the message of the claim's `ProvisioningFailed`
/// Event, wrapped as upstream wraps every error of reading a data source.
#[derive(Debug, thiserror::Error)]
#[error("error getting handle for DataSource Type VolumeSnapshot by Name {snapshot}: {cause}")]
pub struct SnapshotSourceError {
    pub snapshot: String,
    pub cause: SnapshotSourceCause,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotSourceCause {
    #[error(
        "error getting snapshot {name} from api server: {}",
        GoApiError(source)
    )]
    GetSnapshot { name: String, source: kube::Error },
    /// Upstream's Event names no cause (it logs it; so does the controller, from `Debug`).
    #[error("error getting snapshotcontent {content} for snapshot {snapshot}")]
    GetContent {
        content: String,
        snapshot: String,
        source: kube::Error,
    },
    /// Unbound, not ready, another driver's, or a refused volume mode conversion.
    #[error(transparent)]
    Invalid(#[from] ClaimError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts the errors had as strings: log lines, tests and users' alerts match them.
    #[test]
    fn texts_are_unchanged() {
        let api_error = || {
            kube::Error::Api(
                kube::core::Status::failure("boom", "InternalError")
                    .with_code(500)
                    .boxed(),
            )
        };
        let json_error = || serde_json::from_str::<u8>("x").unwrap_err();
        let table = [
            (
                SyncError::Reported {
                    reason: "ProvisioningFailed",
                    message: "the message".into(),
                }
                .to_string(),
                "the message".to_string(),
            ),
            (
                SyncError::Api {
                    what: "deleting PV pv-1".into(),
                    source: api_error(),
                }
                .to_string(),
                format!("deleting PV pv-1: {}", api_error()),
            ),
            (
                SyncError::BuildPv(json_error()).to_string(),
                format!("building the PV: {}", json_error()),
            ),
            (
                SyncError::ClassRecord(json_error()).to_string(),
                format!("recording the class: {}", json_error()),
            ),
            (
                SyncError::ClaimGone("data".into()).to_string(),
                "claim data is gone".into(),
            ),
            (
                SyncError::Capacity(crate::capacity::CapacityError::GetCapacity(
                    tonic::Status::unavailable("no pool"),
                ))
                .to_string(),
                "GetCapacity: rpc error: code = Unavailable desc = no pool".into(),
            ),
            (
                SyncError::VolumeName(RequestError::MissingUid).to_string(),
                RequestError::MissingUid.to_string(),
            ),
            (
                SnapshotSourceError {
                    snapshot: "snap".into(),
                    cause: SnapshotSourceCause::GetSnapshot {
                        name: "snap".into(),
                        source: kube::Error::Api(
                            kube::core::Status::failure(
                                r#"volumesnapshots.snapshot.storage.k8s.io "snap" not found"#,
                                "NotFound",
                            )
                            .with_code(404)
                            .boxed(),
                        ),
                    },
                }
                .to_string(),
                r#"error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting snapshot snap from api server: volumesnapshots.snapshot.storage.k8s.io "snap" not found"#.into(),
            ),
            (
                SnapshotSourceCause::GetContent {
                    content: "content".into(),
                    snapshot: "snap".into(),
                    source: api_error(),
                }
                .to_string(),
                "error getting snapshotcontent content for snapshot snap".into(),
            ),
        ];
        for (text, expected) in table {
            assert_eq!(text, expected);
        }
    }
}
