use serde_json::json;

use super::*;

const DRIVER: &str = "hostpath.csi.k8s.io";

fn claim(
    spec: Option<&str>,
    current: Option<&str>,
    modify: Option<(&str, &str)>,
) -> PersistentVolumeClaim {
    let mut status = json!({"phase": "Bound"});
    if let Some(current) = current {
        status["currentVolumeAttributesClassName"] = json!(current);
    }
    if let Some((state, target)) = modify {
        status["modifyVolumeStatus"] =
            json!({"status": state, "targetVolumeAttributesClassName": target});
    }
    let mut spec_value = json!({"volumeName": "pv-1"});
    if let Some(spec) = spec {
        spec_value["volumeAttributesClassName"] = json!(spec);
    }
    serde_json::from_value(
        json!({"metadata": {"name": "data", "namespace": "ns", "resourceVersion": "7"},
        "spec": spec_value, "status": status}),
    )
    .unwrap()
}

fn volume(driver: &str) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": "pv-1"},
        "spec": {"csi": {"driver": driver, "volumeHandle": "vol-1"}}}))
    .unwrap()
}

fn with_condition(mut pvc: PersistentVolumeClaim, kind: &str) -> PersistentVolumeClaim {
    pvc.status.as_mut().unwrap().conditions = Some(vec![PersistentVolumeClaimCondition {
        type_: kind.into(),
        status: "True".into(),
        ..PersistentVolumeClaimCondition::default()
    }]);
    pvc
}

fn modify(class: &str, mark: bool) -> ModifyPlan {
    ModifyPlan::Modify {
        class: class.into(),
        mark,
    }
}

#[test]
fn plans_follow_upstream_modify() {
    let uncertain = Memory {
        uncertain: true,
        infeasible_wait: None,
    };
    let slow = Memory {
        uncertain: false,
        infeasible_wait: Some(Duration::from_secs(60)),
    };
    let cases: Vec<(&str, PersistentVolumeClaim, &str, Memory, ModifyPlan)> = vec![
        (
            "no class anywhere",
            claim(None, None, None),
            DRIVER,
            Memory::default(),
            ModifyPlan::Nothing,
        ),
        (
            "at its class",
            claim(Some("gold"), Some("gold"), None),
            DRIVER,
            Memory::default(),
            ModifyPlan::Nothing,
        ),
        (
            "a new class",
            claim(Some("gold"), None, None),
            DRIVER,
            Memory::default(),
            modify("gold", true),
        ),
        (
            "another class",
            claim(Some("platinum"), Some("gold"), None),
            DRIVER,
            Memory::default(),
            modify("platinum", true),
        ),
        (
            "another driver's volume",
            claim(Some("gold"), None, None),
            "other.csi",
            Memory::default(),
            ModifyPlan::Nothing,
        ),
        (
            "in progress, outcome unknown: the same target again, unmarked",
            claim(
                Some("platinum"),
                Some("gold"),
                Some((status::IN_PROGRESS, "silver")),
            ),
            DRIVER,
            uncertain,
            modify("silver", false),
        ),
        (
            "in progress after a final error: the spec's class, marked",
            claim(
                Some("platinum"),
                Some("gold"),
                Some((status::IN_PROGRESS, "silver")),
            ),
            DRIVER,
            Memory::default(),
            modify("platinum", true),
        ),
        (
            "infeasible, same class: slow retry",
            claim(
                Some("platinum"),
                Some("gold"),
                Some((status::INFEASIBLE, "platinum")),
            ),
            DRIVER,
            slow,
            ModifyPlan::RetryLater(Duration::from_secs(60)),
        ),
        (
            "infeasible, the user named another class: at once",
            claim(
                Some("silver"),
                Some("gold"),
                Some((status::INFEASIBLE, "platinum")),
            ),
            DRIVER,
            slow,
            modify("silver", true),
        ),
        (
            "class removed while a call may run: finish it",
            claim(None, Some("gold"), Some((status::IN_PROGRESS, "silver"))),
            DRIVER,
            Memory::default(),
            modify("silver", false),
        ),
        (
            "class removed, nothing running: rolled back",
            with_condition(
                claim(None, Some("gold"), Some((status::PENDING, "silver"))),
                condition::MODIFYING,
            ),
            DRIVER,
            Memory::default(),
            ModifyPlan::RolledBack,
        ),
        (
            "class removed, no condition left: nothing",
            claim(None, Some("gold"), Some((status::PENDING, ""))),
            DRIVER,
            Memory::default(),
            ModifyPlan::Nothing,
        ),
    ];
    for (name, pvc, driver, memory, expected) in cases {
        assert_eq!(
            plan(&pvc, &volume(driver), DRIVER, memory),
            expected,
            "{name}"
        );
    }
    let mut pending = claim(Some("gold"), None, None);
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    assert_eq!(
        plan(&pending, &volume(DRIVER), DRIVER, Memory::default()),
        ModifyPlan::Nothing,
        "only bound claims"
    );
}

#[test]
fn status_patches_mark_conditions_as_upstream() {
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let pvc = claim(Some("gold"), None, None);
    let marked = status_patch(&pvc, status::IN_PROGRESS, None, &now);
    assert_eq!(marked["metadata"]["resourceVersion"], "7", "guarded");
    assert_eq!(
        marked["status"]["modifyVolumeStatus"],
        json!({"status": "InProgress", "targetVolumeAttributesClassName": "gold"})
    );
    assert_eq!(
        marked["status"]["conditions"][0]["type"],
        condition::MODIFYING
    );
    assert_eq!(
        marked["status"]["conditions"][0]["message"],
        "Modifying volume to \"gold\" is in progress."
    );
    let in_progress = claim(Some("gold"), None, Some((status::IN_PROGRESS, "gold")));
    let invalid = Failure {
        code: Code::InvalidArgument,
        message: "no such tier".into(),
    };
    let failed = status_patch(&in_progress, invalid.status(), Some(&invalid), &now);
    assert_eq!(
        failed["status"]["modifyVolumeStatus"]["status"],
        "Infeasible"
    );
    let conditions = failed["status"]["conditions"].as_array().unwrap();
    assert_eq!(
        conditions[0]["message"],
        "Modifying volume to \"gold\" failed. Waiting for retry."
    );
    assert_eq!(conditions[1]["type"], condition::ERROR);
    assert_eq!(conditions[1]["reason"], "InvalidArgument");
    assert_eq!(conditions[1]["message"], "no such tier");
    let timeout = Failure {
        code: Code::DeadlineExceeded,
        message: "slow".into(),
    };
    assert_eq!(timeout.status(), status::IN_PROGRESS);
    assert_eq!(
        timeout.event_message("gold"),
        "rpc error: code = DeadlineExceeded desc = slow. Still modifying to VAC gold"
    );
    let pending = status_patch(&pvc, status::PENDING, None, &now);
    assert_eq!(
        pending["status"]["modifyVolumeStatus"],
        json!({"status": "Pending"})
    );
    assert!(
        pending["status"].get("conditions").is_none(),
        "Pending touches no condition"
    );
}

#[test]
fn completion_and_rollback_clear_their_conditions() {
    let pvc = with_condition(
        claim(Some("gold"), None, Some((status::IN_PROGRESS, "gold"))),
        condition::MODIFYING,
    );
    let done = completed_patch(&pvc, "gold");
    assert_eq!(
        done,
        json!({"status": {"modifyVolumeStatus": null, "currentVolumeAttributesClassName": "gold", "conditions": null}})
    );
    assert_eq!(
        volume_patch("gold"),
        json!({"spec": {"volumeAttributesClassName": "gold"}})
    );
    assert_eq!(
        rolled_back_patch(&pvc),
        json!({"status": {"conditions": null}})
    );
}

#[test]
fn requests_carry_parameters_metadata_and_the_volume() {
    let class: VolumeAttributesClass = serde_json::from_value(json!({"metadata": {"name": "gold"},
        "driverName": DRIVER, "parameters": {"iops": "3000"}}))
    .unwrap();
    let parameters = super::parameters(&class, DRIVER).unwrap();
    let request = request(
        &claim(Some("gold"), None, None),
        &volume(DRIVER),
        parameters,
        true,
        HashMap::new(),
    );
    assert_eq!(request.volume_id, "vol-1");
    assert_eq!(request.mutable_parameters["iops"], "3000");
    assert_eq!(request.mutable_parameters[PVC_NAME_KEY], "data");
    assert_eq!(request.mutable_parameters[PVC_NAMESPACE_KEY], "ns");
    assert_eq!(request.mutable_parameters[PV_NAME_KEY], "pv-1");
    assert!(super::parameters(&class, "other.csi").is_err());
}

#[test]
fn the_modify_secret_comes_from_the_annotations_then_the_expand_secret() {
    let mut pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv-1",
        "annotations": {SECRET_NAME_ANNOTATION: "m", SECRET_NAMESPACE_ANNOTATION: "ns"}},
        "spec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-1",
            "controllerExpandSecretRef": {"name": "e", "namespace": "ns2"}}}}))
    .unwrap();
    assert_eq!(modify_secret(&pv).map(|s| s.name), Some("m".to_string()));
    pv.metadata.annotations = None;
    assert_eq!(modify_secret(&pv).map(|s| s.name), Some("e".to_string()));
}
