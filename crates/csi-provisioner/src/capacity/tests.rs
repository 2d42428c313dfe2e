use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use super::*;

const DRIVER: &str = "hostpath.csi-suite.io";
const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "topology.hostpath.csi/node";

fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn csi_node(name: &str, keys: &[&str]) -> CSINode {
    from(json!({"metadata": {"name": name}, "spec": {"drivers": [
        {"name": DRIVER, "nodeID": name, "topologyKeys": keys},
        {"name": "other", "nodeID": name, "topologyKeys": ["other/key"]}]}}))
}

fn node(name: &str, labels: Value) -> Node {
    from(json!({"metadata": {"name": name, "labels": labels}}))
}

fn segment(pairs: &[(&str, &str)]) -> Segment {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn class(name: &str, binding: &str, provisioner: &str) -> StorageClass {
    from(
        json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": binding,
        "parameters": {"kind": "ssd", "csi.storage.k8s.io/fstype": "xfs",
            "csi.storage.k8s.io/provisioner-secret-name": "s"},
        "mountOptions": ["noatime"]}),
    )
}

fn item(class: &str, pairs: &[(&str, &str)]) -> Item {
    Item {
        class: class.to_string(),
        segment: segment(pairs),
    }
}

#[test]
fn segments_come_from_csinode_keys_and_node_labels() {
    let nodes = [
        node("a", json!({ZONE: "z1", HOST: "a"})),
        node("b", json!({ZONE: "z1", HOST: "b"})),
        node("c", json!({ZONE: "z2"})),
        node("d", json!({ZONE: "z2", HOST: "d"})),
    ];
    let by_name: HashMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let cases: Vec<(&str, Vec<CSINode>, Vec<Segment>)> = vec![
        (
            "one segment per distinct value set",
            vec![
                csi_node("a", &[ZONE]),
                csi_node("b", &[ZONE]),
                csi_node("d", &[ZONE]),
            ],
            vec![segment(&[(ZONE, "z1")]), segment(&[(ZONE, "z2")])],
        ),
        (
            "a node without one of the labels is left out",
            vec![csi_node("a", &[HOST, ZONE]), csi_node("c", &[HOST, ZONE])],
            vec![segment(&[(ZONE, "z1"), (HOST, "a")])],
        ),
        (
            "a driver without keys has the empty segment",
            vec![csi_node("a", &[]), csi_node("b", &[])],
            vec![Segment::new()],
        ),
        (
            "a CSINode without its Node is left out",
            vec![csi_node("x", &[ZONE])],
            vec![],
        ),
        ("no CSINode lists the driver", vec![], vec![]),
    ];
    for (name, csi_nodes, expected) in cases {
        let got: Vec<Segment> = segments(csi_nodes.iter(), &by_name, DRIVER)
            .into_iter()
            .collect();
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn items_are_segments_times_the_drivers_delayed_classes() {
    let segments: BTreeSet<Segment> = [segment(&[(ZONE, "z1")]), segment(&[(ZONE, "z2")])]
        .into_iter()
        .collect();
    let classes = [
        class("late", "WaitForFirstConsumer", DRIVER),
        class("now", "Immediate", DRIVER),
        class("theirs", "WaitForFirstConsumer", "other"),
    ];
    let delayed_only = items(&segments, classes.iter(), DRIVER, false);
    assert_eq!(
        delayed_only,
        [item("late", &[(ZONE, "z1")]), item("late", &[(ZONE, "z2")])]
            .into_iter()
            .collect()
    );
    let with_immediate = items(&segments, classes.iter(), DRIVER, true);
    assert_eq!(with_immediate.len(), 4, "{with_immediate:?}");
}

fn object(name: &str, class: &str, labels: Value, created: &str) -> CSIStorageCapacity {
    from(
        json!({"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "storageClassName": class, "nodeTopology": {"matchLabels": labels}, "capacity": "1Gi"}),
    )
}

#[test]
fn reconcile_keeps_one_object_per_wanted_item() {
    let wanted: BTreeSet<Item> = [item("late", &[(ZONE, "z1")]), item("late", &[(ZONE, "z2")])]
        .into_iter()
        .collect();
    let objects = [
        object(
            "newer-dup",
            "late",
            json!({ZONE: "z1"}),
            "2026-01-02T00:00:00Z",
        ),
        object("keep", "late", json!({ZONE: "z1"}), "2026-01-01T00:00:00Z"),
        object(
            "old-zone",
            "late",
            json!({ZONE: "z9"}),
            "2026-01-01T00:00:00Z",
        ),
        object(
            "old-class",
            "gone",
            json!({ZONE: "z2"}),
            "2026-01-01T00:00:00Z",
        ),
        from(
            json!({"metadata": {"name": "expressions", "namespace": "ns"}, "storageClassName": "late",
            "nodeTopology": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["z2"]}]}}),
        ),
    ];
    let found = reconcile(&wanted, &objects.iter().collect::<Vec<_>>());
    assert_eq!(
        found.existing,
        [(item("late", &[(ZONE, "z1")]), "keep".to_string())]
            .into_iter()
            .collect()
    );
    let mut obsolete = found.obsolete.clone();
    obsolete.sort();
    assert_eq!(
        obsolete,
        ["expressions", "newer-dup", "old-class", "old-zone"]
    );
}

fn volume(class: &str, terms: Value) -> PersistentVolume {
    from(
        json!({"metadata": {"name": "pv"}, "spec": {"storageClassName": class,
        "nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}}),
    )
}

#[test]
fn a_volume_affects_the_items_of_its_topology_else_its_class() {
    let wanted: BTreeSet<Item> = [
        item("late", &[(ZONE, "z1")]),
        item("late", &[(ZONE, "z2")]),
        item("other", &[(ZONE, "z1")]),
    ]
    .into_iter()
    .collect();
    let in_zone = |zone: &str| json!([{"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}]);
    let cases = [
        (
            "its segment",
            volume("late", in_zone("z2")),
            vec![item("late", &[(ZONE, "z2")])],
        ),
        (
            "no matching segment: the whole class",
            volume("late", in_zone("z7")),
            vec![item("late", &[(ZONE, "z1")]), item("late", &[(ZONE, "z2")])],
        ),
        (
            "no affinity: the whole class",
            from(json!({"metadata": {"name": "pv"}, "spec": {"storageClassName": "other"}})),
            vec![item("other", &[(ZONE, "z1")])],
        ),
    ];
    for (name, pv, expected) in cases {
        let got: Vec<Item> = affected_items(&wanted, &pv).into_iter().collect();
        assert_eq!(got, expected, "{name}");
    }
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".to_string(),
        kind: "Deployment".to_string(),
        name: "csi-provisioner".to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[test]
fn objects_are_built_and_updated_only_on_change() {
    let capacity = Capacity {
        available: 2 << 30,
        maximum_volume_size: Some(1 << 30),
    };
    let built = new_object(
        &item("late", &[(ZONE, "z1")]),
        "ns",
        DRIVER,
        MANAGED_BY,
        capacity,
        Some(&owner("o1")),
    );
    let value = serde_json::to_value(&built).unwrap();
    assert_eq!(value["metadata"]["generateName"], "csisc-");
    assert_eq!(value["metadata"]["labels"][DRIVER_NAME_LABEL], DRIVER);
    assert_eq!(
        value["metadata"]["labels"][MANAGED_BY_LABEL],
        "external-provisioner"
    );
    assert_eq!(value["nodeTopology"]["matchLabels"][ZONE], "z1");
    assert_eq!(value["capacity"], "2Gi");
    assert_eq!(value["maximumVolumeSize"], "1Gi");
    assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "o1");

    let mut existing = built.clone();
    existing.capacity = Some(Quantity("2147483648".to_string()));
    assert!(
        updated_object(&existing, capacity, Some(&owner("o1"))).is_none(),
        "the same capacity in another notation"
    );
    let smaller = Capacity {
        available: 1 << 30,
        ..capacity
    };
    let updated = updated_object(&existing, smaller, Some(&owner("o1"))).expect("an update");
    assert_eq!(updated.capacity, Some(Quantity("1Gi".to_string())));
    let mut ownerless = built.clone();
    ownerless.metadata.owner_references = None;
    let adopted = updated_object(&ownerless, capacity, Some(&owner("o1"))).expect("adopted");
    assert_eq!(adopted.metadata.owner_references.unwrap().len(), 1);
    assert!(
        updated_object(&built, capacity, None).is_none(),
        "an owner is never removed"
    );
}

#[test]
fn capacity_requests_carry_the_class_volumes() {
    let late = class("late", "WaitForFirstConsumer", DRIVER);
    let request = capacity_request(&item("late", &[(ZONE, "z1")]), &late, "ext4").unwrap();
    assert_eq!(
        request.parameters,
        [("kind".to_string(), "ssd".to_string())]
            .into_iter()
            .collect(),
        "reserved keys are not driver parameters"
    );
    let capability = &request.volume_capabilities[0];
    let Some(csi::volume_capability::AccessType::Mount(mount)) = &capability.access_type else {
        panic!("a mount capability: {capability:?}");
    };
    assert_eq!(mount.fs_type, "xfs");
    assert_eq!(mount.mount_flags, ["noatime"]);
    assert_eq!(
        request.accessible_topology.unwrap().segments,
        [(ZONE.to_string(), "z1".to_string())].into_iter().collect()
    );
    let everywhere = capacity_request(&item("late", &[]), &late, "").unwrap();
    assert!(
        everywhere.accessible_topology.is_none(),
        "the empty segment"
    );
}

/// Upstream's `TestGetNameWithMaxLength` cases for the base it uses (cmd/csi-provisioner).
#[test]
fn a_node_instance_labels_its_objects_with_its_node_within_63_characters() {
    let node = |a: usize| format!("node{}", "a".repeat(a));
    let cases = [
        (node(0), "external-provisioner-node".to_string()),
        (node(38), format!("external-provisioner-{}", node(38))),
        (node(39), format!("external-p-53f40b57-{}", node(39))),
        (node(48), format!("e-53f40b57-{}", node(48))),
        (node(49), "external-provisioner-a3607ff1".to_string()),
        (node(63), "external-provisioner-df38e37f".to_string()),
    ];
    for (node, want) in cases {
        assert_eq!(node_managed_by(&node), want, "{node}");
    }
}
