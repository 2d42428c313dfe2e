use super::*;

use csi::controller_service_capability::rpc::Type::{
    GetVolume, GetVolumeHealth, ListVolumeHealth, ListVolumes,
};

#[test]
fn the_newest_generation_the_driver_serves_is_read() {
    let caps = |list: &[ControllerCapability]| list.iter().copied().collect::<BTreeSet<_>>();
    let cases = [
        (
            caps(&[ListVolumeHealth, GetVolumeHealth, ListVolumes]),
            true,
            Some(Source::ListHealth),
        ),
        (
            caps(&[GetVolumeHealth, ListVolumes, GetVolume]),
            true,
            Some(Source::GetHealth),
        ),
        (
            caps(&[ListVolumes, GetVolume]),
            true,
            Some(Source::ListConditions),
        ),
        (caps(&[GetVolume]), true, Some(Source::GetConditions)),
        (caps(&[ListVolumes, GetVolume]), false, None),
        (caps(&[]), true, None),
    ];
    for (capabilities, volume_condition, expected) in cases {
        assert_eq!(
            Source::of(&capabilities, volume_condition),
            expected,
            "{capabilities:?}, VOLUME_CONDITION {volume_condition}"
        );
    }
}

fn pv(name: &str, driver: &str, phase: &str, claim_uid: Option<&str>) -> CachedVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "csi": {"driver": driver, "volumeHandle": format!("handle-{name}")},
            "claimRef": {"namespace": "ns", "name": format!("claim-{name}"), "uid": claim_uid},
        },
        "status": {"phase": phase},
    }))
    .unwrap()
}

#[test]
fn the_bound_volumes_of_the_driver_are_monitored_with_their_claims() {
    let pvs = [
        pv("b", "ours", "Bound", Some("uid-b")),
        pv("a", "ours", "Bound", Some("uid-a")),
        pv("other", "theirs", "Bound", Some("uid-o")),
        pv("released", "ours", "Released", Some("uid-r")),
        pv("unclaimed", "ours", "Bound", None),
    ];
    let volumes = monitored(&pvs, "ours");
    let handles: Vec<&str> = volumes.iter().map(|v| v.handle.as_str()).collect();
    assert_eq!(handles, ["handle-a", "handle-b"]);
    assert_eq!(
        volumes[0].claim,
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("ns".into()),
            name: Some("claim-a".into()),
            uid: Some("uid-a".into()),
            ..ObjectReference::default()
        }
    );
}

#[test]
fn driver_answers_read_as_health() {
    assert_eq!(condition_of(None), Health::Normal);
    assert_eq!(
        condition_of(Some(v1_12::VolumeCondition {
            abnormal: true,
            message: "Volume not found".into()
        })),
        Health::Abnormal("Volume not found".into())
    );
    assert_eq!(
        condition_of(Some(v1_12::VolumeCondition {
            abnormal: false,
            message: "fine".into()
        })),
        Health::Normal
    );
    assert_eq!(health_of(None), Health::Normal);
    let inaccessible = csi::VolumeHealth {
        volume_id: "v".into(),
        health_statuses: vec![csi::volume_health::VolumeHealthEntry {
            status: csi::VolumeHealthErrorType::Inaccessible as i32,
            reason: "ImageMissing".into(),
            message: "gone".into(),
        }],
    };
    assert_eq!(
        health_of(Some(&inaccessible)),
        Health::Abnormal("Inaccessible (ImageMissing): gone".into())
    );
}
