use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;
use csi_grpc::conn::PluginCapabilities;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;

const DRIVER: &str = "hostpath.csi-suite.io";
const GI: i64 = 1 << 30;
const CONTROLLER: Resizer = Resizer::Controller {
    single_node_multi_writer: false,
};

/// A Bound claim of 1Gi asking for 2Gi, with `extra` merged in (RFC 7386: null removes).
fn pvc(extra: Value) -> PersistentVolumeClaim {
    let mut value = json!({
        "metadata": {"name": "data", "namespace": "apps", "uid": "uid-1", "resourceVersion": "7"},
        "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "2Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

/// Our 1Gi PV bound to that claim, with `extra` merged in.
fn pv(extra: Value) -> PersistentVolume {
    let mut value = json!({
        "metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "claimRef": {"name": "data", "namespace": "apps", "uid": "uid-1"},
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

fn expand(bytes: i64, update_status: bool) -> Plan {
    Plan::Expand(Expansion {
        bytes,
        update_status,
    })
}

fn status(resize: &str, allocated: &str) -> Value {
    json!({"status": {"allocatedResourceStatuses": {"storage": resize},
        "allocatedResources": {"storage": allocated}}})
}

fn at() -> Time {
    Time("2026-01-01T00:00:00Z".parse::<Timestamp>().unwrap())
}

#[test]
fn resizer_follows_the_capabilities() {
    let mut driver = DriverInfo {
        plugin: PluginCapabilities {
            controller_service: true,
            ..PluginCapabilities::default()
        },
        ..DriverInfo::default()
    };
    assert_eq!(Resizer::of(&driver), Err(SupportError::NoExpansion));
    driver.node.insert(NodeCapability::ExpandVolume);
    assert_eq!(Resizer::of(&driver), Ok(Resizer::NodeOnly), "trivial");
    driver.controller.extend([
        ControllerCapability::ExpandVolume,
        ControllerCapability::SingleNodeMultiWriter,
    ]);
    assert_eq!(
        Resizer::of(&driver),
        Ok(Resizer::Controller {
            single_node_multi_writer: true
        })
    );
    driver.plugin.controller_service = false;
    assert_eq!(Resizer::of(&driver), Err(SupportError::NoControllerService));
}

#[test]
fn claims_that_are_not_ours_or_ask_for_nothing_are_left_alone() {
    let cases: Vec<(&str, PersistentVolumeClaim, PersistentVolume)> = vec![
        (
            "request met",
            pvc(json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}})),
            pv(json!({})),
        ),
        (
            "request below capacity",
            pvc(json!({"spec": {"resources": {"requests": {"storage": "512Mi"}}}})),
            pv(json!({})),
        ),
        (
            "not bound",
            pvc(json!({"status": {"phase": "Pending"}})),
            pv(json!({})),
        ),
        (
            "no volume",
            pvc(json!({"spec": {"volumeName": ""}})),
            pv(json!({})),
        ),
        (
            "another driver",
            pvc(json!({})),
            pv(json!({"spec": {"csi": {"driver": "other.csi.io"}}})),
        ),
        (
            "in-tree volume",
            pvc(
                json!({"metadata": {"annotations": {"volume.kubernetes.io/storage-resizer": DRIVER}}}),
            ),
            pv(json!({"spec": {"csi": null, "hostPath": {"path": "/data"}}})),
        ),
        (
            "PV bound to another claim",
            pvc(json!({})),
            pv(json!({"spec": {"claimRef": {"uid": "uid-2"}}})),
        ),
    ];
    for (what, claim, volume) in cases {
        assert_eq!(
            plan_legacy(&claim, &volume, DRIVER),
            Plan::Nothing,
            "legacy: {what}"
        );
        assert_eq!(
            plan_recovering(&claim, &volume, DRIVER, CONTROLLER, Memory::default()),
            Plan::Nothing,
            "recovering: {what}"
        );
    }
}

#[test]
fn legacy_plans() {
    let pending =
        json!({"status": {"conditions": [{"type": "FileSystemResizePending", "status": "True"}]}});
    let cases = [
        (
            "PV smaller than the request",
            pvc(json!({})),
            pv(json!({})),
            expand(2 * GI, true),
        ),
        (
            "PV expanded, claim not finished: ask the driver again",
            pvc(json!({})),
            pv(json!({"spec": {"capacity": {"storage": "2Gi"}}})),
            expand(2 * GI, true),
        ),
        (
            "PV expanded, kubelet's turn",
            pvc(pending),
            pv(json!({"spec": {"capacity": {"storage": "2Gi"}}})),
            Plan::Nothing,
        ),
    ];
    for (what, claim, volume, expected) in cases {
        assert_eq!(plan_legacy(&claim, &volume, DRIVER), expected, "{what}");
    }
}

#[test]
fn recovering_plans() {
    use resize_status::*;
    let big = json!({"spec": {"capacity": {"storage": "2Gi"}}});
    let pending =
        json!({"status": {"conditions": [{"type": "FileSystemResizePending", "status": "True"}]}});
    let final_error = Memory {
        final_error: true,
        ..Memory::default()
    };
    let waiting = Memory {
        infeasible_wait: Some(Duration::from_secs(30)),
        ..Memory::default()
    };
    let node_only = Resizer::NodeOnly;
    let cases: Vec<(&str, Value, Value, Resizer, Memory, Plan)> = vec![
        (
            "a new request",
            json!({}),
            json!({}),
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, true),
        ),
        // The PV is smaller than the request.
        (
            "node pending at a size the PV has",
            status(NODE_RESIZE_PENDING, "1Gi"),
            json!({}),
            CONTROLLER,
            Memory::default(),
            Plan::Nothing,
        ),
        (
            "node in progress at a larger size",
            status(NODE_RESIZE_IN_PROGRESS, "3Gi"),
            json!({}),
            CONTROLLER,
            Memory::default(),
            expand(3 * GI, false),
        ),
        (
            "node infeasible: the allocated size",
            status(NODE_RESIZE_INFEASIBLE, "3Gi"),
            json!({}),
            CONTROLLER,
            Memory::default(),
            expand(3 * GI, false),
        ),
        (
            "controller in progress: the size in flight",
            status(CONTROLLER_RESIZE_IN_PROGRESS, "3Gi"),
            json!({}),
            CONTROLLER,
            Memory::default(),
            expand(3 * GI, false),
        ),
        (
            "controller in progress after a final error: the (lowered) request",
            status(CONTROLLER_RESIZE_IN_PROGRESS, "3Gi"),
            json!({}),
            CONTROLLER,
            final_error,
            expand(2 * GI, true),
        ),
        (
            "controller infeasible, request lowered",
            status(CONTROLLER_RESIZE_INFEASIBLE, "3Gi"),
            json!({}),
            CONTROLLER,
            waiting,
            expand(2 * GI, true),
        ),
        (
            "controller infeasible, same request: later",
            status(CONTROLLER_RESIZE_INFEASIBLE, "2Gi"),
            json!({}),
            CONTROLLER,
            waiting,
            Plan::RetryLater(Duration::from_secs(30)),
        ),
        (
            "controller infeasible, same request, wait over",
            status(CONTROLLER_RESIZE_INFEASIBLE, "2Gi"),
            json!({}),
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, false),
        ),
        // The PV has the size already.
        (
            "kubelet's turn",
            status(NODE_RESIZE_PENDING, "2Gi"),
            big.clone(),
            CONTROLLER,
            Memory::default(),
            Plan::Nothing,
        ),
        (
            "node infeasible, controller driver: reset to the allocated size",
            status(NODE_RESIZE_INFEASIBLE, "2Gi"),
            big.clone(),
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, false),
        ),
        (
            "node infeasible, node-only driver: the request",
            status(NODE_RESIZE_INFEASIBLE, "3Gi"),
            big.clone(),
            node_only,
            Memory::default(),
            expand(2 * GI, true),
        ),
        (
            "our record was not written",
            status(CONTROLLER_RESIZE_IN_PROGRESS, "2Gi"),
            big.clone(),
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, false),
        ),
        (
            "allocated without a status",
            json!({"status": {"allocatedResources": {"storage": "2Gi"}}}),
            big.clone(),
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, false),
        ),
        (
            "old server, kubelet's turn",
            pending,
            big.clone(),
            CONTROLLER,
            Memory::default(),
            Plan::Nothing,
        ),
        (
            "old server, claim not finished",
            json!({}),
            big,
            CONTROLLER,
            Memory::default(),
            expand(2 * GI, true),
        ),
    ];
    for (what, claim, volume, resizer, memory, expected) in cases {
        assert_eq!(
            plan_recovering(&pvc(claim), &pv(volume), DRIVER, resizer, memory),
            expected,
            "{what}"
        );
    }
}

#[test]
fn the_pre_resize_annotation_goes_once_the_node_caught_up() {
    let annotated = json!({"metadata": {"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: "1Gi"}},
        "spec": {"capacity": {"storage": "2Gi"}}});
    assert!(!pre_resize_annotation_done(
        &pvc(json!({})),
        &pv(annotated.clone())
    ));
    let caught_up = pvc(json!({"status": {"capacity": {"storage": "2Gi"}}}));
    assert!(pre_resize_annotation_done(&caught_up, &pv(annotated)));
    assert!(
        !pre_resize_annotation_done(&caught_up, &pv(json!({}))),
        "none to remove"
    );
}

#[test]
fn expand_requests_carry_the_capability_and_the_size() {
    let request = expand_request(
        &pv(json!({"spec": {"mountOptions": ["noatime"], "csi": {"fsType": "xfs"}}})),
        2 * GI,
        false,
        HashMap::from([("key".to_string(), "value".to_string())]),
    )
    .unwrap();
    assert_eq!(request.volume_id, "vol-1");
    assert_eq!(request.capacity_range.unwrap().required_bytes, 2 * GI);
    assert_eq!(request.secrets.len(), 1);
    let capability = request.volume_capability.unwrap();
    assert_eq!(
        capability.access_mode.unwrap().mode,
        Mode::SingleNodeWriter as i32
    );
    match capability.access_type {
        Some(AccessType::Mount(mount)) => {
            assert_eq!(
                (mount.fs_type.as_str(), mount.mount_flags),
                ("xfs", vec!["noatime".to_string()])
            );
        }
        other => panic!("not a mount: {other:?}"),
    }
    let block = expand_request(
        &pv(json!({"spec": {"volumeMode": "Block"}})),
        GI,
        false,
        HashMap::new(),
    )
    .unwrap();
    assert!(matches!(
        block.volume_capability.unwrap().access_type,
        Some(AccessType::Block(_))
    ));
    assert_eq!(
        expand_request(
            &pv(json!({"spec": {"csi": {"volumeHandle": ""}}})),
            GI,
            false,
            HashMap::new()
        ),
        Err(RequestError::EmptyVolumeHandle)
    );
}

#[test]
fn the_expand_secret_is_the_pvs() {
    assert_eq!(expand_secret(&pv(json!({}))), None);
    let pv = pv(
        json!({"spec": {"csi": {"controllerExpandSecretRef": {"name": "expand", "namespace": "apps"}}}}),
    );
    assert_eq!(
        expand_secret(&pv),
        Some(SecretRef {
            name: "expand".to_string(),
            namespace: "apps".to_string()
        })
    );
}

#[test]
fn the_expanded_size_is_the_drivers_answer() {
    assert_eq!(expanded_size(3 * GI, 2 * GI), 3 * GI);
    assert_eq!(expanded_size(0, 2 * GI), 2 * GI, "an answer without a size");
}

#[test]
fn failures_are_classified_as_upstream() {
    let of = |code| FailureKind::of(Some(code));
    assert!(
        !FailureKind::of(None).final_error,
        "no gRPC status: not final"
    );
    for code in [
        Code::DeadlineExceeded,
        Code::Unavailable,
        Code::Aborted,
        Code::Cancelled,
        Code::ResourceExhausted,
    ] {
        assert!(!of(code).final_error, "{code:?}");
    }
    for code in [Code::InvalidArgument, Code::OutOfRange, Code::NotFound] {
        assert!(of(code).final_error && of(code).infeasible, "{code:?}");
    }
    let in_use = of(Code::FailedPrecondition);
    assert!(in_use.in_use && in_use.final_error && !in_use.infeasible);
    assert!(of(Code::Internal).final_error && !of(Code::Internal).infeasible);
}

fn condition(kind: &str) -> PersistentVolumeClaimCondition {
    new_condition(kind, None, &at())
}

#[test]
fn resize_conditions_are_merged_as_upstream() {
    let other = condition("ModifyVolumeError");
    let old = vec![
        other.clone(),
        condition(condition::RESIZING),
        condition(condition::CONTROLLER_RESIZE_ERROR),
    ];
    let pending = condition(condition::FILE_SYSTEM_RESIZE_PENDING);
    let kinds = |conditions: Vec<PersistentVolumeClaimCondition>| {
        conditions.into_iter().map(|c| c.type_).collect::<Vec<_>>()
    };
    assert_eq!(
        kinds(merge_resize_conditions(&old, vec![pending.clone()], false)),
        ["ModifyVolumeError", "FileSystemResizePending"]
    );
    assert_eq!(
        kinds(merge_resize_conditions(&old, vec![pending], true)),
        [
            "ModifyVolumeError",
            "Resizing",
            "ControllerResizeError",
            "FileSystemResizePending"
        ]
    );
    assert_eq!(
        kinds(merge_resize_conditions(
            &old,
            vec![condition(condition::RESIZING)],
            false
        )),
        ["ModifyVolumeError", "Resizing"]
    );
    assert_eq!(
        kinds(merge_resize_conditions(&old, Vec::new(), false)),
        ["ModifyVolumeError"]
    );
}

#[test]
fn status_patches() {
    let annotated =
        pvc(json!({"metadata": {"annotations": {NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: "true"}}}));
    let resizing = json!([{"type": "Resizing", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
    let expansion = Expansion {
        bytes: 2 * GI,
        update_status: true,
    };
    assert_eq!(
        in_progress_patch(&annotated, Path::Recovering, expansion, &at()),
        json!({
            "metadata": {"resourceVersion": "7", "annotations": {NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: null}},
            "status": {"conditions": resizing, "allocatedResources": {"storage": "2Gi"},
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"}}
        })
    );
    assert_eq!(
        in_progress_patch(&annotated, Path::Legacy, expansion, &at()),
        json!({"metadata": {"resourceVersion": "7"}, "status": {"conditions": resizing}}),
        "legacy: conditions only"
    );
    let retry = in_progress_patch(
        &pvc(
            json!({"status": {"conditions": [{"type": "ControllerResizeError", "status": "True"}]}}),
        ),
        Path::Recovering,
        Expansion {
            bytes: 2 * GI,
            update_status: false,
        },
        &at(),
    );
    assert_eq!(
        retry["status"]["conditions"].as_array().unwrap().len(),
        2,
        "the same size keeps old conditions"
    );
    assert!(retry["status"].get("allocatedResourceStatuses").is_none());

    let pending = node_expansion_pending_patch(&pvc(json!({})), Path::Recovering, &at());
    assert_eq!(
        pending["status"]["conditions"][0]["type"],
        "FileSystemResizePending"
    );
    assert_eq!(
        pending["status"]["conditions"][0]["message"],
        FS_RESIZE_PENDING_MESSAGE
    );
    assert_eq!(
        pending["status"]["allocatedResourceStatuses"]["storage"],
        "NodeResizePending"
    );

    let resizing_claim =
        pvc(json!({"status": {"conditions": [{"type": "Resizing", "status": "True"}]}}));
    assert_eq!(
        finished_patch(&resizing_claim, Path::Recovering, 2 * GI),
        json!({
            "metadata": {"resourceVersion": "7", "annotations": {NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: "true"}},
            "status": {"capacity": {"storage": "2Gi"}, "conditions": null,
                "allocatedResourceStatuses": null}
        })
    );
    let with_other = pvc(
        json!({"status": {"allocatedResourceStatuses": {"storage": "ControllerResizeInProgress", "example.com/iops": "ControllerResizeInProgress"}}}),
    );
    assert_eq!(
        finished_patch(&with_other, Path::Recovering, 2 * GI)["status"]["allocatedResourceStatuses"],
        json!({"storage": null}),
        "other resources' statuses stay"
    );
    assert_eq!(
        finished_patch(&resizing_claim, Path::Legacy, 2 * GI),
        json!({"metadata": {"resourceVersion": "7"},
            "status": {"capacity": {"storage": "2Gi"}, "conditions": null}})
    );

    let failed = failed_patch(
        &pvc(json!({})),
        true,
        "rpc error: code = OutOfRange desc = too big",
        &at(),
    );
    assert!(
        failed.get("metadata").is_none(),
        "recorded even from an old copy"
    );
    assert_eq!(
        failed["status"]["allocatedResourceStatuses"]["storage"],
        "ControllerResizeInfeasible"
    );
    assert_eq!(
        failed["status"]["conditions"][0]["type"],
        "ControllerResizeError"
    );
    assert_eq!(
        failed["status"]["conditions"][0]["message"],
        "failed to expand pvc with rpc error: code = OutOfRange desc = too big"
    );
    assert!(
        failed_patch(&pvc(json!({})), false, "x", &at())["status"]
            .get("allocatedResourceStatuses")
            .is_none()
    );
}

#[test]
fn volume_patches() {
    let plain = pv(json!({}));
    assert_eq!(
        volume_patch(&plain, "1Gi", 2 * GI, true, true),
        json!({"spec": {"capacity": {"storage": "2Gi"}},
            "metadata": {"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: "1Gi"}}})
    );
    let capacity_only = json!({"spec": {"capacity": {"storage": "2Gi"}}});
    assert_eq!(
        volume_patch(&plain, "1Gi", 2 * GI, false, true),
        capacity_only,
        "no node expansion"
    );
    assert_eq!(
        volume_patch(&plain, "1Gi", 2 * GI, true, false),
        capacity_only,
        "gate off"
    );
    let annotated =
        pv(json!({"metadata": {"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: "512Mi"}}}));
    assert_eq!(
        volume_patch(&annotated, "1Gi", 2 * GI, true, true),
        capacity_only,
        "first value kept"
    );
    assert_eq!(
        claim_capacity_text(&pvc(json!({"status": {"capacity": null}}))),
        "0"
    );
}

const EBS: &str = "ebs.csi.aws.com";

/// The 1Gi PV bound to [`pvc`] as an in-tree EBS volume, with `extra` merged in.
fn ebs_pv(extra: Value) -> PersistentVolume {
    let mut value = json!({"spec": {"csi": null,
        "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1", "fsType": "xfs"}}});
    json_patch::merge(&mut value, &extra);
    pv(value)
}

/// A claim handed to `resizer` by the expand controller.
fn resized_by(resizer: &str) -> PersistentVolumeClaim {
    pvc(json!({"metadata": {"annotations": {"volume.kubernetes.io/storage-resizer": resizer}}}))
}

#[test]
fn migrated_in_tree_volumes_are_ours_once_their_claim_names_the_driver() {
    // (what, driver, claim, PV, ours)
    let cases: Vec<(&str, &str, PersistentVolumeClaim, PersistentVolume, bool)> = vec![
        (
            "EBS PV, claim for ebs",
            EBS,
            resized_by(EBS),
            ebs_pv(json!({})),
            true,
        ),
        (
            "EBS PV, claim not annotated",
            EBS,
            pvc(json!({})),
            ebs_pv(json!({})),
            false,
        ),
        (
            "EBS PV, claim for the in-tree plugin",
            EBS,
            resized_by("kubernetes.io/aws-ebs"),
            ebs_pv(json!({})),
            false,
        ),
        (
            "EBS PV, claim for another driver",
            EBS,
            resized_by("pd.csi.storage.gke.io"),
            ebs_pv(json!({})),
            false,
        ),
        (
            "no migration for the driver",
            DRIVER,
            resized_by(DRIVER),
            ebs_pv(json!({})),
            false,
        ),
        (
            "untranslated plugin, claim for ebs (fails when expanded, as upstream)",
            EBS,
            resized_by(EBS),
            pv(json!({"spec": {"csi": null, "nfs": {"server": "nfs", "path": "/"}}})),
            true,
        ),
        (
            "CSI PV of another driver, claim for ebs",
            EBS,
            resized_by(EBS),
            pv(json!({})),
            false,
        ),
        (
            "CSI PV of ebs",
            EBS,
            pvc(json!({})),
            pv(json!({"spec": {"csi": {"driver": EBS}}})),
            true,
        ),
    ];
    for (what, driver, claim, volume, ours) in cases {
        assert_eq!(can_support(&claim, &volume, driver), ours, "{what}");
        let want = if ours {
            expand(2 * GI, true)
        } else {
            Plan::Nothing
        };
        assert_eq!(plan_legacy(&claim, &volume, driver), want, "legacy: {what}");
        assert_eq!(
            plan_recovering(&claim, &volume, driver, CONTROLLER, Memory::default()),
            want,
            "recovering: {what}"
        );
    }
}

#[test]
fn in_tree_volumes_are_expanded_as_their_csi_translation() {
    let in_tree = ebs_pv(json!({}));
    let volume = csi_volume(&in_tree, EBS).unwrap();
    let request = expand_request(&volume, 2 * GI, false, HashMap::new()).unwrap();
    assert_eq!(request.volume_id, "vol-1", "the aws:// prefix dropped");
    let Some(AccessType::Mount(mount)) = request
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    else {
        panic!("a mount capability: {request:?}");
    };
    assert_eq!(mount.fs_type, "xfs");
    assert_eq!(
        request.volume_capability.unwrap().access_mode.unwrap().mode,
        Mode::SingleNodeWriter as i32
    );

    let csi = pv(json!({}));
    assert!(
        matches!(csi_volume(&csi, DRIVER), Ok(Cow::Borrowed(_))),
        "a CSI PV as it is"
    );

    let failures: Vec<(&str, PersistentVolume, &str, &str)> = vec![
        (
            "no migration for the driver",
            ebs_pv(json!({})),
            DRIVER,
            "volume pv-1 is not migrated to CSI",
        ),
        (
            "untranslated plugin",
            pv(json!({"spec": {"csi": null, "nfs": {"server": "nfs", "path": "/"}}})),
            EBS,
            "failed to translate persistent volume: could not find in-tree plugin translation logic for \"pv-1\"",
        ),
        (
            "another plugin",
            pv(json!({"spec": {"csi": null, "gcePersistentDisk": {"pdName": "disk"}}})),
            EBS,
            "failed to translate persistent volume: \"pv-1\" is a kubernetes.io/gce-pd volume, which did not migrate to ebs.csi.aws.com",
        ),
        (
            "bad EBS volume ID",
            ebs_pv(
                json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/disk"}}}),
            ),
            EBS,
            "failed to translate persistent volume: Invalid format for AWS volume (aws://us-east-1a/disk)",
        ),
    ];
    for (what, volume, driver, message) in failures {
        assert_eq!(
            csi_volume(&volume, driver).unwrap_err().to_string(),
            message,
            "{what}"
        );
    }
}

#[test]
fn an_expanded_in_tree_volume_keeps_its_source() {
    let in_tree = ebs_pv(json!({}));
    let mut value = serde_json::to_value(&in_tree).unwrap();
    json_patch::merge(
        &mut value,
        &volume_patch(&in_tree, "1Gi", 2 * GI, false, true),
    );
    let patched: PersistentVolume = serde_json::from_value(value).unwrap();
    assert_eq!(volume_capacity(&patched), 2 * GI);
    assert_eq!(
        patched.spec.as_ref().unwrap().aws_elastic_block_store,
        in_tree.spec.as_ref().unwrap().aws_elastic_block_store
    );
    assert!(patched.spec.unwrap().csi.is_none());
}
