//! Distributed snapshotting (upstream external-snapshotter's `--enable-distributed-snapshotting`
//! and `--node-deployment`): the snapshot-controller labels each new dynamic
//! VolumeSnapshotContent of a node-local volume with the volume's node, and a csi-snapshotter
//! deployed on each node, next to a node-local driver, watches only the contents labelled with
//! its own node (`NODE_NAME`). Pure: which node a volume is local to.

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::ResourceExt;

/// The label the snapshot-controller puts on a content of a node-local volume, valued with the
/// node's name (upstream `utils.VolumeSnapshotContentManagedByLabel`).
pub const MANAGED_BY_LABEL: &str = "snapshot.storage.kubernetes.io/managed-by";

/// The environment variable that names a `--node-deployment` csi-snapshotter's node.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// Where a new content's snapshot is cut, as the snapshot-controller decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `--enable-distributed-snapshotting` is off: no label.
    Central,
    /// The source volume has no node affinity: no label.
    NotNodeLocal,
    /// The node the volume's required node affinity selects: the content's label.
    Node(String),
    /// The volume has a node affinity no Node matches: no label (upstream logs an error and
    /// creates the content all the same).
    NoNode,
}

impl Placement {
    /// The [`MANAGED_BY_LABEL`] value of a content so placed.
    pub fn node(&self) -> Option<&str> {
        match self {
            Placement::Node(node) => Some(node),
            _ => None,
        }
    }
}

/// The node a volume is local to (upstream `getManagedByNode`): the Node that matches the PV's
/// required node affinity, with `MatchNodeSelectorTerms`' semantics (a node affinity without
/// `required` matches no node). `nodes` is `None` when distributed snapshotting is off. Of
/// several matching Nodes the first by name is taken, so every sync gives the same answer
/// (upstream takes the first its cache lists).
pub fn placement(volume: &PersistentVolume, nodes: Option<&[&Node]>) -> Placement {
    let Some(nodes) = nodes else {
        return Placement::Central;
    };
    let Some(affinity) = volume.spec.as_ref().and_then(|s| s.node_affinity.as_ref()) else {
        return Placement::NotNodeLocal;
    };
    let Some(required) = &affinity.required else {
        return Placement::NoNode;
    };
    nodes
        .iter()
        .filter(|node| csi_kinds::node_selector::matches(required, &node.name_any(), node.labels()))
        .map(|node| node.name_any())
        .min()
        .map_or(Placement::NoNode, Placement::Node)
}

/// The label selector of a `--node-deployment` csi-snapshotter's content watch.
pub fn node_selector(node: &str) -> String {
    format!("{MANAGED_BY_LABEL}={node}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn volume(affinity: Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv"},
            "spec": {"nodeAffinity": affinity,
                     "csi": {"driver": "d", "volumeHandle": "v"}}}))
        .unwrap()
    }

    fn required(terms: Value) -> Value {
        json!({"required": {"nodeSelectorTerms": terms}})
    }

    fn on(key: &str, value: &str) -> Value {
        json!([{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}])
    }

    #[test]
    fn a_volume_is_placed_on_the_node_its_affinity_selects() {
        let nodes = [
            node("node-b", json!({"topology.d/node": "node-b", "zone": "z1"})),
            node("node-a", json!({"topology.d/node": "node-a", "zone": "z1"})),
            node("node-c", json!({"zone": "z2"})),
        ];
        let all: Vec<&Node> = nodes.iter().collect();
        let by_name = json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-c"]}]}]);
        let either = json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]}]);
        let cases: [(&str, Value, Option<&[&Node]>, Placement); 10] = [
            (
                "distributed snapshotting off",
                required(on("topology.d/node", "node-a")),
                None,
                Placement::Central,
            ),
            (
                "no node affinity",
                Value::Null,
                Some(&all),
                Placement::NotNodeLocal,
            ),
            (
                "a node affinity without required terms",
                json!({}),
                Some(&all),
                Placement::NoNode,
            ),
            (
                "the node's topology label",
                required(on("topology.d/node", "node-a")),
                Some(&all),
                Placement::Node("node-a".into()),
            ),
            (
                "the node's name as a field",
                required(by_name),
                Some(&all),
                Placement::Node("node-c".into()),
            ),
            (
                "terms are ORed",
                required(either),
                Some(&all),
                Placement::Node("node-c".into()),
            ),
            (
                "several nodes: the first by name",
                required(on("zone", "z1")),
                Some(&all),
                Placement::Node("node-a".into()),
            ),
            (
                "no node matches",
                required(on("topology.d/node", "node-gone")),
                Some(&all),
                Placement::NoNode,
            ),
            (
                "no nodes at all",
                required(on("topology.d/node", "node-a")),
                Some(&[]),
                Placement::NoNode,
            ),
            (
                "an empty term matches nothing",
                required(json!([{}])),
                Some(&all),
                Placement::NoNode,
            ),
        ];
        for (case, affinity, nodes, expected) in cases {
            assert_eq!(placement(&volume(affinity), nodes), expected, "{case}");
        }
    }

    #[test]
    fn the_label_and_selector_are_upstream_ones() {
        assert_eq!(
            node_selector("node-a"),
            "snapshot.storage.kubernetes.io/managed-by=node-a"
        );
        assert_eq!(Placement::Node("n".into()).node(), Some("n"));
        assert_eq!(Placement::NoNode.node(), None);
    }
}
