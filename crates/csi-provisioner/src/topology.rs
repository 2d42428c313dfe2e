//! The accessibility requirements of CreateVolume: requisite and preferred topology, as
//! external-provisioner computes them (pkg/controller/topology.go `GenerateAccessibilityRequirements`).
//! Pure: the caller gathers the inputs (the selected node's CSINode keys and labels, the Nodes'
//! labels, the class's allowedTopologies) and pins them per claim, so retries send identical
//! requests.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::TopologySelectorTerm;

/// One topology term: segment key → value, ordered by key.
pub type Term = BTreeMap<String, String>;

/// Upstream's texts, with its Go `%v` of keys, labels and terms (`[k1 k2]`, `map[k:v]`,
/// `[{zone a}]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node has no CSINode (yet): the scheduler should pick again.
    #[error("failed to get selected CSINode {0}: csinode.storage.k8s.io \"{0}\" not found")]
    Reschedule(String),
    /// The selected node's CSINode has no keys of this driver (its node plugin is not
    /// registered there, yet): retried, as upstream, not rescheduled.
    #[error("no topology key found for node {0}")]
    NoKeys(String),
    #[error(
        "topology labels from selected node {} does not match topology keys from CSINode {}",
        go_map(labels),
        go_list(keys)
    )]
    MissingLabel {
        labels: BTreeMap<String, String>,
        keys: Vec<String>,
    },
    #[error(
        "selected node '\"{node}\"' topology '{}' is not in allowed topologies: {}",
        go_term(topology),
        go_terms(allowed)
    )]
    NotAllowed {
        node: String,
        topology: Term,
        allowed: Vec<Term>,
    },
    #[error("topologyKeys {} were not found on any nodes", go_list(.0))]
    KeysNotFound(Vec<String>),
    #[error("no available topology found")]
    NoAvailableTopology,
    #[error(
        "topology {} from selected node \"{node}\" is not in requisite: {}",
        go_term(topology),
        go_terms(requisite)
    )]
    NotInRequisite {
        node: String,
        topology: Term,
        requisite: Vec<Term>,
    },
}

/// Go's `%v` of a string slice: `[a b]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// Go's `%v` of a map (sorted by key): `map[a:1 b:2]`.
fn go_map(map: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", pairs.join(" "))
}

/// Go's `%v` of upstream's topologyTerm (segments sorted by key): `[{k1 v1} {k2 v2}]`.
fn go_term(term: &Term) -> String {
    let segments: Vec<String> = term.iter().map(|(k, v)| format!("{{{k} {v}}}")).collect();
    format!("[{}]", segments.join(" "))
}

fn go_terms(terms: &[Term]) -> String {
    let terms: Vec<String> = terms.iter().map(go_term).collect();
    format!("[{}]", terms.join(" "))
}

/// The node the scheduler selected (WaitForFirstConsumer).
#[derive(Debug, Clone)]
pub struct SelectedNode {
    pub name: String,
    /// This driver's topology keys from the node's CSINode; `None` when the CSINode is missing.
    pub keys: Option<Vec<String>>,
    pub labels: BTreeMap<String, String>,
}

/// The nodes' topology a claim's requests are computed from, gathered at its first attempt
/// and kept for its retries, so they send the same request.
#[derive(Debug, Clone, Default)]
pub struct PinnedTopology {
    pub selected: Option<SelectedNode>,
    /// The keys of one CSINode that has any for the driver.
    pub immediate_keys: Vec<String>,
    /// The labels of every Node.
    pub node_labels: Vec<BTreeMap<String, String>>,
}

/// Everything the requirements depend on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub selected_node: Option<&'a SelectedNode>,
    /// For immediate binding: the keys of one CSINode that has any for the driver (upstream
    /// takes a random one and caches it per claim).
    pub immediate_keys: &'a [String],
    /// The labels of every Node, for aggregation.
    pub node_labels: &'a [BTreeMap<String, String>],
    pub allowed_topologies: &'a [TopologySelectorTerm],
    /// `--strict-topology`.
    pub strict: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    pub claim_name: &'a str,
    /// Used instead of the claim-name hash when the name is empty (upstream: random).
    pub fallback_hash: u32,
}

/// Requisite and preferred terms, in the order they are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirements {
    pub requisite: Vec<Term>,
    pub preferred: Vec<Term>,
}

impl Requirements {
    /// As CSI's `TopologyRequirement` (empty terms skipped).
    pub fn to_csi(&self) -> csi::TopologyRequirement {
        let convert = |terms: &[Term]| -> Vec<csi::Topology> {
            terms
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| csi::Topology {
                    segments: t.clone().into_iter().collect(),
                })
                .collect()
        };
        csi::TopologyRequirement {
            requisite: convert(&self.requisite),
            preferred: convert(&self.preferred),
        }
    }
}

/// The requirements, or `None` when none are sent (immediate binding without
/// `--immediate-topology` and without allowedTopologies, or nothing left after flattening).
pub fn requirements(inputs: &Inputs<'_>) -> Result<Option<Requirements>, TopologyError> {
    let mut requisite = Vec::new();
    let mut selected_topology = None;
    if let Some(node) = inputs.selected_node {
        let keys = node
            .keys
            .as_ref()
            .ok_or_else(|| TopologyError::Reschedule(node.name.clone()))?;
        if keys.is_empty() {
            return Err(TopologyError::NoKeys(node.name.clone()));
        }
        let topology = term_of(keys, &node.labels)?;
        if inputs.strict {
            let allowed = flatten(inputs.allowed_topologies);
            if !allowed.is_empty() && !allowed.iter().any(|a| is_subset(a, &topology)) {
                return Err(TopologyError::NotAllowed {
                    node: node.name.clone(),
                    topology,
                    allowed,
                });
            }
            requisite.push(topology.clone());
        }
        selected_topology = Some((node, topology));
    }
    if requisite.is_empty() {
        if !inputs.allowed_topologies.is_empty() {
            // Node labels are not consulted here, as upstream.
            requisite = flatten(inputs.allowed_topologies);
        } else if selected_topology.is_none() && !inputs.immediate_topology {
            return Ok(None);
        } else {
            let keys: Vec<String> = match inputs.selected_node {
                Some(node) => node.keys.clone().unwrap_or_default(),
                None => inputs.immediate_keys.to_vec(),
            };
            if keys.is_empty() {
                return Err(TopologyError::NoAvailableTopology);
            }
            requisite = aggregate(&keys, inputs.node_labels);
            if requisite.is_empty() {
                return Err(TopologyError::KeysNotFound(keys));
            }
        }
    }
    requisite.retain(|t| !t.is_empty());
    if requisite.is_empty() {
        return Ok(None);
    }
    requisite.sort_by(compare_terms);
    requisite.dedup();
    let preferred = match selected_topology {
        None => {
            let shift = statefulset_shift(inputs.claim_name, inputs.fallback_hash);
            rotated(&requisite, shift as usize % requisite.len())
        }
        Some(_) if inputs.strict => requisite.clone(),
        Some((node, topology)) => {
            let start = requisite
                .iter()
                .position(|t| is_subset(t, &topology))
                .ok_or_else(|| TopologyError::NotInRequisite {
                    node: node.name.clone(),
                    topology: topology.clone(),
                    requisite: requisite.clone(),
                })?;
            rotated(&requisite, start)
        }
    };
    Ok(Some(Requirements {
        requisite,
        preferred,
    }))
}

/// The node's term for `keys`, from its labels.
fn term_of(keys: &[String], labels: &BTreeMap<String, String>) -> Result<Term, TopologyError> {
    keys.iter()
        .map(|key| {
            labels
                .get(key)
                .map(|value| (key.clone(), value.clone()))
                .ok_or_else(|| TopologyError::MissingLabel {
                    labels: labels.clone(),
                    keys: keys.to_vec(),
                })
        })
        .collect()
}

/// One term per Node that carries every key (whether the driver runs there is not checked,
/// as upstream).
fn aggregate(keys: &[String], node_labels: &[BTreeMap<String, String>]) -> Vec<Term> {
    node_labels
        .iter()
        .filter_map(|labels| {
            keys.iter()
                .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect::<Option<Term>>()
        })
        .collect()
}

/// allowedTopologies as terms: OR over terms, AND over expressions, OR over values — the
/// cartesian product of each term's value lists.
pub fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut flattened = Vec::new();
    for term in allowed {
        let mut products = vec![Term::new()];
        for expression in term.match_label_expressions.iter().flatten() {
            products = products
                .into_iter()
                .flat_map(|partial| {
                    expression.values.iter().map(move |value| {
                        let mut next = partial.clone();
                        next.insert(expression.key.clone(), value.clone());
                        next
                    })
                })
                .collect();
        }
        flattened.extend(products);
    }
    flattened
}

/// Every segment of `small` is in `large`.
fn is_subset(small: &Term, large: &Term) -> bool {
    small.iter().all(|(k, v)| large.get(k) == Some(v))
}

/// Fewer segments first, then segment by segment: key, then value.
fn compare_terms(a: &Term, b: &Term) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.iter().cmp(b.iter()))
}

fn rotated(terms: &[Term], start: usize) -> Vec<Term> {
    terms[start..]
        .iter()
        .chain(&terms[..start])
        .cloned()
        .collect()
}

/// StatefulSet spreading (in-tree `getPVCNameHashAndIndexOffset`): for `<claim>-<set>-<n>`
/// the FNV-1 hash of `<set>` plus `n`, so the claims of one pod land together and ordinals
/// spread over the terms.
pub fn statefulset_shift(claim_name: &str, fallback_hash: u32) -> u32 {
    if claim_name.is_empty() {
        return fallback_hash;
    }
    let (hashed, index) = match claim_name.rsplit_once('-') {
        Some((prefix, suffix)) => match suffix.parse::<u32>() {
            Ok(index) => (
                prefix.rsplit_once('-').map_or(prefix, |(_, set)| set),
                index,
            ),
            Err(_) => (claim_name, 0),
        },
        None => (claim_name, 0),
    };
    fnv1_32(hashed.as_bytes()).wrapping_add(index)
}

/// FNV-1 (multiply, then xor; not FNV-1a), 32 bits.
fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(*byte)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn term(pairs: &[(&str, &str)]) -> Term {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn allowed(value: serde_json::Value) -> Vec<TopologySelectorTerm> {
        serde_json::from_value(value).unwrap()
    }

    const ZONE: &str = "topology.example.com/zone";

    fn zones(names: &[&str]) -> Vec<BTreeMap<String, String>> {
        names.iter().map(|z| term(&[(ZONE, z)])).collect()
    }

    fn inputs<'a>(
        selected: Option<&'a SelectedNode>,
        keys: &'a [String],
        nodes: &'a [BTreeMap<String, String>],
        allowed: &'a [TopologySelectorTerm],
    ) -> Inputs<'a> {
        Inputs {
            selected_node: selected,
            immediate_keys: keys,
            node_labels: nodes,
            allowed_topologies: allowed,
            strict: false,
            immediate_topology: true,
            claim_name: "data",
            fallback_hash: 0,
        }
    }

    #[test]
    fn fnv1_matches_the_reference_values() {
        // Published FNV-1 32-bit test vectors.
        assert_eq!(fnv1_32(b""), 0x811c9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c5d7e);
        assert_eq!(fnv1_32(b"foobar"), 0x31f0b262);
    }

    #[test]
    fn statefulset_claims_of_one_set_hash_the_set_name() {
        let table = [
            ("www-web-0", fnv1_32(b"web")),
            ("www-web-2", fnv1_32(b"web").wrapping_add(2)),
            ("data-3", fnv1_32(b"data").wrapping_add(3)),
            ("plain", fnv1_32(b"plain")),
            ("claim-x", fnv1_32(b"claim-x")),
            ("", 77),
        ];
        for (name, expected) in table {
            assert_eq!(statefulset_shift(name, 77), expected, "{name}");
        }
    }

    #[test]
    fn allowed_topologies_flatten_to_the_cartesian_product() {
        let terms = allowed(json!([
            {"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}, {"key": "rack", "values": ["1", "2"]}]},
            {"matchLabelExpressions": [{"key": "zone", "values": ["c"]}]},
        ]));
        assert_eq!(
            flatten(&terms),
            vec![
                term(&[("zone", "a"), ("rack", "1")]),
                term(&[("zone", "a"), ("rack", "2")]),
                term(&[("zone", "b"), ("rack", "1")]),
                term(&[("zone", "b"), ("rack", "2")]),
                term(&[("zone", "c")]),
            ]
        );
    }

    #[test]
    fn immediate_binding_aggregates_sorts_dedupes_and_spreads() {
        let keys = vec![ZONE.to_string()];
        let nodes = zones(&["c", "a", "b", "a"]);
        let mut inputs = inputs(None, &keys, &nodes, &[]);
        inputs.claim_name = "www-web-1";
        let result = requirements(&inputs).unwrap().unwrap();
        assert_eq!(result.requisite, zones(&["a", "b", "c"]));
        let shift = statefulset_shift("www-web-1", 0) as usize % 3;
        assert_eq!(result.preferred, rotated(&result.requisite, shift));
        inputs.immediate_topology = false;
        assert_eq!(
            requirements(&inputs).unwrap(),
            None,
            "no requirements without --immediate-topology"
        );
        let no_keys: Vec<String> = Vec::new();
        inputs.immediate_topology = true;
        inputs.immediate_keys = &no_keys;
        assert_eq!(
            requirements(&inputs),
            Err(TopologyError::NoAvailableTopology)
        );
        let other = vec!["other".to_string()];
        inputs.immediate_keys = &other;
        assert_eq!(
            requirements(&inputs),
            Err(TopologyError::KeysNotFound(other.clone()))
        );
        assert_eq!(
            TopologyError::KeysNotFound(vec!["k1".into(), "k2".into()]).to_string(),
            "topologyKeys [k1 k2] were not found on any nodes"
        );
    }

    #[test]
    fn delayed_binding_rotates_to_the_selected_node() {
        let keys = vec![ZONE.to_string()];
        let nodes = zones(&["a", "b", "c"]);
        let selected = SelectedNode {
            name: "n2".into(),
            keys: Some(keys.clone()),
            labels: term(&[(ZONE, "b")]),
        };
        let result = requirements(&inputs(Some(&selected), &[], &nodes, &[]))
            .unwrap()
            .unwrap();
        assert_eq!(result.requisite, zones(&["a", "b", "c"]));
        assert_eq!(result.preferred, zones(&["b", "c", "a"]));

        let mut strict = inputs(Some(&selected), &[], &nodes, &[]);
        strict.strict = true;
        let result = requirements(&strict).unwrap().unwrap();
        assert_eq!(
            (result.requisite, result.preferred),
            (zones(&["b"]), zones(&["b"]))
        );

        let only_a = allowed(json!([{"matchLabelExpressions": [{"key": ZONE, "values": ["a"]}]}]));
        strict.allowed_topologies = &only_a;
        let refused = requirements(&strict).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "selected node '\"n2\"' topology '[{{{ZONE} b}}]' is not in allowed topologies: [[{{{ZONE} a}}]]"
            ),
            "Go's %q in quotes and %v of terms, as upstream"
        );
        let not_strict = inputs(Some(&selected), &[], &nodes, &only_a);
        assert_eq!(
            requirements(&not_strict).unwrap_err().to_string(),
            format!(
                "topology [{{{ZONE} b}}] from selected node \"n2\" is not in requisite: [[{{{ZONE} a}}]]"
            )
        );
    }

    #[test]
    fn selected_node_errors() {
        let nodes = zones(&["a"]);
        let missing_csinode = SelectedNode {
            name: "n1".into(),
            keys: None,
            labels: BTreeMap::new(),
        };
        let refused = requirements(&inputs(Some(&missing_csinode), &[], &nodes, &[]));
        assert_eq!(refused, Err(TopologyError::Reschedule("n1".into())));
        assert_eq!(
            refused.unwrap_err().to_string(),
            r#"failed to get selected CSINode n1: csinode.storage.k8s.io "n1" not found"#
        );
        let no_keys = SelectedNode {
            name: "n1".into(),
            keys: Some(vec![]),
            labels: BTreeMap::new(),
        };
        assert_eq!(
            requirements(&inputs(Some(&no_keys), &[], &nodes, &[])),
            Err(TopologyError::NoKeys("n1".into()))
        );
        let unlabelled = SelectedNode {
            name: "n1".into(),
            keys: Some(vec![ZONE.into(), "rack".into()]),
            labels: term(&[(ZONE, "a"), ("os", "linux")]),
        };
        assert_eq!(
            requirements(&inputs(Some(&unlabelled), &[], &nodes, &[]))
                .unwrap_err()
                .to_string(),
            format!(
                "topology labels from selected node map[os:linux {ZONE}:a] does not match topology keys from CSINode [{ZONE} rack]"
            )
        );
    }

    #[test]
    fn terms_sort_by_size_then_keys_then_values_and_convert_to_csi() {
        let mut terms = vec![
            term(&[("b", "1"), ("a", "2")]),
            term(&[("z", "0")]),
            term(&[("a", "1"), ("b", "9")]),
        ];
        terms.sort_by(compare_terms);
        assert_eq!(
            terms,
            vec![
                term(&[("z", "0")]),
                term(&[("a", "1"), ("b", "9")]),
                term(&[("a", "2"), ("b", "1")])
            ]
        );
        let requirement = Requirements {
            requisite: vec![term(&[("z", "0")]), Term::new()],
            preferred: vec![],
        }
        .to_csi();
        assert_eq!(requirement.requisite.len(), 1, "empty terms are skipped");
        assert_eq!(requirement.requisite[0].segments["z"], "0");
    }
}
