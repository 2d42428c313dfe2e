//! kube-controller-manager's ClusterRole aggregation controller
//! (pkg/controller/clusterroleaggregation): a ClusterRole with an `aggregationRule` gets, as its
//! `rules`, the rules of every other ClusterRole one of its selectors matches — those in name
//! order, each rule once. RBAC itself only ever reads `rules`, so until this role has run an
//! aggregated ClusterRole grants nothing, as on a real cluster.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

use super::scheduling::label_selector_matches;
use super::{Informers, RoleError, Timing, is_benign, merge_patch, run_with_caches};

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let caches = |informers: &mut Informers| informers.all::<ClusterRole>();
    run_with_caches(
        "clusterrole-aggregation",
        &client,
        &timing,
        shutdown,
        caches,
        |roles| pass(client.clone(), roles),
    )
    .await
}

async fn pass(client: Client, roles: Store<ClusterRole>) -> Result<(), RoleError> {
    let all: Vec<Arc<ClusterRole>> = roles.state();
    let api: Api<ClusterRole> = Api::all(client);
    for role in &all {
        let Some(rules) = aggregated_rules(role, &all) else {
            continue;
        };
        if rules == role.rules.clone().unwrap_or_default() {
            continue;
        }
        let name = role.metadata.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({"rules": rules});
        if let Err(error) = merge_patch(&api, name, patch).await
            && !is_benign(&error)
        {
            return Err(error.into());
        }
    }
    Ok(())
}

/// The rules `role` aggregates from `all`; `None` when it aggregates nothing.
pub fn aggregated_rules(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let selectors = role
        .aggregation_rule
        .as_ref()?
        .cluster_role_selectors
        .as_deref()
        .unwrap_or_default();
    let mut sources: Vec<&ClusterRole> = all
        .iter()
        .map(Arc::as_ref)
        .filter(|other| other.metadata.name != role.metadata.name)
        .collect();
    sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for selector in selectors {
        for source in &sources {
            let labels = source.metadata.labels.clone().unwrap_or_default();
            if !label_selector_matches(Some(selector), &labels) {
                continue;
            }
            for rule in source.rules.iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    Some(rules)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn role(value: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn rule(resource: &str) -> serde_json::Value {
        json!({"apiGroups": [""], "resources": [resource], "verbs": ["get"]})
    }

    #[test]
    fn rules_of_the_selected_roles_in_name_order_each_once() {
        let aggregate = role(json!({"metadata": {"name": "view"}, "aggregationRule": {
            "clusterRoleSelectors": [{"matchLabels": {"aggregate-to-view": "true"}},
                {"matchExpressions": [{"key": "extra", "operator": "Exists"}]}]}}));
        let all = vec![
            aggregate.clone(),
            role(
                json!({"metadata": {"name": "b", "labels": {"aggregate-to-view": "true"}},
                "rules": [rule("pods"), rule("secrets")]}),
            ),
            role(
                json!({"metadata": {"name": "a", "labels": {"aggregate-to-view": "true", "extra": ""}},
                "rules": [rule("configmaps"), rule("pods")]}),
            ),
            role(
                json!({"metadata": {"name": "c", "labels": {"aggregate-to-edit": "true"}},
                "rules": [rule("nodes")]}),
            ),
        ];
        let expected: Vec<PolicyRule> = [rule("configmaps"), rule("pods"), rule("secrets")]
            .into_iter()
            .map(|r| serde_json::from_value(r).unwrap())
            .collect();
        assert_eq!(aggregated_rules(&aggregate, &all), Some(expected));
        assert_eq!(aggregated_rules(&all[1], &all), None, "no aggregationRule");
        let nothing = role(json!({"metadata": {"name": "none"}, "aggregationRule": {
            "clusterRoleSelectors": [{"matchLabels": {"missing": "x"}}]}}));
        assert_eq!(aggregated_rules(&nothing, &all), Some(Vec::new()));
    }
}
