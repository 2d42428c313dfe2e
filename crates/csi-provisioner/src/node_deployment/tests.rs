use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::*;

const KEY: &str = "topology.hostpath.csi/node";

fn deployment() -> NodeDeployment {
    NodeDeployment {
        node_name: "node-a".to_string(),
        segments: [(KEY.to_string(), "node-a".to_string())].into(),
        immediate_binding: true,
        base_delay: Duration::from_secs(20),
        max_delay: Duration::from_secs(60),
    }
}

fn class(mode: &str, allowed: Option<&str>) -> StorageClass {
    let mut value =
        json!({"metadata": {"name": "sc"}, "provisioner": "d", "volumeBindingMode": mode});
    if let Some(node) = allowed {
        value["allowedTopologies"] =
            json!([{"matchLabelExpressions": [{"key": KEY, "values": [node]}]}]);
    }
    serde_json::from_value(value).unwrap()
}

#[test]
fn a_node_handles_its_own_claims_and_competes_for_immediate_ones() {
    let without_immediate = NodeDeployment {
        immediate_binding: false,
        ..deployment()
    };
    let cases = [
        (
            "selected: this node",
            deployment(),
            Some("node-a"),
            class("WaitForFirstConsumer", None),
            NodeCheck::Provision,
        ),
        (
            "selected: another node",
            deployment(),
            Some("node-b"),
            class("WaitForFirstConsumer", None),
            NodeCheck::Ignore,
        ),
        (
            "immediate, selected another node",
            deployment(),
            Some("node-b"),
            class("Immediate", None),
            NodeCheck::Ignore,
        ),
        (
            "immediate, selected this node",
            deployment(),
            Some("node-a"),
            class("Immediate", None),
            NodeCheck::Provision,
        ),
        (
            "immediate, unselected",
            deployment(),
            None,
            class("Immediate", None),
            NodeCheck::BecomeOwner,
        ),
        (
            "immediate, immediate binding off",
            without_immediate,
            None,
            class("Immediate", None),
            NodeCheck::Ignore,
        ),
        (
            "wait for first consumer, unselected",
            deployment(),
            None,
            class("WaitForFirstConsumer", None),
            NodeCheck::Ignore,
        ),
        (
            "immediate, allowed here",
            deployment(),
            None,
            class("Immediate", Some("node-a")),
            NodeCheck::BecomeOwner,
        ),
        (
            "immediate, allowed elsewhere",
            deployment(),
            None,
            class("Immediate", Some("node-b")),
            NodeCheck::Ignore,
        ),
    ];
    for (name, nd, selected, class, want) in cases {
        assert_eq!(nd.check(selected, &class, true, false), want, "{name}");
    }
    // Without topology support the allowed topologies cannot be judged, as upstream.
    let elsewhere = class("Immediate", Some("node-b"));
    assert_eq!(
        deployment().check(None, &elsewhere, false, false),
        NodeCheck::BecomeOwner
    );
}

fn volume(affinity: serde_json::Value) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": {"nodeAffinity": affinity}}))
        .unwrap()
}

#[test]
fn a_node_deletes_only_the_volumes_accessible_from_it() {
    let on = |node: &str, op: &str| {
        volume(json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": KEY, "operator": op, "values": [node]}]}]}}))
    };
    let nd = deployment();
    assert!(nd.created_here(&on("node-a", "In")));
    assert!(!nd.created_here(&on("node-b", "In")));
    assert!(nd.created_here(&on("node-b", "NotIn")));
    assert!(
        nd.created_here(&volume(json!(null))),
        "no affinity: every node's"
    );
    let by_name = volume(json!({"required": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}));
    assert!(
        !nd.created_here(&by_name),
        "fields never match, as upstream's label-only node"
    );
    let no_topology = NodeDeployment {
        segments: Default::default(),
        ..deployment()
    };
    assert!(no_topology.created_here(&on("node-b", "In")));
}

#[test]
fn owner_delays_grow_exponentially_up_to_the_max_less_a_jitter() {
    let backoff = OwnerBackoff::new(Duration::from_secs(20), Duration::from_secs(60));
    let delays: Vec<u64> = (0..4).map(|_| backoff.next("uid", 0.0).as_secs()).collect();
    assert_eq!(delays, [20, 40, 60, 60]);
    assert_eq!(backoff.next("other", 0.5), Duration::from_secs(10));
    assert_eq!(backoff.next("other", 0.99).as_millis(), 40_000 - 19_800);
    backoff.forget("uid");
    assert_eq!(backoff.next("uid", 0.999_999), Duration::from_micros(20));
}
