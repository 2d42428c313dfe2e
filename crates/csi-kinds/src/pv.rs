//! PersistentVolume rules shared by the provisioner and the inventory's import: a PV's node
//! affinity from the accessible topology a driver returned.

use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
};

/// The PV's node affinity: one term per accessible topology, each segment `key In [value]`.
/// Terms without segments are skipped; when nothing is left the PV gets no affinity at all
/// (upstream would write a `required` selector with no terms, which the API rejects).
pub fn node_affinity(accessible: &[csi::Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = accessible
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|topology| {
            let mut segments: Vec<(&String, &String)> = topology.segments.iter().collect();
            segments.sort();
            NodeSelectorTerm {
                match_expressions: Some(
                    segments
                        .into_iter()
                        .map(|(key, value)| NodeSelectorRequirement {
                            key: key.clone(),
                            operator: "In".to_string(),
                            values: Some(vec![value.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    (!terms.is_empty()).then_some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_affinity_from_accessible_topology() {
        let topology = |pairs: &[(&str, &str)]| csi::Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let affinity = node_affinity(&[
            topology(&[("zone", "a"), ("rack", "1")]),
            topology(&[]),
            topology(&[("zone", "b")]),
        ])
        .unwrap();
        let terms = affinity.required.unwrap().node_selector_terms;
        assert_eq!(terms.len(), 2, "empty terms are skipped");
        let first = terms[0].match_expressions.clone().unwrap();
        assert_eq!(
            first
                .iter()
                .map(|e| (
                    e.key.as_str(),
                    e.operator.as_str(),
                    e.values.clone().unwrap()
                ))
                .collect::<Vec<_>>(),
            [
                ("rack", "In", vec!["1".to_string()]),
                ("zone", "In", vec!["a".to_string()])
            ]
        );
        assert_eq!(
            node_affinity(&[topology(&[])]),
            None,
            "never an empty required selector"
        );
        assert_eq!(node_affinity(&[]), None);
    }
}
