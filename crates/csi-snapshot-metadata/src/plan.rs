//! The pure core of a SnapshotMetadata request, step by step as upstream takes it: validate
//! the request, read the TokenReview and SubjectAccessReview answers, resolve the
//! VolumeSnapshot and its content to a CSI snapshot handle, pick the VolumeSnapshotClass whose
//! snapshotter secret the driver gets, and build the CSI request. Every refusal is upstream's
//! status code and message (pkg/internal/server/grpc/status.go); nothing here does I/O.

use std::collections::HashMap;

use csi_kinds::secrets::SecretRef;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_kinds::snapshot_secrets::{SNAPSHOTTER, secret_reference};
use csi_proto::csi::v1 as csi;
use csi_proto::snapshotmetadata as api;
use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use tonic::{Code, Status};

/// Upstream's messages.
pub mod messages {
    pub const SECURITY_TOKEN_MISSING: &str = "securityToken is missing";
    pub const NAMESPACE_MISSING: &str = "namespace parameter cannot be empty";
    pub const SNAPSHOT_NAME_MISSING: &str = "snapshotName cannot be empty";
    pub const BASE_SNAPSHOT_ID_MISSING: &str = "baseSnapshotId cannot be empty";
    pub const TARGET_SNAPSHOT_NAME_MISSING: &str = "targetSnapshotName cannot be empty";
    pub const UNAUTHENTICATED: &str = "unauthenticated user";
    pub const FAILED_TO_AUTHENTICATE: &str = "failed to authenticate user";
    pub const FAILED_TO_AUTHORIZE: &str = "failed to authorize the user";
    pub const PERMISSION_DENIED: &str = "user does not have permissions to perform the operation";
    pub const FAILED_TO_FIND_CR: &str = "failed to find the SnapshotMetadataService CR for driver";
    pub const DRIVER_NOT_READY: &str = "the CSI driver is not yet ready";
    pub const FAILED_CSI_DRIVER_RESPONSE: &str = "failed to get response from CSI driver";
    pub const FAILED_TO_SEND_RESPONSE: &str = "failed to send response";
    pub const FAILED_TO_GET_CREDENTIALS: &str = "failed to get credentials";
}

/// What a request asks, once valid: the snapshot to resolve and what the CSI request carries
/// besides its handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub namespace: String,
    /// The VolumeSnapshot resolved to the CSI snapshot (the target of a delta).
    pub snapshot_name: String,
    /// A delta's base: a CSI handle, passed to the driver unchecked.
    pub base_snapshot_id: Option<String>,
    pub starting_offset: i64,
    pub max_results: i32,
}

fn invalid(message: &str) -> Status {
    Status::invalid_argument(message)
}

/// Upstream's `validateGetMetadataAllocatedRequest`, in its order.
pub fn validate_allocated(request: &api::GetMetadataAllocatedRequest) -> Result<Plan, Status> {
    if request.security_token.is_empty() {
        return Err(invalid(messages::SECURITY_TOKEN_MISSING));
    }
    if request.namespace.is_empty() {
        return Err(invalid(messages::NAMESPACE_MISSING));
    }
    if request.snapshot_name.is_empty() {
        return Err(invalid(messages::SNAPSHOT_NAME_MISSING));
    }
    Ok(Plan {
        namespace: request.namespace.clone(),
        snapshot_name: request.snapshot_name.clone(),
        base_snapshot_id: None,
        starting_offset: request.starting_offset,
        max_results: request.max_results,
    })
}

/// Upstream's `validateGetMetadataDeltaRequest`, in its order.
pub fn validate_delta(request: &api::GetMetadataDeltaRequest) -> Result<Plan, Status> {
    if request.security_token.is_empty() {
        return Err(invalid(messages::SECURITY_TOKEN_MISSING));
    }
    if request.namespace.is_empty() {
        return Err(invalid(messages::NAMESPACE_MISSING));
    }
    if request.base_snapshot_id.is_empty() {
        return Err(invalid(messages::BASE_SNAPSHOT_ID_MISSING));
    }
    if request.target_snapshot_name.is_empty() {
        return Err(invalid(messages::TARGET_SNAPSHOT_NAME_MISSING));
    }
    Ok(Plan {
        namespace: request.namespace.clone(),
        snapshot_name: request.target_snapshot_name.clone(),
        base_snapshot_id: Some(request.base_snapshot_id.clone()),
        starting_offset: request.starting_offset,
        max_results: request.max_results,
    })
}

/// The user a TokenReview answer authenticates for `audience` (upstream `Authenticate`):
/// authenticated, and `audience` among the answer's audiences. `None`: unauthenticated.
pub fn authenticated_user(status: Option<&TokenReviewStatus>, audience: &str) -> Option<UserInfo> {
    let status = status?;
    if status.authenticated != Some(true) {
        return None;
    }
    let audiences = status.audiences.as_deref().unwrap_or_default();
    audiences
        .iter()
        .any(|a| a == audience)
        .then(|| status.user.clone().unwrap_or_default())
}

/// The SubjectAccessReview asking whether `user` may get VolumeSnapshots in `namespace`.
pub fn access_review(user: &UserInfo, namespace: &str) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        resource_attributes: Some(ResourceAttributes {
            verb: Some("get".to_owned()),
            namespace: Some(namespace.to_owned()),
            group: Some(csi_kinds::snapshot::GROUP.to_owned()),
            version: Some("v1".to_owned()),
            resource: Some("volumesnapshots".to_owned()),
            ..ResourceAttributes::default()
        }),
        user: user.username.clone(),
        groups: user.groups.clone(),
        uid: user.uid.clone(),
        extra: user.extra.clone(),
        ..SubjectAccessReviewSpec::default()
    }
}

/// Upstream's decision from a SubjectAccessReview answer: allowed and not denied.
pub fn authorization(status: Option<&SubjectAccessReviewStatus>) -> Result<(), Status> {
    let (allowed, denied, reason) = status.map_or((false, false, ""), |s| {
        (
            s.allowed,
            s.denied == Some(true),
            s.reason.as_deref().unwrap_or_default(),
        )
    });
    if allowed && !denied {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "{}: {reason}",
            messages::PERMISSION_DENIED
        )))
    }
}

/// The content a VolumeSnapshot is bound to, once it is ready (upstream `getVolumeSnapshot`).
pub fn bound_content(snapshot: &VolumeSnapshot, name: &str) -> Result<String, Status> {
    let status = snapshot.status.as_ref();
    if status.and_then(|s| s.ready_to_use) != Some(true) {
        return Err(Status::unavailable(format!(
            "the VolumeSnapshot is not yet ready, name: {name}"
        )));
    }
    status
        .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        .ok_or_else(|| {
            Status::unavailable(format!(
                "boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: {name}"
            ))
        })
}

/// A resolved snapshot: what the CSI request and the secret lookup need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub driver: String,
    pub snapshot_handle: String,
    pub content_name: String,
}

/// The snapshot handle of a ready content (upstream `getVolumeSnapshotContent`).
pub fn content_handle(content: &VolumeSnapshotContent, name: &str) -> Result<Resolved, Status> {
    let status = content.status.as_ref();
    if status.and_then(|s| s.ready_to_use) != Some(true) {
        return Err(Status::unavailable(format!(
            "the VolumeSnapshotContent is not yet ready, name: {name}"
        )));
    }
    let snapshot_handle = status
        .and_then(|s| s.snapshot_handle.clone())
        .ok_or_else(|| {
            Status::unavailable(format!(
                "snapshotHandle is not set in VolumeSnapshotContent status, name: {name}"
            ))
        })?;
    Ok(Resolved {
        driver: content.spec.driver.clone(),
        snapshot_handle,
        content_name: name.to_owned(),
    })
}

/// A snapshot of another driver is refused (its handle means nothing to ours).
pub fn check_driver(resolved: &Resolved, snapshot_name: &str, driver: &str) -> Result<(), Status> {
    if resolved.driver == driver {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "VolumeSnapshot '{snapshot_name}' does not belong to the CSI driver '{driver}'"
        )))
    }
}

/// The class whose snapshotter secret applies: the snapshot's own class, or else the driver's
/// default class among `classes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassChoice {
    Named(String),
    DefaultOfDriver,
}

pub fn class_choice(snapshot: &VolumeSnapshot) -> ClassChoice {
    snapshot
        .spec
        .volume_snapshot_class_name
        .clone()
        .map_or(ClassChoice::DefaultOfDriver, ClassChoice::Named)
}

/// The driver's default class (upstream `getDefaultVolumeSnapshotClassForDriver`): exactly one
/// class of `driver` annotated as default.
pub fn default_class<'a>(
    classes: &'a [VolumeSnapshotClass],
    driver: &str,
) -> Result<&'a VolumeSnapshotClass, Status> {
    let mut defaults = classes
        .iter()
        .filter(|class| class.driver == driver && class.is_default());
    match (defaults.next(), defaults.next()) {
        (Some(class), None) => Ok(class),
        (Some(_), Some(_)) => Err(Status::unavailable(format!(
            "multiple default VolumeSnapshotClasses are set for the CSI driver '{driver}'"
        ))),
        (None, _) => Err(Status::unavailable(format!(
            "no default VolumeSnapshotClass is set for the CSI driver '{driver}'"
        ))),
    }
}

/// The snapshotter secret `class` names for this snapshot and content, as the snapshotter
/// resolves it; `None` when it names none.
pub fn snapshotter_secret(
    class: &VolumeSnapshotClass,
    resolved: &Resolved,
    snapshot: &VolumeSnapshot,
) -> Result<Option<SecretRef>, Status> {
    let namespace = snapshot.metadata.namespace.as_deref().unwrap_or_default();
    let name = snapshot.metadata.name.as_deref().unwrap_or_default();
    secret_reference(
        SNAPSHOTTER,
        &class.parameters(),
        &resolved.content_name,
        Some((namespace, name)),
    )
    .map_err(|error| {
        Status::unavailable(format!(
            "invalid snapshotter secret parameters in VolumeSnapshotClass: {error}"
        ))
    })
}

/// The driver's GetMetadataAllocated request.
pub fn csi_allocated_request(
    plan: &Plan,
    resolved: &Resolved,
    secrets: HashMap<String, String>,
) -> csi::GetMetadataAllocatedRequest {
    csi::GetMetadataAllocatedRequest {
        snapshot_id: resolved.snapshot_handle.clone(),
        starting_offset: plan.starting_offset,
        max_results: plan.max_results,
        secrets,
    }
}

/// The driver's GetMetadataDelta request: the base handle as the client gave it.
pub fn csi_delta_request(
    plan: &Plan,
    resolved: &Resolved,
    secrets: HashMap<String, String>,
) -> csi::GetMetadataDeltaRequest {
    csi::GetMetadataDeltaRequest {
        base_snapshot_id: plan.base_snapshot_id.clone().unwrap_or_default(),
        target_snapshot_id: resolved.snapshot_handle.clone(),
        starting_offset: plan.starting_offset,
        max_results: plan.max_results,
        secrets,
    }
}

/// Upstream's `statusPassOrWrapError`: a status with a code other than Unknown passes as it
/// is; an Unknown one (a plain error in Go) becomes `code` with `message: <error>`.
pub fn pass_or_wrap(status: Status, code: Code, message: &str) -> Status {
    if status.code() == Code::Unknown {
        Status::new(code, format!("{message}: {}", status.message()))
    } else {
        status
    }
}

/// The ranges of a CSI response as the Kubernetes API's.
fn block_metadata(ranges: Vec<csi::BlockMetadata>) -> Vec<api::BlockMetadata> {
    ranges
        .into_iter()
        .map(|range| api::BlockMetadata {
            byte_offset: range.byte_offset,
            size_bytes: range.size_bytes,
        })
        .collect()
}

pub fn allocated_response(
    response: csi::GetMetadataAllocatedResponse,
) -> api::GetMetadataAllocatedResponse {
    api::GetMetadataAllocatedResponse {
        block_metadata_type: response.block_metadata_type,
        volume_capacity_bytes: response.volume_capacity_bytes,
        block_metadata: block_metadata(response.block_metadata),
    }
}

pub fn delta_response(response: csi::GetMetadataDeltaResponse) -> api::GetMetadataDeltaResponse {
    api::GetMetadataDeltaResponse {
        block_metadata_type: response.block_metadata_type,
        volume_capacity_bytes: response.volume_capacity_bytes,
        block_metadata: block_metadata(response.block_metadata),
    }
}

#[cfg(test)]
mod tests;
