//! An identity of the scenario's own on a real cluster: a ServiceAccount in the scenario's
//! namespace, bound to a ClusterRole of exactly the rules the scenario gives, and a client
//! that authenticates with its token, as a component deployed under that account would.
//! kube-sim neither issues ServiceAccount tokens nor enforces RBAC: real clusters only.

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;

use crate::Cluster;
use crate::rbac::Rule;

/// Reports the named skip of `scenario` and returns true where it cannot run: on kube-sim,
/// which enforces no RBAC and issues no ServiceAccount tokens.
pub fn skip_without_service_accounts(scenario: &str) -> bool {
    let skip = !crate::real_cluster();
    if skip {
        crate::report_skip(
            scenario,
            "kube-sim enforces no RBAC and issues no ServiceAccount tokens (real cluster only)",
        );
    }
    skip
}

/// Whether the server refuses `client` a patch of claim `name` (403), as it must for a
/// scenario about upstream's RBAC, which grants claims `update` only, to test anything; a
/// server that allows it is reported as the named skip of `scenario`.
pub async fn claim_patch_refused(
    client: &Client,
    namespace: &str,
    name: &str,
    scenario: &str,
) -> bool {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::{Api, Patch, PatchParams};
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let probe = Patch::Merge(serde_json::json!({"metadata": {"labels": {"probe": "1"}}}));
    match claims.patch(name, &PatchParams::default(), &probe).await {
        Err(kube::Error::Api(status)) if status.code == 403 => true,
        Ok(_) => {
            crate::report_skip(scenario, "the server does not enforce RBAC");
            false
        }
        Err(error) => panic!("patching claim {name}: {error}"),
    }
}

impl Cluster {
    /// A client for `component` authenticated as the new ServiceAccount `account`, which may
    /// do what `rules` allow, cluster-wide (a ClusterRole and its binding, both named
    /// `<namespace>-<account>`), and nothing else. The account's token comes from a Secret
    /// of type `kubernetes.io/service-account-token` (filled in by kube-controller-manager,
    /// as on Kubernetes up to 1.23). The cleanup deletes all four objects.
    pub async fn service_account_client(
        &self,
        component: &str,
        account: &str,
        rules: &[Rule],
    ) -> Client {
        assert!(
            crate::real_cluster(),
            "kube-sim issues no ServiceAccount tokens"
        );
        let namespace = self.namespace.as_str();
        let role = format!("{namespace}-{account}");
        let token_secret = format!("{account}-token");
        self.delete_at_cleanup::<ServiceAccount>(Some(namespace), account);
        self.create(
            &self.namespaced::<ServiceAccount>(),
            serde_json::json!({"metadata": {"name": account}}),
        )
        .await;
        self.delete_at_cleanup::<Secret>(Some(namespace), &token_secret);
        self.create(
            &self.namespaced::<Secret>(),
            serde_json::json!({"metadata": {"name": token_secret, "annotations":
                {"kubernetes.io/service-account.name": account}},
                "type": "kubernetes.io/service-account-token"}),
        )
        .await;
        self.delete_at_cleanup::<ClusterRole>(None, &role);
        let rules: Vec<_> = rules.iter().map(Rule::to_json).collect();
        self.create(
            &self.cluster_scoped::<ClusterRole>(),
            serde_json::json!({"metadata": {"name": role}, "rules": rules}),
        )
        .await;
        self.delete_at_cleanup::<ClusterRoleBinding>(None, &role);
        self.create(
            &self.cluster_scoped::<ClusterRoleBinding>(),
            serde_json::json!({"metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account,
                    "namespace": namespace}]}),
        )
        .await;
        let secret = self
            .wait_for(
                &self.namespaced::<Secret>(),
                &token_secret,
                "the ServiceAccount's token issued",
                |secret| {
                    secret
                        .data
                        .as_ref()
                        .is_some_and(|d| d.contains_key("token"))
                },
            )
            .await;
        let token = secret.data.and_then(|mut d| d.remove("token")).map(|t| t.0);
        let token = String::from_utf8(token.unwrap_or_default()).expect("the token is text");
        self.component_client_with_token(component, &token)
    }
}
