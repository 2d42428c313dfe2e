use std::collections::{BTreeMap, HashMap};

use csi_grpc::conn::PluginCapabilities;
use csi_kinds::secrets::SecretRef;
use serde_json::{Value, json};

use super::*;
use crate::topology::SelectedNode;

pub(crate) const DRIVER: &str = "csi.example.com";

pub(crate) fn driver(capabilities: &[ControllerCapability], topology: bool) -> DriverInfo {
    DriverInfo {
        name: DRIVER.to_string(),
        plugin: PluginCapabilities {
            controller_service: true,
            volume_accessibility_constraints: topology,
            ..PluginCapabilities::default()
        },
        controller: capabilities.iter().copied().collect(),
        ..DriverInfo::default()
    }
}

/// Every controller capability a plan looks at.
fn full_driver() -> DriverInfo {
    use ControllerCapability::*;
    driver(
        &[
            CreateDeleteVolume,
            CreateDeleteSnapshot,
            CloneVolume,
            ModifyVolume,
        ],
        false,
    )
}

pub(crate) fn policy(driver: &DriverInfo) -> Policy<'_> {
    Policy {
        driver,
        default_fstype: "ext4",
        extra_create_metadata: false,
        topology: true,
        strict_topology: false,
        immediate_topology: true,
        cross_namespace_data_sources: false,
        volume_attributes_classes: csi_kinds::vac::Support::Served,
    }
}

/// A claim of 1Gi in namespace `apps`; `spec` is merged over the defaults.
fn claim(spec: Value) -> PersistentVolumeClaim {
    let mut value = json!({
        "metadata": {"name": "data", "namespace": "apps", "uid": "uid-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}},
    });
    for (key, field) in spec.as_object().cloned().unwrap_or_default() {
        value["spec"][key] = field;
    }
    serde_json::from_value(value).unwrap()
}

fn class(parameters: Value) -> StorageClass {
    serde_json::from_value(json!({"metadata": {"name": "fast"}, "provisioner": DRIVER,
        "parameters": parameters}))
    .unwrap()
}

/// The caches a plan reads, as plain maps.
#[derive(Default)]
struct Caches {
    claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    volumes: HashMap<String, Arc<PersistentVolume>>,
    grants: Option<Vec<Arc<ReferenceGrant>>>,
    attribute_classes: HashMap<String, Arc<VolumeAttributesClass>>,
    topology: PinnedTopology,
}

impl Lookups for Caches {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(name).cloned()
    }
    fn reference_grants(&self) -> Option<Vec<Arc<ReferenceGrant>>> {
        self.grants.clone()
    }
    fn attributes_class(&self, name: &str) -> Result<Option<Arc<VolumeAttributesClass>>, VacError> {
        Ok(self.attribute_classes.get(name).cloned())
    }
    fn node_topology(&self, _uid: &str, _selected_node: Option<&str>) -> PinnedTopology {
        self.topology.clone()
    }
}

/// A Bound source claim `src` in `apps` and its PV `pv-src` of our driver.
fn with_clone_source(caches: &mut Caches) {
    let source: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "src", "namespace": "apps", "uid": "uid-src"},
        "spec": {"storageClassName": "fast", "volumeName": "pv-src",
            "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-src"},
        "spec": {"csi": {"driver": DRIVER, "volumeHandle": "handle-src"},
            "claimRef": {"name": "src", "namespace": "apps", "uid": "uid-src"}},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    caches
        .claims
        .insert(("apps".into(), "src".into()), Arc::new(source));
    caches.volumes.insert("pv-src".into(), Arc::new(volume));
}

fn plan_of(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    driver: &DriverInfo,
    caches: &Caches,
) -> Result<Decision, Refusal> {
    super::plan(&inputs(claim, class), &policy(driver), caches)
}

/// The claim as volume `pvc-1`, without a selected node.
fn inputs<'a>(claim: &'a PersistentVolumeClaim, class: &'a StorageClass) -> Claim<'a> {
    Claim {
        claim,
        class,
        name: "pvc-1",
        selected_node: None,
        fallback_hash: 0,
    }
}

fn provision(decision: Result<Decision, Refusal>) -> ProvisionPlan {
    match decision {
        Ok(Decision::Provision(plan)) => *plan,
        other => panic!("expected a plan, got {other:?}"),
    }
}

#[test]
fn refusals_in_upstreams_order() {
    use ControllerCapability::*;
    let snapshot_source = json!({"dataSource": {"apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot", "name": "snap"}});
    let clone_source = json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}});
    let plain = class(json!({}));
    let table: Vec<(
        &str,
        PersistentVolumeClaim,
        StorageClass,
        DriverInfo,
        Refusal,
    )> = vec![
        (
            "an unreadable request, before anything else",
            claim(
                json!({"resources": {"requests": {"storage": "1 gig"}}, "dataSource": {"kind": "Foo", "apiGroup": "x", "name": "f"}}),
            ),
            plain.clone(),
            driver(&[], false),
            Refusal::Claim(
                claims::requested_size(&claim(
                    json!({"resources": {"requests": {"storage": "1 gig"}}}),
                ))
                .unwrap_err(),
            ),
        ),
        (
            "a snapshot without CREATE_DELETE_SNAPSHOT",
            claim(snapshot_source.clone()),
            plain.clone(),
            driver(&[CreateDeleteVolume], false),
            Refusal::NoSnapshots,
        ),
        (
            "a clone without CLONE_VOLUME",
            claim(clone_source.clone()),
            plain.clone(),
            driver(&[CreateDeleteVolume], false),
            Refusal::NoCloning,
        ),
        (
            "a clone of a claim the cache does not have",
            claim(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "gone"}})),
            plain.clone(),
            full_driver(),
            Refusal::CloneSource {
                name: "gone".into(),
                cause: ClaimError::CloneSource(
                    r#"error getting PVC gone (namespace "apps") from api server: persistentvolumeclaim "gone" not found"#.into(),
                ),
            },
        ),
        (
            "a clone larger source than the claim",
            claim(
                json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"},
                "resources": {"requests": {"storage": "1Mi"}}}),
            ),
            plain.clone(),
            full_driver(),
            Refusal::CloneSource {
                name: "src".into(),
                cause: ClaimError::CloneSource(
                    "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1048576 but source is 1073741824".into(),
                ),
            },
        ),
        (
            "no CREATE_DELETE_VOLUME",
            claim(json!({})),
            plain.clone(),
            driver(&[CloneVolume], false),
            Refusal::NoProvisioning,
        ),
        (
            "a VolumeAttributesClass without MODIFY_VOLUME",
            claim(json!({"volumeAttributesClassName": "gold"})),
            plain.clone(),
            driver(&[CreateDeleteVolume], false),
            Refusal::AttributesClass(VacError::NoModifyVolume),
        ),
        (
            "a VolumeAttributesClass that does not exist",
            claim(json!({"volumeAttributesClassName": "silver"})),
            plain.clone(),
            full_driver(),
            Refusal::AttributesClass(VacError::NotFound("silver".into())),
        ),
        (
            "a selector, after the driver's capabilities",
            claim(json!({"selector": {"matchLabels": {"a": "b"}}, "volumeAttributesClassName": "gold"})),
            plain.clone(),
            driver(&[CreateDeleteVolume], false),
            Refusal::AttributesClass(VacError::NoModifyVolume),
        ),
        (
            "a selector, before both fstype spellings",
            claim(json!({"selector": {"matchLabels": {"a": "b"}}})),
            class(json!({"fstype": "xfs", "csi.storage.k8s.io/fstype": "ext4"})),
            full_driver(),
            Refusal::Claim(ClaimError::Selector),
        ),
        (
            "both fstype spellings",
            claim(json!({})),
            class(json!({"fstype": "xfs", "csi.storage.k8s.io/fstype": "ext4"})),
            full_driver(),
            Refusal::Request(RequestError::ConflictingFsType),
        ),
        (
            "an unknown reserved parameter",
            claim(json!({})),
            class(json!({"csi.storage.k8s.io/unknown": "x"})),
            full_driver(),
            Refusal::Parameters(SecretsError::UnknownReservedKey(
                "csi.storage.k8s.io/unknown".into(),
            )),
        ),
        (
            "no access modes",
            claim(json!({"accessModes": []})),
            plain.clone(),
            full_driver(),
            Refusal::Request(RequestError::NoAccessModes),
        ),
        (
            "no controller service, before the missing source",
            claim(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "gone"}})),
            plain.clone(),
            DriverInfo {
                plugin: PluginCapabilities::default(),
                ..full_driver()
            },
            Refusal::NoControllerService,
        ),
        (
            "no CREATE_DELETE_VOLUME, before the missing snapshot support",
            claim(snapshot_source.clone()),
            plain.clone(),
            driver(&[CloneVolume], false),
            Refusal::NoProvisioning,
        ),
        (
            "no access modes, before the missing source",
            claim(json!({"accessModes": [], "dataSource": {"kind": "PersistentVolumeClaim", "name": "gone"}})),
            plain.clone(),
            full_driver(),
            Refusal::Request(RequestError::NoAccessModes),
        ),
    ];
    let mut caches = Caches::default();
    with_clone_source(&mut caches);
    for (case, claim, class, driver, expected) in table {
        match plan_of(&claim, &class, &driver, &caches) {
            Err(refusal) => assert_eq!(refusal, expected, "{case}"),
            Ok(decision) => panic!("{case}: expected {expected:?}, got {decision:?}"),
        }
    }
}

/// The texts of upstream's `checkDriverCapabilities` and `prepareProvision`.
#[test]
fn refusals_read_as_upstreams() {
    let table = [
        (
            Refusal::NoControllerService,
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported",
        ),
        (
            Refusal::NoProvisioning,
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
        ),
        (
            Refusal::NoSnapshots,
            "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported",
        ),
        (
            Refusal::NoCloning,
            "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
        ),
        (
            Refusal::CloneSource {
                name: "src".into(),
                cause: ClaimError::CloneSourceInvalid("no PV".into()),
            },
            "error getting handle for DataSource Type PersistentVolumeClaim by Name src: claim in dataSource not bound or invalid",
        ),
    ];
    for (refusal, text) in table {
        assert_eq!(refusal.to_string(), text);
    }
}

#[test]
fn a_plain_claim_gets_the_whole_request() {
    let driver = full_driver();
    let claim = claim(json!({}));
    let class = class(json!({"type": "ssd",
        "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-key",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}"}));
    let plan = provision(plan_of(&claim, &class, &driver, &Caches::default()));
    assert_eq!(plan.name, "pvc-1");
    assert_eq!(plan.requested_bytes, 1 << 30);
    assert_eq!(plan.fs_type, "ext4");
    assert_eq!(plan.source, PlannedSource::Empty);
    assert_eq!(
        plan.parameters,
        BTreeMap::from([("type".to_string(), "ssd".to_string())]),
        "reserved keys are not sent"
    );
    assert_eq!(
        plan.secret_refs.provisioner,
        Some(SecretRef {
            name: "data-key".into(),
            namespace: "apps".into()
        })
    );
    assert_eq!(plan.capabilities.len(), 1);
    assert!(!plan.topology_supported);
    assert_eq!(plan.accessibility, None);
    assert!(plan.mutable_parameters.is_empty());
    assert_eq!(plan.attributes_class, None);

    let request = request::create_volume(&plan, HashMap::new(), None);
    assert_eq!(request.name, "pvc-1");
    assert_eq!(
        request.capacity_range.map(|r| r.required_bytes),
        Some(1 << 30)
    );
    assert_eq!(
        request.parameters.get("type").map(String::as_str),
        Some("ssd")
    );
}

#[test]
fn sources_metadata_and_attribute_classes() {
    let driver = full_driver();
    let mut caches = Caches::default();
    with_clone_source(&mut caches);
    let gold: VolumeAttributesClass = serde_json::from_value(json!({
        "metadata": {"name": "gold"}, "driverName": DRIVER, "parameters": {"iops": "300"}}))
    .unwrap();
    caches
        .attribute_classes
        .insert("gold".into(), Arc::new(gold));

    let clone = claim(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}));
    let plan = provision(plan_of(&clone, &class(json!({})), &driver, &caches));
    assert!(
        matches!(&plan.source, PlannedSource::Clone { source, volume_handle }
            if source.name_any() == "src" && volume_handle == "handle-src"),
        "{:?}",
        plan.source
    );

    let restore = claim(
        json!({"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot", "name": "snap"}}),
    );
    let plan = provision(plan_of(&restore, &class(json!({})), &driver, &caches));
    assert_eq!(
        plan.source,
        PlannedSource::Snapshot {
            name: "snap".into(),
            namespace: "apps".into()
        }
    );

    let populated = claim(json!({"dataSourceRef": {"apiGroup": "example.com",
        "kind": "Backup", "name": "b"}}));
    assert!(matches!(
        plan_of(&populated, &class(json!({})), &driver, &caches),
        Ok(Decision::Populator { kind }) if kind == "Backup"
    ));

    let with_class = claim(json!({"volumeAttributesClassName": "gold"}));
    let plan = provision(plan_of(&with_class, &class(json!({})), &driver, &caches));
    assert_eq!(plan.attributes_class.as_deref(), Some("gold"));
    assert_eq!(
        plan.mutable_parameters,
        BTreeMap::from([("iops".to_string(), "300".to_string())])
    );

    let policy = Policy {
        extra_create_metadata: true,
        ..policy(&driver)
    };
    let (claim, class) = (claim(json!({})), class(json!({})));
    let plan = provision(super::plan(&inputs(&claim, &class), &policy, &caches));
    assert_eq!(
        plan.parameters,
        BTreeMap::from([
            (request::PVC_NAME_KEY.to_string(), "data".to_string()),
            (request::PVC_NAMESPACE_KEY.to_string(), "apps".to_string()),
            (request::PV_NAME_KEY.to_string(), "pvc-1".to_string()),
        ])
    );
}

#[test]
fn cross_namespace_sources_need_a_grant() {
    let driver = full_driver();
    let policy = Policy {
        cross_namespace_data_sources: true,
        ..policy(&driver)
    };
    let claim = claim(
        json!({"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot", "name": "snap", "namespace": "data"}}),
    );
    let class = class(json!({}));
    let inputs = inputs(&claim, &class);
    let mut caches = Caches {
        grants: Some(Vec::new()),
        ..Caches::default()
    };
    assert!(matches!(
        super::plan(&inputs, &policy, &caches),
        Err(Refusal::NotGranted(_))
    ));
    let grant: ReferenceGrant = serde_json::from_value(json!({
        "metadata": {"name": "g", "namespace": "data"},
        "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "apps"}],
            "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}]}}))
    .unwrap();
    caches.grants = Some(vec![Arc::new(grant)]);
    let plan = provision(super::plan(&inputs, &policy, &caches));
    assert_eq!(
        plan.source,
        PlannedSource::Snapshot {
            name: "snap".into(),
            namespace: "data".into()
        }
    );
}

#[test]
fn topology_comes_from_the_pinned_nodes() {
    use ControllerCapability::*;
    let driver = driver(&[CreateDeleteVolume], true);
    let claim = claim(json!({}));
    let class = class(json!({}));
    let zone = |z: &str| BTreeMap::from([("zone".to_string(), z.to_string())]);
    let caches = Caches {
        topology: PinnedTopology {
            selected: None,
            immediate_keys: vec!["zone".into()],
            node_labels: vec![zone("a"), zone("b")],
        },
        ..Caches::default()
    };
    let plan = provision(plan_of(&claim, &class, &driver, &caches));
    assert!(plan.topology_supported);
    let requisite: Vec<_> = plan
        .accessibility
        .expect("a requirement")
        .requisite
        .into_iter()
        .map(|t| t.segments["zone"].clone())
        .collect();
    assert_eq!(requisite, ["a", "b"]);

    let gate_off = Policy {
        topology: false,
        ..policy(&driver)
    };
    let inputs = inputs(&claim, &class);
    assert_eq!(
        provision(super::plan(&inputs, &gate_off, &caches)).accessibility,
        None
    );

    let no_csinode = Caches {
        topology: PinnedTopology {
            selected: Some(SelectedNode {
                name: "node-1".into(),
                keys: None,
                labels: zone("a"),
            }),
            ..PinnedTopology::default()
        },
        ..Caches::default()
    };
    let selected = Claim {
        selected_node: Some("node-1"),
        ..inputs
    };
    assert!(matches!(
        super::plan(&selected, &policy(&driver), &no_csinode),
        Ok(Decision::Reschedule { node }) if node == "node-1"
    ));

    // No node has the driver's keys: refused with upstream's wording.
    let no_nodes = Caches::default();
    let refusal = plan_of(&claim, &class, &driver, &no_nodes).expect_err("refused");
    assert_eq!(
        refusal.to_string(),
        "error generating accessibility requirements: no available topology found"
    );
}

#[test]
fn created_volumes_are_checked_against_the_request() {
    let volume = |bytes: i64, from_source: bool| csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            volume_id: "v".into(),
            capacity_bytes: bytes,
            content_source: from_source.then(|| request::volume_content("src".into())),
            ..csi::Volume::default()
        }),
    };
    let table = [
        ("0: unknown, the request", volume(0, false), false, Ok(100)),
        ("more than asked", volume(150, false), false, Ok(150)),
        (
            "less than asked",
            volume(99, false),
            false,
            Err(request::CreatedVolumeError::TooSmall {
                volume_id: "v".into(),
                returned: 99,
                requested: 100,
            }),
        ),
        (
            "a clone without its source",
            volume(100, false),
            true,
            Err(request::CreatedVolumeError::NoContentSource {
                volume_id: "v".into(),
            }),
        ),
        ("a clone with it", volume(100, true), true, Ok(100)),
        (
            "no volume at all",
            csi::CreateVolumeResponse { volume: None },
            false,
            Err(request::CreatedVolumeError::NoVolume),
        ),
    ];
    for (case, response, from_source, expected) in table {
        let got = request::created_volume(response, 100, from_source).map(|(_, bytes)| bytes);
        assert_eq!(got, expected, "{case}");
    }
    assert_eq!(
        request::CreatedVolumeError::NoVolume.abandoned_volume(),
        None
    );
    let too_small = request::CreatedVolumeError::NoContentSource {
        volume_id: "v".into(),
    };
    assert_eq!(too_small.abandoned_volume(), Some("v"));
}
