//! The resource types the server serves: the built-in ones the suite uses, plus those that
//! CustomResourceDefinitions add at run time.

use std::sync::{Arc, RwLock};

use serde_json::{Value, json};

/// One served resource (one group/version/plural).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: String,
    pub version: String,
    /// Plural name used in paths, e.g. `pods`.
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    /// Subresources served, e.g. `status`, `binding`.
    pub subresources: Vec<String>,
    pub short_names: Vec<String>,
    /// A custom resource version's `openAPIV3Schema`: its objects are pruned and validated
    /// against it (built-in resources have none here).
    pub schema: Option<Arc<Value>>,
    /// A review API: its objects are answered, never stored, and `create` is its only verb
    /// (TokenReview, SubjectAccessReview).
    pub create_only: bool,
}

impl ResourceType {
    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        subresources: &[&str],
        short_names: &[&str],
    ) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            subresources: subresources.iter().map(|s| (*s).to_string()).collect(),
            short_names: short_names.iter().map(|s| (*s).to_string()).collect(),
            schema: None,
            create_only: false,
        }
    }

    /// A review API of kube-apiserver (create only, nothing stored).
    fn review(group: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            create_only: true,
            ..Self::builtin(group, "v1", plural, kind, namespaced, &[], &[])
        }
    }

    /// `v1` for the core group, else `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The group whose storage holds the objects: events.k8s.io Events are core Events
    /// (pkg/registry/events/rest/storage_events.go serves them with the core event registry).
    pub fn storage_group(&self) -> &str {
        if self.group == "events.k8s.io" && self.plural == "events" {
            ""
        } else {
            &self.group
        }
    }

    /// Objects are stored once per group and plural, whatever the version.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.storage_group(), self.plural)
    }

    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    /// The APIResource entry of discovery.
    pub fn discovery(&self) -> Vec<Value> {
        if self.create_only {
            return vec![json!({
                "name": self.plural,
                "singularName": self.singular,
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["create"],
            })];
        }
        let verbs = json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ]);
        let mut entries = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
            "shortNames": self.short_names,
        })];
        for sub in &self.subresources {
            let (kind, verbs) = match sub.as_str() {
                "binding" => ("Binding", json!(["create"])),
                "eviction" => ("Eviction", json!(["create"])),
                "token" => ("TokenRequest", json!(["create"])),
                _ => (self.kind.as_str(), json!(["get", "patch", "update"])),
            };
            let mut entry = json!({
                "name": format!("{}/{sub}", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            // A subresource of another group says so (kube-apiserver lists serviceaccounts/token
            // with authentication.k8s.io/v1, the group of TokenRequest).
            if sub == "token" {
                entry["group"] = json!("authentication.k8s.io");
                entry["version"] = json!("v1");
            }
            entries.push(entry);
        }
        entries
    }
}

/// The resources every kube-sim serves from the start.
pub fn builtin() -> Vec<ResourceType> {
    let r = ResourceType::builtin;
    vec![
        r(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["status"],
            &["ns"],
        ),
        r("", "v1", "nodes", "Node", false, &["status"], &["no"]),
        r(
            "",
            "v1",
            "pods",
            "Pod",
            true,
            &["status", "binding", "eviction"],
            &["po"],
        ),
        r(
            "",
            "v1",
            "persistentvolumes",
            "PersistentVolume",
            false,
            &["status"],
            &["pv"],
        ),
        r(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            &["status"],
            &["pvc"],
        ),
        r("", "v1", "secrets", "Secret", true, &[], &[]),
        r("", "v1", "configmaps", "ConfigMap", true, &[], &["cm"]),
        r("", "v1", "events", "Event", true, &[], &["ev"]),
        r(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["token"],
            &["sa"],
        ),
        r(
            "storage.k8s.io",
            "v1",
            "storageclasses",
            "StorageClass",
            false,
            &[],
            &["sc"],
        ),
        r(
            "storage.k8s.io",
            "v1",
            "volumeattachments",
            "VolumeAttachment",
            false,
            &["status"],
            &[],
        ),
        r(
            "storage.k8s.io",
            "v1",
            "csinodes",
            "CSINode",
            false,
            &[],
            &[],
        ),
        r(
            "storage.k8s.io",
            "v1",
            "csidrivers",
            "CSIDriver",
            false,
            &[],
            &[],
        ),
        r(
            "storage.k8s.io",
            "v1",
            "csistoragecapacities",
            "CSIStorageCapacity",
            true,
            &[],
            &[],
        ),
        // GA in Kubernetes 1.34 (v1beta1 before): what csi-provisioner reads a claim's
        // mutable parameters from.
        r(
            "storage.k8s.io",
            "v1",
            "volumeattributesclasses",
            "VolumeAttributesClass",
            false,
            &[],
            &["vac"],
        ),
        r(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            &[],
        ),
        r("events.k8s.io", "v1", "events", "Event", true, &[], &["ev"]),
        r(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
            &[],
        ),
        r(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            &[],
        ),
        r(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            &[],
        ),
        r(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            &[],
        ),
        ResourceType::review(
            "authentication.k8s.io",
            "tokenreviews",
            "TokenReview",
            false,
        ),
        ResourceType::review(
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            "LocalSubjectAccessReview",
            true,
        ),
        ResourceType::review(
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
            false,
        ),
        r(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["status"],
            &["crd", "crds"],
        ),
    ]
}

/// The served resources, growing as CRDs are created.
#[derive(Debug)]
pub struct Registry {
    types: RwLock<Vec<ResourceType>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            types: RwLock::new(builtin()),
        }
    }
}

impl Registry {
    pub fn all(&self) -> Vec<ResourceType> {
        self.types.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.types
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Serves the versions of a CustomResourceDefinition (an established CRD serves at once).
    pub fn add_crd(&self, crd: &Value) -> Vec<ResourceType> {
        let spec = &crd["spec"];
        let group = spec["group"].as_str().unwrap_or_default();
        let names = &spec["names"];
        let plural = names["plural"].as_str().unwrap_or_default();
        let kind = names["kind"].as_str().unwrap_or_default();
        let namespaced = spec["scope"].as_str() == Some("Namespaced");
        let mut added = Vec::new();
        for version in spec["versions"].as_array().into_iter().flatten() {
            if version["served"].as_bool() == Some(false) {
                continue;
            }
            let mut subresources = Vec::new();
            if version["subresources"]["status"].is_object() {
                subresources.push("status".to_string());
            }
            added.push(ResourceType {
                group: group.into(),
                version: version["name"].as_str().unwrap_or_default().into(),
                plural: plural.into(),
                singular: names["singular"]
                    .as_str()
                    .map_or_else(|| kind.to_lowercase(), str::to_string),
                kind: kind.into(),
                namespaced,
                subresources,
                short_names: names["shortNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect(),
                schema: version["schema"]["openAPIV3Schema"]
                    .is_object()
                    .then(|| Arc::new(version["schema"]["openAPIV3Schema"].clone())),
                create_only: false,
            });
        }
        let mut types = self.types.write().unwrap_or_else(|p| p.into_inner());
        types.retain(|t| !(t.group == group && t.plural == plural));
        types.extend(added.iter().cloned());
        added
    }

    /// Stops serving a CRD's resource.
    pub fn remove_crd(&self, crd: &Value) {
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
        self.types
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|t| !(t.group == group && t.plural == plural));
    }
}
