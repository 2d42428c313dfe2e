//! The chart's RBAC against what the components really call. Every scenario's components talk
//! to kube-sim with a client of their own (see `Cluster::component_client`), and when the
//! scenario stops, each request they sent must be allowed by the rules the chart grants that
//! component in `manifests/csi-suite-external-driver.yaml` (the committed rendering with every
//! optional rule on: secrets, capacity tracking, leader election).
//!
//! Matching follows kube-apiserver's RBAC authorizer (`plugin/pkg/auth/authorizer/rbac/rbac.go`,
//! `RuleAllows`): the verb, the API group and the resource (`plural/subresource` for a
//! subresource) must each equal an entry of one rule, or the rule lists `*`; a rule with
//! resourceNames is not counted (the counts carry no names). Role rules count in every
//! namespace: the scenarios' namespaces are not the release's.

use std::sync::OnceLock;

use kube_sim::apiserver::RequestCounts;
use serde_json::Value;

use crate::manifests::{documents, strings};

pub const PROVISIONER: &str = "csi-provisioner";
pub const ATTACHER: &str = "csi-attacher";
pub const RESIZER: &str = "csi-resizer";
pub const SNAPSHOTTER: &str = "csi-snapshotter";
pub const SNAPSHOT_CONTROLLER: &str = "snapshot-controller";
pub const HEALTH_MONITOR: &str = "csi-health-monitor";
pub const PODMON_CONTROLLER: &str = "podmon-controller";
pub const PODMON_NODE: &str = "podmon-node";
pub const INVENTORY: &str = "csi-inventory";
pub const COSI_CONTROLLER: &str = "cosi-controller";
pub const COSI_PROVISIONER: &str = "cosi-provisioner";

/// The roles the chart binds for each component (the release is named `csi-suite`).
const GRANTS: [(&str, &[&str]); 11] = [
    (
        PROVISIONER,
        &[
            "csi-suite-external-provisioner-runner",
            "csi-suite-external-provisioner-cfg",
            "csi-suite-leader-election",
        ],
    ),
    (
        ATTACHER,
        &[
            "csi-suite-external-attacher-runner",
            "csi-suite-leader-election",
        ],
    ),
    (
        RESIZER,
        &[
            "csi-suite-external-resizer-runner",
            "csi-suite-leader-election",
        ],
    ),
    (
        SNAPSHOTTER,
        &[
            "csi-suite-external-snapshotter-runner",
            "csi-suite-leader-election",
        ],
    ),
    (
        SNAPSHOT_CONTROLLER,
        &[
            "csi-suite-snapshot-controller-runner",
            "csi-suite-snapshot-controller-leader-election",
        ],
    ),
    (
        HEALTH_MONITOR,
        &[
            "csi-suite-external-health-monitor-controller-runner",
            "csi-suite-leader-election",
        ],
    ),
    (
        PODMON_CONTROLLER,
        &["csi-suite-podmon-controller", "csi-suite-leader-election"],
    ),
    (PODMON_NODE, &["csi-suite-podmon-node"]),
    (INVENTORY, &["csi-suite-inventory-runner"]),
    (
        COSI_CONTROLLER,
        &[
            "csi-suite-cosi-controller-runner",
            "csi-suite-cosi-controller-leader-election",
        ],
    ),
    (
        COSI_PROVISIONER,
        &[
            "csi-suite-cosi-driver-provisioner-runner",
            "csi-suite-cosi-driver-leader-election",
        ],
    ),
];

const MANIFEST: &str = include_str!("../../manifests/csi-suite-external-driver.yaml");

/// One rule of a ClusterRole or Role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Rule {
    fn allows(&self, verb: &str, group: &str, resource: &str) -> bool {
        let matches =
            |entries: &[String], value: &str| entries.iter().any(|e| e == "*" || e == value);
        self.resource_names.is_empty()
            && matches(&self.verbs, verb)
            && matches(&self.api_groups, group)
            && matches(&self.resources, resource)
    }
}

impl Rule {
    /// The rules of a ClusterRole or Role object.
    pub fn of_role(role: &Value) -> Vec<Rule> {
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|rule| Rule {
                api_groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                verbs: strings(&rule["verbs"]),
                resource_names: strings(&rule["resourceNames"]),
            })
            .collect()
    }

    /// The rule as a (Cluster)Role's `rules` entry.
    pub fn to_json(&self) -> Value {
        let mut rule = serde_json::json!({"apiGroups": self.api_groups,
            "resources": self.resources, "verbs": self.verbs});
        if !self.resource_names.is_empty() {
            rule["resourceNames"] = serde_json::json!(self.resource_names);
        }
        rule
    }
}

/// The rules of the (Cluster)Roles named `roles` in a multi-document manifest.
pub fn rules_of(manifest: &str, roles: &[&str]) -> Vec<Rule> {
    documents(manifest)
        .iter()
        .filter(|object| {
            matches!(object["kind"].as_str(), Some("ClusterRole" | "Role"))
                && roles.contains(&object["metadata"]["name"].as_str().unwrap_or_default())
        })
        .flat_map(Rule::of_role)
        .collect()
}

/// Whether any of `rules` allows `verb` on `group`/`resource`.
pub fn allows(rules: &[Rule], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|rule| rule.allows(verb, group, resource))
}

/// `rules` less `verb` on `group`/`resource`, everything else they allow kept (a rule that
/// allows it is split: the other groups, the other resources, the other verbs).
pub fn without(rules: &[Rule], verb: &str, group: &str, resource: &str) -> Vec<Rule> {
    let others = |entries: &[String], value: &str| -> Vec<String> {
        assert!(
            !entries.iter().any(|e| e == "*"),
            "a wildcard cannot be narrowed to leave out {verb} {group}/{resource}"
        );
        entries.iter().filter(|e| *e != value).cloned().collect()
    };
    let only = |value: &str| vec![value.to_string()];
    rules
        .iter()
        .flat_map(|rule| {
            if !rule.allows(verb, group, resource) {
                return vec![rule.clone()];
            }
            vec![
                Rule {
                    api_groups: others(&rule.api_groups, group),
                    ..rule.clone()
                },
                Rule {
                    api_groups: only(group),
                    resources: others(&rule.resources, resource),
                    ..rule.clone()
                },
                Rule {
                    api_groups: only(group),
                    resources: only(resource),
                    verbs: others(&rule.verbs, verb),
                    resource_names: rule.resource_names.clone(),
                },
            ]
            .into_iter()
            .filter(|rule| {
                !(rule.api_groups.is_empty() || rule.resources.is_empty() || rule.verbs.is_empty())
            })
            .collect()
        })
        .collect()
}

/// The rules the chart grants `component` (one of the names above), its Roles' included.
pub fn granted(component: &str) -> &'static [Rule] {
    grants()
        .iter()
        .find(|(c, _)| *c == component)
        .map(|(_, rules)| rules.as_slice())
        .unwrap_or_else(|| panic!("the chart grants {component} nothing"))
}

fn grants() -> &'static [(&'static str, Vec<Rule>)] {
    static GRANTED: OnceLock<Vec<(&'static str, Vec<Rule>)>> = OnceLock::new();
    GRANTED.get_or_init(|| {
        GRANTS
            .iter()
            .map(|(component, roles)| {
                let rules = rules_of(MANIFEST, roles);
                assert!(
                    !rules.is_empty(),
                    "no rules for {component} in the manifest"
                );
                (*component, rules)
            })
            .collect()
    })
}

/// The requests of our components that their rules do not allow, as
/// `component: verb group/resource (count)`.
pub fn denied(counts: &RequestCounts) -> Vec<String> {
    counts
        .iter()
        .filter_map(|(key, count)| {
            let (component, rules) = grants().iter().find(|(c, _)| *c == key.client)?;
            (!allows(rules, &key.verb, &key.group, &key.resource)).then(|| {
                format!(
                    "{component}: {} {}/{} ({count})",
                    key.verb, key.group, key.resource
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks whether `rules` allow each `(verb, group, resource)` as the case says.
    fn assert_allows(rules: &[Rule], cases: &[(&str, &str, &str, bool)]) {
        for (verb, group, resource, allowed) in cases {
            assert_eq!(
                allows(rules, verb, group, resource),
                *allowed,
                "{verb} {group}/{resource}"
            );
        }
    }

    #[test]
    fn rule_matching_follows_the_rbac_authorizer() {
        let rule = Rule {
            api_groups: vec!["storage.k8s.io".into()],
            resources: vec![
                "volumeattachments".into(),
                "volumeattachments/status".into(),
            ],
            verbs: vec!["patch".into()],
            resource_names: vec![],
        };
        let cases = [
            ("patch", "storage.k8s.io", "volumeattachments", true),
            ("patch", "storage.k8s.io", "volumeattachments/status", true),
            ("update", "storage.k8s.io", "volumeattachments", false),
            ("patch", "", "volumeattachments", false),
            ("patch", "storage.k8s.io", "csinodes", false),
        ];
        assert_allows(std::slice::from_ref(&rule), &cases);
        let wildcard = Rule {
            api_groups: vec!["*".into()],
            resources: vec!["*".into()],
            verbs: vec!["*".into()],
            resource_names: vec![],
        };
        assert!(allows(
            std::slice::from_ref(&wildcard),
            "delete",
            "apps",
            "deployments"
        ));
        let named = Rule {
            resource_names: vec!["one".into()],
            ..wildcard
        };
        assert!(!allows(&[named], "get", "", "secrets"));
    }

    #[test]
    fn without_leaves_out_one_verb_and_keeps_the_rest() {
        let rules = without(granted(ATTACHER), "list", "storage.k8s.io", "csinodes");
        assert!(!allows(&rules, "list", "storage.k8s.io", "csinodes"));
        assert!(allows(&rules, "watch", "storage.k8s.io", "csinodes"));
        assert!(allows(
            &rules,
            "list",
            "storage.k8s.io",
            "volumeattachments"
        ));
        assert!(allows(&rules, "patch", "", "persistentvolumes"));
        let shared = Rule {
            api_groups: vec!["".into(), "storage.k8s.io".into()],
            resources: vec!["csinodes".into(), "nodes".into()],
            verbs: vec!["list".into(), "watch".into()],
            resource_names: vec![],
        };
        let rules = without(&[shared], "list", "storage.k8s.io", "csinodes");
        let cases = [
            ("list", "storage.k8s.io", "csinodes", false),
            ("watch", "storage.k8s.io", "csinodes", true),
            ("list", "", "csinodes", true),
            ("list", "storage.k8s.io", "nodes", true),
            ("list", "", "nodes", true),
        ];
        assert_allows(&rules, &cases);
    }

    #[test]
    fn every_component_has_its_rules_in_the_committed_manifest() {
        for (component, rules) in grants() {
            assert!(!rules.is_empty(), "{component}");
        }
        let provisioner = &grants()[0].1;
        assert!(allows(provisioner, "create", "", "persistentvolumes"));
        assert!(allows(
            provisioner,
            "update",
            "coordination.k8s.io",
            "leases"
        ));
        assert!(!allows(provisioner, "list", "", "secrets"));
    }

    /// csi-resizer runs in no scenario yet, so no request count audits it: its calls (its
    /// informers, status and PV patches, Events, expansion secrets, its Lease) are listed here.
    #[test]
    fn the_resizer_is_granted_the_calls_it_makes_and_no_more() {
        let cases = [
            ("list", "", "persistentvolumeclaims", true),
            ("watch", "", "persistentvolumeclaims", true),
            ("patch", "", "persistentvolumeclaims/status", true),
            ("list", "", "persistentvolumes", true),
            ("watch", "", "persistentvolumes", true),
            ("patch", "", "persistentvolumes", true),
            ("list", "", "pods", true),
            ("watch", "", "pods", true),
            ("create", "", "events", true),
            ("patch", "", "events", true),
            ("get", "", "secrets", true),
            ("get", "coordination.k8s.io", "leases", true),
            ("create", "coordination.k8s.io", "leases", true),
            ("update", "coordination.k8s.io", "leases", true),
            ("patch", "", "persistentvolumeclaims", false),
            ("update", "", "persistentvolumeclaims/status", false),
            ("get", "", "persistentvolumes", false),
            ("update", "", "persistentvolumes", false),
            ("get", "", "pods", false),
            ("list", "", "secrets", false),
        ];
        assert_allows(granted(RESIZER), &cases);
    }

    /// The COSI components write only what their plans write: no update (every write is a
    /// patch), no Secret for the controller, Secrets listed by nobody.
    #[test]
    fn the_cosi_components_are_granted_patches_and_no_updates() {
        let group = "objectstorage.k8s.io";
        let controller = [
            ("create", group, "buckets", true),
            ("delete", group, "buckets", true),
            ("patch", group, "bucketclaims/status", true),
            ("update", group, "buckets", false),
            ("update", group, "bucketclaims", false),
            ("patch", group, "bucketaccesses", false),
            ("get", "", "secrets", false),
        ];
        assert_allows(granted(COSI_CONTROLLER), &controller);
        let provisioner = [
            ("patch", group, "buckets/status", true),
            ("patch", group, "bucketaccesses/status", true),
            ("delete", group, "bucketaccesses", true),
            ("create", "", "secrets", true),
            ("delete", "", "secrets", true),
            ("list", "", "secrets", false),
            ("create", group, "buckets", false),
            ("delete", group, "buckets", false),
            ("update", group, "buckets", false),
            ("patch", group, "bucketclaims", false),
        ];
        assert_allows(granted(COSI_PROVISIONER), &provisioner);
    }

    /// csi-inventory's report lists PVs, pods (their inline volumes) and VolumeSnapshotContents
    /// and calls nothing else; its import (an administrator's command) gets no grant.
    #[test]
    fn the_inventory_may_list_volumes_pods_and_contents_and_nothing_else() {
        let cases = [
            ("list", "", "persistentvolumes", true),
            ("list", "", "pods", true),
            ("watch", "", "pods", false),
            ("get", "", "pods", false),
            ("delete", "", "pods", false),
            (
                "list",
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents",
                true,
            ),
            ("watch", "", "persistentvolumes", false),
            ("get", "", "persistentvolumes", false),
            ("create", "", "persistentvolumes", false),
            ("get", "storage.k8s.io", "storageclasses", false),
            (
                "watch",
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents",
                false,
            ),
            ("list", "snapshot.storage.k8s.io", "volumesnapshots", false),
            ("get", "", "secrets", false),
            ("create", "", "events", false),
        ];
        assert_allows(granted(INVENTORY), &cases);
        assert_eq!(granted(INVENTORY).len(), 3, "{:?}", granted(INVENTORY));
    }
}
