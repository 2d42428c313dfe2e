use std::collections::BTreeMap;

use csi_kinds::snapshot::{
    IS_DEFAULT_CLASS, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotSpec,
    VolumeSnapshotStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

const DRIVER: &str = "hostpath.csi.k8s.io";

fn allocated(token: &str, namespace: &str, name: &str) -> api::GetMetadataAllocatedRequest {
    api::GetMetadataAllocatedRequest {
        security_token: token.to_owned(),
        namespace: namespace.to_owned(),
        snapshot_name: name.to_owned(),
        starting_offset: 4096,
        max_results: 10,
    }
}

fn delta(token: &str, namespace: &str, base: &str, target: &str) -> api::GetMetadataDeltaRequest {
    api::GetMetadataDeltaRequest {
        security_token: token.to_owned(),
        namespace: namespace.to_owned(),
        base_snapshot_id: base.to_owned(),
        target_snapshot_name: target.to_owned(),
        starting_offset: 0,
        max_results: 0,
    }
}

fn refused(result: Result<impl std::fmt::Debug, Status>) -> (Code, String) {
    let status = result.unwrap_err();
    (status.code(), status.message().to_owned())
}

#[test]
fn allocated_requests_are_validated_in_upstreams_order() {
    let table = [
        (allocated("", "", ""), messages::SECURITY_TOKEN_MISSING),
        (allocated("t", "", ""), messages::NAMESPACE_MISSING),
        (allocated("t", "ns", ""), messages::SNAPSHOT_NAME_MISSING),
    ];
    for (request, message) in table {
        assert_eq!(
            refused(validate_allocated(&request)),
            (Code::InvalidArgument, message.to_owned())
        );
    }
    let plan = validate_allocated(&allocated("t", "ns", "snap")).unwrap();
    assert_eq!(
        plan,
        Plan {
            namespace: "ns".into(),
            snapshot_name: "snap".into(),
            base_snapshot_id: None,
            starting_offset: 4096,
            max_results: 10,
        }
    );
}

#[test]
fn delta_requests_are_validated_in_upstreams_order() {
    let table = [
        (delta("", "", "", ""), messages::SECURITY_TOKEN_MISSING),
        (delta("t", "", "", ""), messages::NAMESPACE_MISSING),
        (delta("t", "ns", "", ""), messages::BASE_SNAPSHOT_ID_MISSING),
        (
            delta("t", "ns", "h", ""),
            messages::TARGET_SNAPSHOT_NAME_MISSING,
        ),
    ];
    for (request, message) in table {
        assert_eq!(
            refused(validate_delta(&request)),
            (Code::InvalidArgument, message.to_owned())
        );
    }
    let plan = validate_delta(&delta("t", "ns", "handle-1", "snap-2")).unwrap();
    assert_eq!(plan.base_snapshot_id.as_deref(), Some("handle-1"));
    assert_eq!(plan.snapshot_name, "snap-2");
}

fn review(authenticated: Option<bool>, audiences: Option<&[&str]>) -> TokenReviewStatus {
    TokenReviewStatus {
        authenticated,
        audiences: audiences.map(|a| a.iter().map(|s| (*s).to_owned()).collect()),
        user: Some(UserInfo {
            username: Some("system:serviceaccount:backup:app".into()),
            ..UserInfo::default()
        }),
        ..TokenReviewStatus::default()
    }
}

#[test]
fn a_token_authenticates_only_for_the_audience() {
    let table: [(Option<TokenReviewStatus>, bool); 6] = [
        (None, false),
        (Some(review(Some(false), Some(&["aud"]))), false),
        (Some(review(None, Some(&["aud"]))), false),
        (Some(review(Some(true), None)), false),
        (Some(review(Some(true), Some(&["other"]))), false),
        (Some(review(Some(true), Some(&["other", "aud"]))), true),
    ];
    for (status, expected) in table {
        let user = authenticated_user(status.as_ref(), "aud");
        assert_eq!(user.is_some(), expected, "{status:?}");
    }
    let user = authenticated_user(Some(&review(Some(true), Some(&["aud"]))), "aud").unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:backup:app")
    );
}

#[test]
fn the_access_review_asks_get_volumesnapshots_for_the_whole_user() {
    let user = UserInfo {
        username: Some("alice".into()),
        uid: Some("u-1".into()),
        groups: Some(vec!["backup".into()]),
        extra: Some(BTreeMap::from([("scopes".into(), vec!["a".into()])])),
    };
    let spec = access_review(&user, "ns");
    let attributes = spec.resource_attributes.clone().unwrap();
    assert_eq!(attributes.verb.as_deref(), Some("get"));
    assert_eq!(attributes.namespace.as_deref(), Some("ns"));
    assert_eq!(attributes.group.as_deref(), Some("snapshot.storage.k8s.io"));
    assert_eq!(attributes.version.as_deref(), Some("v1"));
    assert_eq!(attributes.resource.as_deref(), Some("volumesnapshots"));
    assert_eq!(spec.user, user.username);
    assert_eq!(spec.uid, user.uid);
    assert_eq!(spec.groups, user.groups);
    assert_eq!(spec.extra, user.extra);
}

#[test]
fn authorization_needs_allowed_and_not_denied() {
    let status = |allowed, denied, reason: &str| SubjectAccessReviewStatus {
        allowed,
        denied,
        reason: Some(reason.to_owned()),
        ..SubjectAccessReviewStatus::default()
    };
    assert!(authorization(Some(&status(true, None, ""))).is_ok());
    assert!(authorization(Some(&status(true, Some(false), ""))).is_ok());
    for (review, reason) in [
        (Some(status(false, None, "no RBAC")), "no RBAC"),
        (
            Some(status(true, Some(true), "webhook said no")),
            "webhook said no",
        ),
        (None, ""),
    ] {
        assert_eq!(
            refused(authorization(review.as_ref())),
            (
                Code::PermissionDenied,
                format!("user does not have permissions to perform the operation: {reason}")
            )
        );
    }
}

fn snapshot(ready: Option<bool>, content: Option<&str>, class: Option<&str>) -> VolumeSnapshot {
    let mut snapshot = VolumeSnapshot::new(
        "snap",
        VolumeSnapshotSpec {
            volume_snapshot_class_name: class.map(str::to_owned),
            ..VolumeSnapshotSpec::default()
        },
    );
    snapshot.metadata.namespace = Some("ns".into());
    snapshot.status = Some(VolumeSnapshotStatus {
        ready_to_use: ready,
        bound_volume_snapshot_content_name: content.map(str::to_owned),
        ..VolumeSnapshotStatus::default()
    });
    snapshot
}

#[test]
fn a_snapshot_must_be_ready_and_bound() {
    let not_ready = "the VolumeSnapshot is not yet ready, name: snap";
    let unbound = "boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: snap";
    let mut no_status = snapshot(None, None, None);
    no_status.status = None;
    let table = [
        (no_status, Err(not_ready)),
        (snapshot(None, Some("c"), None), Err(not_ready)),
        (snapshot(Some(false), Some("c"), None), Err(not_ready)),
        (snapshot(Some(true), None, None), Err(unbound)),
        (
            snapshot(Some(true), Some("content-1"), None),
            Ok("content-1"),
        ),
    ];
    for (object, expected) in table {
        match (bound_content(&object, "snap"), expected) {
            (Ok(content), Ok(name)) => assert_eq!(content, name),
            (Err(status), Err(message)) => {
                assert_eq!(
                    (status.code(), status.message()),
                    (Code::Unavailable, message)
                );
            }
            (got, want) => panic!("{got:?} != {want:?}"),
        }
    }
}

fn content(ready: Option<bool>, handle: Option<&str>, driver: &str) -> VolumeSnapshotContent {
    let mut content = VolumeSnapshotContent::new(
        "content-1",
        VolumeSnapshotContentSpec {
            driver: driver.to_owned(),
            ..VolumeSnapshotContentSpec::default()
        },
    );
    content.status = Some(VolumeSnapshotContentStatus {
        ready_to_use: ready,
        snapshot_handle: handle.map(str::to_owned),
        ..VolumeSnapshotContentStatus::default()
    });
    content
}

#[test]
fn a_content_must_be_ready_with_a_handle_of_our_driver() {
    let not_ready = "the VolumeSnapshotContent is not yet ready, name: content-1";
    let no_handle = "snapshotHandle is not set in VolumeSnapshotContent status, name: content-1";
    for (object, message) in [
        (content(None, Some("h"), DRIVER), not_ready),
        (content(Some(false), Some("h"), DRIVER), not_ready),
        (content(Some(true), None, DRIVER), no_handle),
    ] {
        assert_eq!(
            refused(content_handle(&object, "content-1")),
            (Code::Unavailable, message.to_owned())
        );
    }
    let resolved = content_handle(&content(Some(true), Some("h-1"), DRIVER), "content-1").unwrap();
    assert_eq!(
        resolved,
        Resolved {
            driver: DRIVER.into(),
            snapshot_handle: "h-1".into(),
            content_name: "content-1".into()
        }
    );
    assert!(check_driver(&resolved, "snap", DRIVER).is_ok());
    assert_eq!(
        refused(check_driver(&resolved, "snap", "other.csi.k8s.io")),
        (
            Code::InvalidArgument,
            "VolumeSnapshot 'snap' does not belong to the CSI driver 'other.csi.k8s.io'".into()
        )
    );
}

fn class(
    name: &str,
    driver: &str,
    default: Option<&str>,
    params: &[(&str, &str)],
) -> VolumeSnapshotClass {
    VolumeSnapshotClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: default
                .map(|value| BTreeMap::from([(IS_DEFAULT_CLASS.to_owned(), value.to_owned())])),
            ..ObjectMeta::default()
        },
        driver: driver.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..VolumeSnapshotClass::default()
    }
}

#[test]
fn the_default_class_is_the_one_of_the_driver() {
    assert_eq!(
        class_choice(&snapshot(None, None, Some("gold"))),
        ClassChoice::Named("gold".into())
    );
    assert_eq!(
        class_choice(&snapshot(None, None, None)),
        ClassChoice::DefaultOfDriver
    );

    let classes = [
        class("other-default", "other.csi.k8s.io", Some("true"), &[]),
        class("plain", DRIVER, None, &[]),
        class("false", DRIVER, Some("false"), &[]),
        class("default", DRIVER, Some("true"), &[]),
    ];
    let chosen = default_class(&classes, DRIVER).unwrap();
    assert_eq!(chosen.metadata.name.as_deref(), Some("default"));

    let none = "no default VolumeSnapshotClass is set for the CSI driver 'hostpath.csi.k8s.io'";
    assert_eq!(
        refused(default_class(&classes[..3], DRIVER)),
        (Code::Unavailable, none.to_owned())
    );
    let two = [
        classes[3].clone(),
        class("default-2", DRIVER, Some("true"), &[]),
    ];
    assert_eq!(
        refused(default_class(&two, DRIVER)),
        (
            Code::Unavailable,
            "multiple default VolumeSnapshotClasses are set for the CSI driver 'hostpath.csi.k8s.io'"
                .to_owned()
        )
    );
}

#[test]
fn the_snapshotter_secret_resolves_the_snapshot_templates() {
    let object = snapshot(Some(true), Some("content-1"), None);
    let resolved = Resolved {
        driver: DRIVER.into(),
        snapshot_handle: "h".into(),
        content_name: "content-1".into(),
    };
    let none = class("c", DRIVER, None, &[]);
    assert_eq!(snapshotter_secret(&none, &resolved, &object).unwrap(), None);

    let templated = class(
        "c",
        DRIVER,
        None,
        &[
            (
                "csi.storage.k8s.io/snapshotter-secret-name",
                "${volumesnapshot.name}-${volumesnapshotcontent.name}",
            ),
            (
                "csi.storage.k8s.io/snapshotter-secret-namespace",
                "${volumesnapshot.namespace}",
            ),
        ],
    );
    assert_eq!(
        snapshotter_secret(&templated, &resolved, &object).unwrap(),
        Some(SecretRef {
            name: "snap-content-1".into(),
            namespace: "ns".into()
        })
    );

    let half = class(
        "c",
        DRIVER,
        None,
        &[("csi.storage.k8s.io/snapshotter-secret-name", "s")],
    );
    let (code, message) = refused(snapshotter_secret(&half, &resolved, &object));
    assert_eq!(code, Code::Unavailable);
    assert!(
        message.starts_with("invalid snapshotter secret parameters in VolumeSnapshotClass: "),
        "{message}"
    );
}

#[test]
fn csi_requests_carry_the_handles_offset_and_limit() {
    let resolved = Resolved {
        driver: DRIVER.into(),
        snapshot_handle: "target-handle".into(),
        content_name: "content-1".into(),
    };
    let secrets = HashMap::from([("k".to_owned(), "v".to_owned())]);
    let plan = validate_allocated(&allocated("t", "ns", "snap")).unwrap();
    let request = csi_allocated_request(&plan, &resolved, secrets.clone());
    assert_eq!(request.snapshot_id, "target-handle");
    assert_eq!((request.starting_offset, request.max_results), (4096, 10));
    assert_eq!(request.secrets, secrets);

    let plan = validate_delta(&delta("t", "ns", "base-handle", "snap")).unwrap();
    let request = csi_delta_request(&plan, &resolved, HashMap::new());
    assert_eq!(request.base_snapshot_id, "base-handle");
    assert_eq!(request.target_snapshot_id, "target-handle");
}

#[test]
fn driver_errors_pass_unless_unknown() {
    let passed = pass_or_wrap(Status::out_of_range("past the end"), Code::Internal, "x");
    assert_eq!(
        (passed.code(), passed.message()),
        (Code::OutOfRange, "past the end")
    );
    let wrapped = pass_or_wrap(
        Status::unknown("EOF"),
        Code::Internal,
        messages::FAILED_CSI_DRIVER_RESPONSE,
    );
    assert_eq!(
        (wrapped.code(), wrapped.message()),
        (
            Code::Internal,
            "failed to get response from CSI driver: EOF"
        )
    );
}

#[test]
fn responses_keep_type_capacity_and_ranges() {
    let response = csi::GetMetadataDeltaResponse {
        block_metadata_type: csi::BlockMetadataType::VariableLength as i32,
        volume_capacity_bytes: 1 << 30,
        block_metadata: vec![csi::BlockMetadata {
            byte_offset: 4096,
            size_bytes: 8192,
        }],
    };
    let converted = delta_response(response);
    assert_eq!(
        converted,
        api::GetMetadataDeltaResponse {
            block_metadata_type: api::BlockMetadataType::VariableLength as i32,
            volume_capacity_bytes: 1 << 30,
            block_metadata: vec![api::BlockMetadata {
                byte_offset: 4096,
                size_bytes: 8192
            }],
        }
    );
}
