use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;
use serde_json::{Value, json};

use super::*;

const DRIVER: &str = "hostpath.csi-suite.io";
const FULL: DriverSupport = DriverSupport {
    publish_unpublish: true,
    publish_readonly: true,
    single_node_multi_writer: false,
    list_published_nodes: true,
};

fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn va<T: serde::de::DeserializeOwned>(extra: Value) -> T {
    let mut value = json!({
        "metadata": {"name": "csi-1"},
        "spec": {"attacher": DRIVER, "nodeName": "node-a", "source": {"persistentVolumeName": "pv-1"}}
    });
    json_merge(&mut value, extra);
    from(value)
}

fn json_merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                json_merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, extra) => *base = extra,
    }
}

fn pv(spec: Value) -> CachedVolume {
    let mut value = json!({"metadata": {"name": "pv-1"}, "spec": {
        "accessModes": ["ReadWriteOnce"],
        "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}});
    json_merge(&mut value, json!({ "spec": spec }));
    from(value)
}

#[test]
fn finalizer_names_are_sanitized_as_upstream() {
    for (driver, expected) in [
        ("ebs.csi.aws.com", "external-attacher/ebs-csi-aws-com"),
        (
            "hostpath.csi.k8s.io",
            "external-attacher/hostpath-csi-k8s-io",
        ),
        ("odd_driver.", "external-attacher/odd-driver-X"),
        ("plain-name", "external-attacher/plain-name"),
    ] {
        assert_eq!(finalizer(driver), expected, "{driver}");
    }
}

#[test]
fn plans() {
    let trivial = DriverSupport::default();
    let ours = finalizer(DRIVER);
    let deleting =
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [ours]}});
    let cases: Vec<(&str, CachedAttachment, DriverSupport, VaPlan)> = vec![
        (
            "another attacher's",
            va(json!({"spec": {"attacher": "other"}})),
            FULL,
            VaPlan::NotOurs,
        ),
        ("new", va(json!({})), FULL, VaPlan::Attach),
        (
            "attached",
            va(json!({"status": {"attached": true}})),
            FULL,
            VaPlan::Nothing,
        ),
        (
            "failed before",
            va(json!({"status": {"attached": false, "attachError": {"message": "x"}}})),
            FULL,
            VaPlan::Attach,
        ),
        (
            "deleted with our finalizer",
            va(deleting.clone()),
            FULL,
            VaPlan::Detach,
        ),
        (
            "deleted, already released",
            va(
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["other"]}}),
            ),
            FULL,
            VaPlan::Nothing,
        ),
        ("trivial: new", va(json!({})), trivial, VaPlan::MarkAttached),
        (
            "trivial: attached",
            va(json!({"status": {"attached": true}})),
            trivial,
            VaPlan::Nothing,
        ),
        ("trivial: deleted", va(deleting), trivial, VaPlan::Nothing),
    ];
    for (name, va, support, expected) in cases {
        assert_eq!(plan(&va, DRIVER, support, false), expected, "{name}");
    }
}

/// The reconcile's force-sync: publish again what the driver lost, unpublish what it still has.
#[test]
fn forced_plans() {
    let attached = va(json!({"status": {"attached": true}}));
    let released = va(
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["other"]}}),
    );
    assert_eq!(plan(&attached, DRIVER, FULL, true), VaPlan::Attach);
    assert_eq!(plan(&released, DRIVER, FULL, true), VaPlan::Detach);
    assert_eq!(
        plan(&attached, DRIVER, DriverSupport::default(), true),
        VaPlan::Nothing,
        "a trivial attacher never calls the driver"
    );
}

#[test]
fn claim_patches() {
    let ours = finalizer(DRIVER);
    let annotation = format!(
        "/metadata/annotations/{}",
        NODE_ID_ANNOTATION.replace('/', "~1")
    );
    let cases = [
        (
            "bare",
            va(json!({"metadata": {"resourceVersion": "7"}})),
            Some(json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": [ours]},
                {"op": "add", "path": "/metadata/annotations", "value": {NODE_ID_ANNOTATION: "id-a"}},
            ])),
        ),
        (
            "others' finalizer and annotations",
            va(json!({"metadata": {"finalizers": ["x"], "annotations": {"a": "b"}}})),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": ours},
                {"op": "add", "path": annotation, "value": "id-a"},
            ])),
        ),
        (
            "stale node ID",
            va(
                json!({"metadata": {"finalizers": [ours], "annotations": {NODE_ID_ANNOTATION: "old"}}}),
            ),
            Some(json!([{"op": "add", "path": annotation, "value": "id-a"}])),
        ),
        (
            "done",
            va(
                json!({"metadata": {"finalizers": [ours], "annotations": {NODE_ID_ANNOTATION: "id-a"}}}),
            ),
            None,
        ),
    ];
    for (name, va, expected) in cases {
        assert_eq!(claim_patch(&va, &ours, "id-a"), expected, "{name}");
    }
    // The patch applies as JSON patch does on the apiserver.
    let mut object = json!({"metadata": {"finalizers": ["x"], "annotations": {"a": "b"}}});
    let patch: json_patch::Patch =
        serde_json::from_value(claim_patch(&from(object.clone()), &ours, "id-a").unwrap()).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(
        object,
        json!({"metadata": {"finalizers": ["x", ours], "annotations": {"a": "b", NODE_ID_ANNOTATION: "id-a"}}})
    );
}

#[test]
fn status_patches() {
    let context: HashMap<String, String> = [("device".to_string(), "/dev/x".to_string())].into();
    assert_eq!(
        attached_status(&context),
        json!({"status": {"attached": true, "attachmentMetadata": {"device": "/dev/x"}, "attachError": null}})
    );
    assert_eq!(
        attached_status(&HashMap::new())["status"]["attachmentMetadata"],
        Value::Null
    );
    assert_eq!(
        detached_status(),
        json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
    );
    let time = "2026-01-01T00:00:00Z";
    assert_eq!(
        error_status(Operation::Attach, false, "boom", Some(14), time),
        json!({"status": {"attached": false, "attachError": {"time": time, "message": "boom", "errorCode": 14}}})
    );
    assert_eq!(
        error_status(Operation::Detach, true, "boom", Some(14), time),
        json!({"status": {"attached": true, "detachError": {"time": time, "message": "boom"}}}),
        "no errorCode on detach errors, as upstream"
    );
}

#[test]
fn driver_support_from_capabilities() {
    use csi::controller_service_capability::rpc::Type as Rpc;
    let mut driver = DriverInfo {
        controller: [Rpc::PublishUnpublishVolume, Rpc::ListVolumes].into(),
        ..DriverInfo::default()
    };
    assert_eq!(
        DriverSupport::of(&driver),
        DriverSupport::default(),
        "no controller service: trivial"
    );
    driver.plugin.controller_service = true;
    assert_eq!(
        DriverSupport::of(&driver),
        DriverSupport {
            publish_unpublish: true,
            ..DriverSupport::default()
        },
        "ListVolumes alone does not enable the reconcile"
    );
    driver
        .controller
        .extend([Rpc::ListVolumesPublishedNodes, Rpc::PublishReadonly]);
    let support = DriverSupport::of(&driver);
    assert!(support.list_published_nodes && support.publish_readonly);
}

#[test]
fn attached_volumes() {
    let volume = pv(json!({}));
    let got = attached_volume(&va(json!({})), Some(&volume), None).unwrap();
    assert_eq!(
        (got.pv_name.as_deref(), got.csi.volume_handle.as_str()),
        (Some("pv-1"), "vol-1")
    );

    let inline = va(
        json!({"spec": {"source": {"persistentVolumeName": null, "inlineVolumeSpec": {
        "accessModes": ["ReadOnlyMany"], "csi": {"driver": DRIVER, "volumeHandle": "inline-1"}}}}}),
    );
    let got = attached_volume(&inline, None, None).unwrap();
    assert_eq!(
        (got.pv_name, got.csi.volume_handle.as_str()),
        (None, "inline-1")
    );

    let deleted: CachedVolume = from(
        json!({"metadata": {"name": "pv-1", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}}),
    );
    let not_csi: CachedVolume =
        from(json!({"metadata": {"name": "pv-1"}, "spec": {"hostPath": {"path": "/x"}}}));
    let both = va(
        json!({"spec": {"source": {"inlineVolumeSpec": {"csi": {"driver": DRIVER, "volumeHandle": "i"}}}}}),
    );
    let neither = va(json!({"spec": {"source": {"persistentVolumeName": null}}}));
    let inline_not_csi = va(json!({"spec": {"source": {"persistentVolumeName": null,
        "inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"]}}}}));
    // (case, result, error, upstream's attachError message)
    let cases = [
        (
            "missing PV",
            attached_volume(&va(json!({})), None, None),
            AttachError::MissingVolume("pv-1".into()),
            r#"persistentvolume "pv-1" not found"#,
        ),
        (
            "PV being deleted",
            attached_volume(&va(json!({})), Some(&deleted), None),
            AttachError::VolumeDeleted("pv-1".into()),
            r#"PersistentVolume "pv-1" is marked for deletion"#,
        ),
        (
            "not CSI",
            attached_volume(&va(json!({})), Some(&not_csi), None),
            AttachError::NotCsi,
            "pv spec contained non-csi source that was not migrated",
        ),
        (
            "inline, not CSI",
            attached_volume(&inline_not_csi, None, None),
            AttachError::InlineNotCsi,
            "inline volume spec contains nil CSI source",
        ),
        (
            "both sources",
            attached_volume(&both, Some(&volume), None),
            AttachError::TwoSources,
            "both InlineCSIVolumeSource and PersistentVolumeName specified in VA source",
        ),
        (
            "no source",
            attached_volume(&neither, None, None),
            AttachError::NoSource,
            "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source",
        ),
    ];
    for (name, got, expected, text) in cases {
        assert_eq!(expected.to_string(), text, "{name}");
        assert_eq!(got, Err(expected), "{name}");
    }
}

#[test]
fn node_ids_come_from_the_csinode_and_on_detach_from_the_annotation() {
    let csi_node: CSINode = from(json!({"metadata": {"name": "node-a"}, "spec": {"drivers": [
        {"name": DRIVER, "nodeID": "id-a"}]}}));
    let other: CSINode = from(json!({"metadata": {"name": "node-a"}, "spec": {"drivers": [
        {"name": "other", "nodeID": "x"}]}}));
    assert_eq!(
        attach_node_id("node-a", Some(&csi_node), DRIVER),
        Ok("id-a".into())
    );
    assert_eq!(
        attach_node_id("node-a", None, DRIVER),
        Err(AttachError::MissingCsiNode {
            node: "node-a".into()
        })
    );
    assert_eq!(
        attach_node_id("node-a", Some(&other), DRIVER),
        Err(AttachError::DriverNotOnNode {
            node: "node-a".into(),
            driver: DRIVER.into()
        })
    );
    let annotated = va(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "id-old"}}}));
    assert_eq!(
        detach_node_id(&annotated, Some(&csi_node), DRIVER),
        Ok("id-a".into())
    );
    assert_eq!(
        detach_node_id(&annotated, None, DRIVER),
        Ok("id-old".into()),
        "node deleted"
    );
    // Without either, the CSINode's error, as upstream's texts.
    let missing = detach_node_id(&va(json!({})), None, DRIVER).unwrap_err();
    assert_eq!(
        missing.to_string(),
        r#"csinode.storage.k8s.io "node-a" not found"#
    );
    let without_driver = detach_node_id(&va(json!({})), Some(&other), DRIVER).unwrap_err();
    assert_eq!(
        without_driver.to_string(),
        format!("CSINode node-a does not contain driver {DRIVER}")
    );
}

fn request(
    spec: Value,
    support: DriverSupport,
    default_fstype: &str,
) -> Result<csi::ControllerPublishVolumeRequest, AttachError> {
    let volume = attached_volume(&va(json!({})), Some(&pv(spec)), None).unwrap();
    publish_request(&volume, default_fstype, support)
}

fn mount_of(request: &csi::ControllerPublishVolumeRequest) -> csi::volume_capability::MountVolume {
    match request
        .volume_capability
        .clone()
        .and_then(|c| c.access_type)
    {
        Some(AccessType::Mount(mount)) => mount,
        other => panic!("a mount capability, got {other:?}"),
    }
}

#[test]
fn publish_requests() {
    let got = request(
        json!({"mountOptions": ["noatime"], "csi": {"fsType": "xfs", "readOnly": true,
            "volumeAttributes": {"pool": "fast"}}}),
        FULL,
        "ext4",
    )
    .unwrap();
    assert_eq!(
        (got.volume_id.as_str(), got.node_id.as_str()),
        ("vol-1", ""),
        "the node ID is the controller's to add, after the Secret"
    );
    assert!(got.readonly, "readOnly with PUBLISH_READONLY");
    assert_eq!(
        got.volume_context.get("pool").map(String::as_str),
        Some("fast")
    );
    let mount = mount_of(&got);
    assert_eq!(
        (mount.fs_type.as_str(), mount.mount_flags.as_slice()),
        ("xfs", &["noatime".to_string()][..])
    );
    let mode = got.volume_capability.unwrap().access_mode.unwrap().mode();
    assert_eq!(mode, Mode::SingleNodeWriter);

    let no_readonly = DriverSupport {
        publish_readonly: false,
        ..FULL
    };
    assert!(
        !request(json!({"csi": {"readOnly": true}}), no_readonly, "")
            .unwrap()
            .readonly,
        "readonly needs PUBLISH_READONLY"
    );
    assert_eq!(
        mount_of(&request(json!({}), FULL, "ext4").unwrap()).fs_type,
        "ext4",
        "--default-fstype"
    );

    let block = request(json!({"volumeMode": "Block"}), FULL, "ext4").unwrap();
    assert!(matches!(
        block.volume_capability.unwrap().access_type,
        Some(AccessType::Block(_))
    ));

    let multi_writer = DriverSupport {
        single_node_multi_writer: true,
        ..FULL
    };
    let capability = request(json!({}), multi_writer, "")
        .unwrap()
        .volume_capability
        .unwrap();
    assert_eq!(
        capability.access_mode.unwrap().mode(),
        Mode::SingleNodeMultiWriter
    );

    assert_eq!(
        request(
            json!({"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}),
            FULL,
            ""
        ),
        Err(AttachError::AccessMode(
            CapabilityError::ReadOnlyWithReadWriteOnce
        ))
    );
}

/// CSI migration: an in-tree PV the EBS driver's attacher is handed is attached as its CSI
/// volume (the handle and attributes csi-translation-lib gives it); read as stored, since the
/// cached PV has no in-tree source. A PV of no migrated plugin stays "not migrated".
#[test]
fn in_tree_volumes_attach_as_their_csi_volume() {
    let ebs = json!({"metadata": {"name": "pv-1"}, "spec": {
        "accessModes": ["ReadWriteOnce"],
        "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0abc", "fsType": "xfs"}}});
    let cached: CachedVolume = from(ebs.clone());
    let stored: PersistentVolume = from(ebs);
    let va = va(json!({"spec": {"attacher": "ebs.csi.aws.com"}}));
    assert_eq!(
        attached_volume(&va, Some(&cached), None),
        Err(AttachError::NotCsi),
        "the cached PV alone cannot tell"
    );
    let volume = attached_volume(&va, Some(&cached), Some(&stored)).unwrap();
    assert_eq!(volume.pv_name.as_deref(), Some("pv-1"));
    assert_eq!(volume.csi.driver, "ebs.csi.aws.com");
    assert_eq!(volume.csi.volume_handle, "vol-0abc");
    assert_eq!(
        volume.csi.volume_attributes,
        Some([("partition".to_string(), "0".to_string())].into())
    );
    let request = publish_request(&volume, "ext4", FULL).unwrap();
    assert_eq!(request.volume_id, "vol-0abc");
    assert_eq!(mount_of(&request).fs_type, "xfs");
    assert_eq!(request.volume_context["partition"], "0");

    let hostpath: PersistentVolume =
        from(json!({"metadata": {"name": "pv-1"}, "spec": {"hostPath": {"path": "/x"}}}));
    let cached_hostpath: CachedVolume =
        from(json!({"metadata": {"name": "pv-1"}, "spec": {"hostPath": {"path": "/x"}}}));
    assert_eq!(
        volume_of(&va, Some(&cached_hostpath), Some(&hostpath)),
        Err(AttachError::NotCsi)
    );
    let bad: PersistentVolume = from(json!({"metadata": {"name": "pv-1"},
        "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/disk/1"}}}));
    let error = volume_of(&va, Some(&cached_hostpath), Some(&bad)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "failed to translate in tree pv to CSI: Invalid format for AWS volume (aws://us-east-1a/disk/1)"
    );
}
