use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::DriverInfo;
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::*;
use crate::grants::ReferenceGrant;
use crate::protection::PROVISIONING_CLASS;
use crate::provision::tests::{DRIVER, policy};
use crate::topology::{PinnedTopology, SelectedNode};
use crate::vac::VacError;
use csi_kinds::annotations::{SELECTED_NODE, STORAGE_PROVISIONER};
use csi_kinds::vac::VolumeAttributesClass;

fn driver() -> DriverInfo {
    provision::tests::driver(&[ControllerCapability::CreateDeleteVolume], true)
}

fn zone(z: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("zone".to_string(), z.to_string())])
}

/// The caches a decision reads: every node in zone `a`; `csi_nodes` the nodes whose
/// CSINode has the driver's keys.
struct Caches {
    csi_nodes: Vec<&'static str>,
    nodes: bool,
    /// Class UID the claim was refused with as infeasible, and the wait left.
    infeasible: Option<(&'static str, Duration)>,
}

impl Default for Caches {
    fn default() -> Self {
        Caches {
            csi_nodes: vec!["node-1"],
            nodes: true,
            infeasible: None,
        }
    }
}

impl Lookups for Caches {
    fn claim(&self, _namespace: &str, _name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        None
    }
    fn volume(&self, _name: &str) -> Option<Arc<PersistentVolume>> {
        None
    }
    fn reference_grants(&self) -> Option<Vec<Arc<ReferenceGrant>>> {
        None
    }
    fn attributes_class(
        &self,
        _name: &str,
    ) -> Result<Option<Arc<VolumeAttributesClass>>, VacError> {
        Ok(None)
    }
    fn node_topology(&self, _uid: &str, selected_node: Option<&str>) -> PinnedTopology {
        if !self.nodes {
            return PinnedTopology::default();
        }
        PinnedTopology {
            selected: selected_node.map(|name| SelectedNode {
                name: name.to_string(),
                keys: self
                    .csi_nodes
                    .contains(&name)
                    .then(|| vec!["zone".to_string()]),
                labels: zone("a"),
            }),
            immediate_keys: vec!["zone".to_string()],
            node_labels: vec![zone("a")],
        }
    }
}

impl ClaimLookups for Caches {
    fn infeasible(&self, _uid: &str, class_uid: &str) -> Option<Duration> {
        self.infeasible
            .filter(|(refused_under, _)| *refused_under == class_uid)
            .map(|(_, wait)| wait)
    }
}

/// A pending claim of 1Gi annotated for our driver, class `fast`; `patch` is merged into
/// the object (`null` removes a field).
fn claim(patch: Value) -> PersistentVolumeClaim {
    let mut value = json!({
        "metadata": {"name": "data", "namespace": "apps", "uid": "uid-1",
            "annotations": {STORAGE_PROVISIONER: DRIVER}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}},
    });
    merge(&mut value, patch);
    serde_json::from_value(value).unwrap()
}

fn merge(into: &mut Value, patch: Value) {
    match (into, patch) {
        (Value::Object(into), Value::Object(patch)) => {
            for (key, field) in patch {
                if field.is_null() {
                    into.remove(&key);
                } else {
                    merge(into.entry(key).or_insert(Value::Null), field);
                }
            }
        }
        (into, patch) => *into = patch,
    }
}

/// Class `fast` (UID `class-1`) of our driver; `patch` merged in.
fn class(patch: Value) -> StorageClass {
    let mut value = json!({"metadata": {"name": "fast", "uid": "class-1"},
        "provisioner": DRIVER, "volumeBindingMode": "Immediate"});
    merge(&mut value, patch);
    serde_json::from_value(value).unwrap()
}

fn protected() -> Value {
    json!({"metadata": {"finalizers": [PROVISIONING_PROTECTION]}})
}

fn bound() -> Value {
    json!({"spec": {"volumeName": "pvc-uid-1"}})
}

fn deleting() -> Value {
    json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
}

fn selected(node: &str) -> Value {
    json!({"metadata": {"annotations": {SELECTED_NODE: node}}})
}

fn both(a: Value, b: Value) -> Value {
    let mut value = a;
    merge(&mut value, b);
    value
}

fn node(immediate_binding: bool) -> NodeDeployment {
    NodeDeployment {
        node_name: "node-1".to_string(),
        segments: zone("a"),
        immediate_binding,
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(60),
    }
}

/// One row: what the sync read and the step it leads to, in words.
struct Row {
    name: &'static str,
    claim: PersistentVolumeClaim,
    volume_name: Result<String, RequestError>,
    volume: Volume,
    class: Option<StorageClass>,
    /// The class of the claim's entry in the in-flight record.
    in_flight: Option<StorageClass>,
    node: Option<NodeDeployment>,
    caches: Caches,
    step: &'static str,
}

impl Row {
    /// An Immediate claim of class `fast`, nothing cached for it but its class.
    fn new(name: &'static str, claim: PersistentVolumeClaim, step: &'static str) -> Self {
        Row {
            name,
            claim,
            volume_name: Ok("pvc-uid-1".to_string()),
            volume: Volume::Absent,
            class: Some(class(json!({}))),
            in_flight: None,
            node: None,
            caches: Caches::default(),
            step,
        }
    }
}

fn describe(step: &ClaimStep) -> String {
    match step {
        ClaimStep::Nothing => "Nothing".to_string(),
        ClaimStep::Wait => "Wait".to_string(),
        ClaimStep::NoVolumeName { error, fatal } => format!("NoVolumeName fatal={fatal}: {error}"),
        ClaimStep::Finished { release } => format!("Finished release={release}"),
        ClaimStep::NoClass(error) => format!("NoClass: {error}"),
        ClaimStep::ForeignClass { provisioner } => format!("ForeignClass {provisioner}"),
        ClaimStep::BecomeOwner { class } => format!("BecomeOwner {}", class.name_any()),
        ClaimStep::Infeasible { wait } => format!("Infeasible {}s", wait.as_secs()),
        ClaimStep::Populator { kind } => format!("Populator {kind}"),
        ClaimStep::Reschedule { node } => format!("Reschedule {node}"),
        ClaimStep::Refused(refusal) => format!("Refused: {refusal}"),
        ClaimStep::Provision(p) => format!(
            "Provision {} class={} node={}",
            p.plan.name,
            p.class.uid().unwrap_or_else(|| "recorded".to_string()),
            p.selected_node.as_deref().unwrap_or("-"),
        ),
    }
}

#[test]
fn each_claim_state_leads_to_its_step() {
    let recorded = protection::record(&class(json!({}))).unwrap();
    let with_record = |record: &str| {
        both(
            protected(),
            json!({"metadata": {"annotations": {PROVISIONING_CLASS: record}}}),
        )
    };
    let wffc = || class(json!({"volumeBindingMode": "WaitForFirstConsumer"}));
    let rows = [
        Row::new(
            "a plain Immediate claim",
            claim(json!({})),
            "Provision pvc-uid-1 class=class-1 node=-",
        ),
        Row {
            in_flight: Some(class(json!({"metadata": {"uid": null}}))),
            ..Row::new(
                "deleted while in flight: finished, as with the finalizer",
                claim(deleting()),
                "Provision pvc-uid-1 class=class-1 node=-",
            )
        },
        Row {
            class: None,
            in_flight: Some(class(json!({"metadata": {"uid": null}}))),
            ..Row::new(
                "in flight, its class deleted: the entry's class",
                claim(json!({})),
                "Provision pvc-uid-1 class=recorded node=-",
            )
        },
        Row {
            volume: Volume::Cached,
            in_flight: Some(class(json!({}))),
            ..Row::new(
                "in flight, its PV cached: finished, no finalizer to remove",
                claim(json!({})),
                "Finished release=false",
            )
        },
        Row::new(
            "bound, unprotected",
            claim(bound()),
            "Finished release=false",
        ),
        Row::new(
            "bound, protected",
            claim(both(bound(), protected())),
            "Finished release=true",
        ),
        Row {
            volume: Volume::Cached,
            ..Row::new(
                "its PV cached before the claim is bound",
                claim(protected()),
                "Finished release=true",
            )
        },
        Row {
            volume: Volume::Lags,
            ..Row::new("our PV not cached yet", claim(protected()), "Wait")
        },
        Row {
            volume_name: Err(RequestError::EmptyPrefix),
            ..Row::new(
                "no prefix",
                claim(json!({})),
                "NoVolumeName fatal=false: volume name prefix cannot be empty",
            )
        },
        Row {
            volume_name: Err(RequestError::MissingUid),
            ..Row::new(
                "no UID",
                claim(json!({})),
                "NoVolumeName fatal=false: corrupted PVC object, it is missing UID",
            )
        },
        Row {
            volume_name: Err(RequestError::UuidLength {
                length: 40,
                available: 32,
            }),
            ..Row::new(
                "a UUID length past the UID, even bound",
                claim(bound()),
                "NoVolumeName fatal=true: --volume-name-uuid-length 40: no claim UID has that \
                 many characters (runtime error: slice bounds out of range [:40] with length 32)",
            )
        },
        Row::new(
            "deleted before any CreateVolume",
            claim(deleting()),
            "Nothing",
        ),
        Row::new(
            "deleted while protected",
            claim(both(deleting(), with_record(&recorded))),
            "Provision pvc-uid-1 class=class-1 node=-",
        ),
        Row {
            class: None,
            ..Row::new(
                "protected, its class deleted: the record",
                claim(with_record(&recorded)),
                "Provision pvc-uid-1 class=recorded node=-",
            )
        },
        Row {
            class: None,
            ..Row::new(
                "protected, its class deleted, the record broken",
                claim(with_record("{")),
                "NoClass: storageclass.storage.k8s.io \"fast\" not found",
            )
        },
        Row {
            class: None,
            ..Row::new(
                "the class not cached",
                claim(json!({})),
                "NoClass: storageclass.storage.k8s.io \"fast\" not found",
            )
        },
        Row::new(
            "not annotated for us",
            claim(json!({"metadata": {"annotations": {STORAGE_PROVISIONER: "other"}}})),
            "Nothing",
        ),
        Row {
            volume: Volume::Cached,
            ..Row::new(
                "another driver's, protected, its PV cached",
                claim(both(
                    protected(),
                    json!({"metadata": {"annotations": {STORAGE_PROVISIONER: "other"}}}),
                )),
                "Nothing",
            )
        },
        Row::new(
            "another driver's, bound and protected",
            claim(both(
                both(bound(), protected()),
                json!({"metadata": {"annotations": {STORAGE_PROVISIONER: "other"}}}),
            )),
            "Nothing",
        ),
        Row {
            class: Some(wffc()),
            ..Row::new(
                "WaitForFirstConsumer without a node",
                claim(json!({})),
                "Nothing",
            )
        },
        Row {
            class: Some(wffc()),
            ..Row::new(
                "WaitForFirstConsumer with a node",
                claim(selected("node-1")),
                "Provision pvc-uid-1 class=class-1 node=node-1",
            )
        },
        Row {
            class: Some(class(json!({"provisioner": "other.example.com"}))),
            ..Row::new(
                "a class of another provisioner",
                claim(json!({})),
                "ForeignClass other.example.com",
            )
        },
        Row {
            node: Some(node(false)),
            ..Row::new(
                "a node's instance, its node selected",
                claim(selected("node-1")),
                "Provision pvc-uid-1 class=class-1 node=node-1",
            )
        },
        Row {
            node: Some(node(false)),
            ..Row::new(
                "a node's instance, another node selected",
                claim(selected("node-2")),
                "Nothing",
            )
        },
        Row {
            node: Some(node(true)),
            ..Row::new(
                "a node's instance, an Immediate claim",
                claim(json!({})),
                "BecomeOwner fast",
            )
        },
        Row {
            node: Some(node(true)),
            class: Some(class(
                json!({"allowedTopologies": [{"matchLabelExpressions":
                [{"key": "zone", "values": ["b"]}]}]}),
            )),
            ..Row::new(
                "a node's instance, an Immediate claim it may not serve",
                claim(json!({})),
                "Nothing",
            )
        },
        Row {
            caches: Caches {
                infeasible: Some(("class-1", Duration::from_secs(120))),
                ..Caches::default()
            },
            ..Row::new(
                "refused as infeasible with this class",
                claim(json!({})),
                "Infeasible 120s",
            )
        },
        Row {
            caches: Caches {
                infeasible: Some(("class-0", Duration::from_secs(120))),
                ..Caches::default()
            },
            ..Row::new(
                "refused as infeasible with a class since recreated",
                claim(json!({})),
                "Provision pvc-uid-1 class=class-1 node=-",
            )
        },
        Row {
            caches: Caches {
                infeasible: Some(("class-1", Duration::from_secs(120))),
                nodes: false,
                ..Caches::default()
            },
            ..Row::new(
                "the infeasible wait before a refusal",
                claim(json!({})),
                "Infeasible 120s",
            )
        },
        Row::new(
            "a populator's data source",
            claim(json!({"spec": {"dataSourceRef":
                {"apiGroup": "populators.example.com", "kind": "Hello", "name": "h"}}})),
            "Populator Hello",
        ),
        Row::new(
            "a selected node without its CSINode",
            claim(selected("node-9")),
            "Reschedule node-9",
        ),
        Row::new(
            "a selector",
            claim(json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}})),
            "Refused: claim Selector is not supported",
        ),
        Row {
            caches: Caches {
                nodes: false,
                ..Caches::default()
            },
            ..Row::new(
                "no node with the driver's keys",
                claim(json!({})),
                "Refused: error generating accessibility requirements: no available topology found",
            )
        },
    ];
    let driver = driver();
    let mut mismatches = Vec::new();
    for row in rows {
        let observed = Observed {
            in_flight: row.in_flight.map(Arc::new),
            volume_name: row.volume_name,
            volume: row.volume,
            class: row.class.map(Arc::new),
            fallback_hash: 0,
        };
        let step = next_step(
            &row.claim,
            observed,
            &policy(&driver),
            row.node.as_ref(),
            &row.caches,
        );
        if describe(&step) != row.step {
            mismatches.push(format!("{}: {}", row.name, describe(&step)));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

/// The plan a provisioning carries is [`provision::plan`]'s for the claim and its volume name.
#[test]
fn a_provisioning_carries_the_plan_for_its_volume_name() {
    let driver = driver();
    let claim = claim(json!({}));
    let observed = Observed {
        in_flight: None,
        volume_name: Ok("pvc-uid-1".to_string()),
        volume: Volume::Absent,
        class: Some(Arc::new(class(json!({})))),
        fallback_hash: 0,
    };
    let ClaimStep::Provision(provisioning) =
        next_step(&claim, observed, &policy(&driver), None, &Caches::default())
    else {
        panic!("not provisioned");
    };
    let requisite: Vec<csi::Topology> = provisioning
        .plan
        .accessibility
        .expect("a requirement")
        .requisite;
    assert_eq!(requisite.len(), 1);
    assert_eq!(provisioning.plan.requested_bytes, 1 << 30);
}

/// CSI migration: the EBS driver's provisioner translates a claim's `kubernetes.io/aws-ebs`
/// class for CreateVolume and keeps the class itself for the PV; another plugin's class is
/// not its, and a class that cannot be translated is refused with upstream's words.
#[test]
fn migrated_classes_are_translated_for_create_volume() {
    let mut driver = driver();
    driver.name = "ebs.csi.aws.com".to_string();
    driver.plugin.volume_accessibility_constraints = false;
    let claim = claim(json!({"metadata": {"annotations": {
        STORAGE_PROVISIONER: "ebs.csi.aws.com", csi_kinds::migration::MIGRATED_TO: "ebs.csi.aws.com"}}}));
    let step = |class: StorageClass| {
        let observed = Observed {
            in_flight: None,
            volume_name: Ok("pvc-uid-1".to_string()),
            volume: Volume::Absent,
            class: Some(Arc::new(class)),
            fallback_hash: 0,
        };
        next_step(&claim, observed, &policy(&driver), None, &Caches::default())
    };
    let gp2 = class(json!({"provisioner": "kubernetes.io/aws-ebs",
        "parameters": {"type": "gp2", "fsType": "xfs", "encrypted": "true"}}));
    let ClaimStep::Provision(provisioning) = step(gp2) else {
        panic!("not provisioned");
    };
    assert_eq!(
        provisioning.plan.parameters,
        BTreeMap::from([
            ("encrypted".to_string(), "true".to_string()),
            ("type".to_string(), "gp2".to_string()),
        ])
    );
    assert_eq!(provisioning.plan.fs_type, "xfs");
    assert_eq!(provisioning.migration, Some(Plugin::AwsEbs));
    assert_eq!(provisioning.class.provisioner, "kubernetes.io/aws-ebs");
    let pd = class(json!({"provisioner": "kubernetes.io/gce-pd"}));
    assert_eq!(describe(&step(pd)), "ForeignClass kubernetes.io/gce-pd");
    let both = class(
        json!({"provisioner": "kubernetes.io/aws-ebs", "parameters": {"zone": "us-east-1a"},
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["us-east-1b"]}]}]}),
    );
    assert_eq!(
        describe(&step(both)),
        "Refused: failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
    );
    let own = class(json!({"provisioner": "ebs.csi.aws.com", "parameters": {"fsType": "xfs"}}));
    let ClaimStep::Provision(provisioning) = step(own) else {
        panic!("not provisioned");
    };
    assert_eq!(provisioning.migration, None);
    assert_eq!(
        provisioning.plan.parameters,
        BTreeMap::from([("fsType".to_string(), "xfs".to_string())])
    );
}
