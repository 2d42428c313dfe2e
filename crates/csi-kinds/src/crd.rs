//! CustomResourceDefinitions from Rust types, for the API groups the suite brings (snapshots,
//! COSI): the builder for "top-level" kinds whose fields sit beside `metadata` with no `spec`
//! (VolumeSnapshotClass, BucketClass, BucketAccessClass, as StorageClass), which kube's
//! `CustomResource` derive cannot express, and the YAML and file names committed under
//! `manifests/crds/`.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceValidation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The annotation a CRD of a protected group (`*.k8s.io`, `*.kubernetes.io`) needs, or the API
/// server refuses it.
pub const API_APPROVAL_ANNOTATION: &str = "api-approved.kubernetes.io";

/// A top-level kind's `apiVersion` and `kind`: as a `#[serde(flatten)]` field it writes `K`'s
/// on every serialization (the API server needs them to decode a custom resource) and ignores
/// them when reading.
pub struct TypeOf<K>(PhantomData<fn() -> K>);

impl<K> Default for TypeOf<K> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<K> Clone for TypeOf<K> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<K> PartialEq for TypeOf<K> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<K: k8s_openapi::Resource> fmt::Debug for TypeOf<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", K::API_VERSION, K::KIND)
    }
}

impl<K: k8s_openapi::Resource> Serialize for TypeOf<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("apiVersion", K::API_VERSION)?;
        map.serialize_entry("kind", K::KIND)?;
        map.end()
    }
}

impl<'de, K> Deserialize<'de> for TypeOf<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer)?;
        Ok(Self::default())
    }
}

/// A reference to another object in a custom resource: core/v1 ObjectReference's fields,
/// atomic as upstream's CRDs have it (VolumeSnapshotContent's snapshot, Bucket's claim).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ObjectReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// `k8s_openapi::Resource` and `Metadata` for a cluster-scoped top-level kind `$kind` (a
/// struct with a `metadata: ObjectMeta` field) of `$api_version`.
macro_rules! top_level_resource {
    ($kind:ident, $group:expr, $version:expr, $api_version:literal, $plural:literal) => {
        impl k8s_openapi::Resource for $kind {
            const API_VERSION: &'static str = $api_version;
            const GROUP: &'static str = $group;
            const KIND: &'static str = stringify!($kind);
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::ClusterResourceScope;
        }

        impl k8s_openapi::Metadata for $kind {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use top_level_resource;

/// The names and extras of a top-level kind's CRD.
#[derive(Clone, Debug)]
pub struct TopLevelKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub short_names: &'static [&'static str],
    /// "Cluster" or "Namespaced".
    pub scope: &'static str,
    /// The `api-approved.kubernetes.io` value.
    pub approval: &'static str,
    pub printer_columns: Vec<CustomResourceColumnDefinition>,
}

/// The CRD of a top-level kind `T` (its schema from `T`'s `JsonSchema`, with `apiVersion`,
/// `kind` and `metadata` added as kube's derive adds them), built like kube's derive builds the
/// others.
pub fn top_level_crd<T: JsonSchema>(kind: TopLevelKind) -> CustomResourceDefinition {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube_core::schema::StructuralSchemaRewriter)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).expect("a schema is JSON");
    if let Some(properties) = schema["properties"].as_object_mut() {
        properties.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
        properties.insert("kind".into(), serde_json::json!({"type": "string"}));
        properties.insert("metadata".into(), serde_json::json!({"type": "object"}));
    }
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("description");
    }
    let singular = kind.kind.to_lowercase();
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", kind.plural, kind.group)),
            annotations: Some(BTreeMap::from([(
                API_APPROVAL_ANNOTATION.to_string(),
                kind.approval.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: kind.group.into(),
            names: CustomResourceDefinitionNames {
                kind: kind.kind.into(),
                plural: kind.plural.into(),
                singular: Some(singular),
                short_names: (!kind.short_names.is_empty())
                    .then(|| kind.short_names.iter().map(|s| (*s).to_string()).collect()),
                list_kind: Some(format!("{}List", kind.kind)),
                ..CustomResourceDefinitionNames::default()
            },
            scope: kind.scope.into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: kind.version.into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(
                        serde_json::from_value(schema).expect("a valid JSONSchemaProps"),
                    ),
                }),
                additional_printer_columns: (!kind.printer_columns.is_empty())
                    .then_some(kind.printer_columns),
                ..CustomResourceDefinitionVersion::default()
            }],
            ..CustomResourceDefinitionSpec::default()
        },
        status: None,
    }
}

/// A CRD as the YAML committed under `manifests/crds/`, headed by the command that writes it
/// and, when it has CEL rules, by how a server before 1.25 takes it.
pub fn crd_yaml(crd: &CustomResourceDefinition, command: &str) -> String {
    let body = serde_norway::to_string(crd).expect("a CRD serializes");
    let before_cel = if body.contains("x-kubernetes-validations:") {
        "# Its CEL rules (x-kubernetes-validations) need Kubernetes 1.25: older API servers drop\n\
         # them, and kubectl there needs --validate=false (its check refuses the unknown field).\n"
    } else {
        ""
    };
    format!("# Generated by `{command}`; do not edit.\n{before_cel}---\n{body}")
}

/// The file name under `manifests/crds/` (upstream's: `<group>_<plural>.yaml`).
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A generator binary's whole job: writes `crds` into the directory its first argument names
/// (default `manifests/crds`).
pub fn write_crds_into_argument_dir(
    crds: &[CustomResourceDefinition],
    command: &str,
) -> Result<(), String> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "manifests/crds".to_string());
    write_crds(std::path::Path::new(&dir), crds, command)
        .map_err(|error| format!("writing the CRDs into {dir}: {error}"))
}

/// Writes `crds` into `dir`, one file each.
pub fn write_crds(
    dir: &std::path::Path,
    crds: &[CustomResourceDefinition],
    command: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for crd in crds {
        let path = dir.join(crd_file_name(crd));
        std::fs::write(&path, crd_yaml(crd, command))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The files of `crds` under each of `dirs` (relative to `root`) that differ from what the
/// types generate: a test asserts this is empty, so committed CRDs stay current.
pub fn stale_crds(
    root: &std::path::Path,
    dirs: &[&str],
    crds: &[CustomResourceDefinition],
    command: &str,
) -> Vec<String> {
    let mut stale = Vec::new();
    for dir in dirs {
        for crd in crds {
            let path = root.join(dir).join(crd_file_name(crd));
            if std::fs::read_to_string(&path).ok() != Some(crd_yaml(crd, command)) {
                stale.push(path.display().to_string());
            }
        }
    }
    stale
}

/// Asserts the committed YAML of `crds` under `manifests/crds` and the chart's `chart_dir` is
/// what the types generate (`make crds` rewrites both).
#[cfg(test)]
pub(crate) fn assert_committed(chart_dir: &str, crds: &[CustomResourceDefinition], command: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let stale = stale_crds(&root, &["manifests/crds", chart_dir], crds, command);
    assert!(
        stale.is_empty(),
        "stale: {stale:?}: run `make crds` and commit them"
    );
}

/// A CEL rule where a schema has it: the path of its node (`.spec.source`; `[]` for a list's
/// items, `{}` for a map's values), its rule and its message.
#[cfg(test)]
pub(crate) type RuleAt<'a> = (&'a str, &'a str, &'a str);

/// Asserts that every version of each of `crds` carries exactly the CEL rules `expected` gives
/// for the CRD's plural and the version's name, in any order.
#[cfg(test)]
pub(crate) fn assert_rules<'a>(
    crds: &[CustomResourceDefinition],
    expected: impl Fn(&str, &str) -> Vec<RuleAt<'a>>,
) {
    fn walk(schema: &serde_json::Value, path: &str, found: &mut Vec<(String, String, String)>) {
        let text = |rule: &serde_json::Value, key: &str| {
            rule[key].as_str().unwrap_or_default().to_string()
        };
        for rule in schema["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            found.push((path.to_string(), text(rule, "rule"), text(rule, "message")));
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            walk(property, &format!("{path}.{name}"), found);
        }
        if schema["items"].is_object() {
            walk(&schema["items"], &format!("{path}[]"), found);
        }
        if schema["additionalProperties"].is_object() {
            walk(
                &schema["additionalProperties"],
                &format!("{path}{{}}"),
                found,
            );
        }
    }
    for crd in crds {
        let plural = crd.spec.names.plural.as_str();
        for version in &crd.spec.versions {
            let mut wanted: Vec<_> = expected(plural, &version.name)
                .into_iter()
                .map(|(node, rule, message)| (node.into(), rule.into(), message.into()))
                .collect();
            wanted.sort();
            let schema = serde_json::to_value(&version.schema).expect("a schema is JSON");
            let mut found = Vec::new();
            walk(&schema["openAPIV3Schema"], "", &mut found);
            found.sort();
            assert_eq!(found, wanted, "{plural} {}", version.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Widget {
        #[serde(flatten)]
        types: TypeOf<Widget>,
        metadata: ObjectMeta,
        driver_name: String,
    }

    impl k8s_openapi::Resource for Widget {
        const API_VERSION: &'static str = "example.k8s.io/v1";
        const GROUP: &'static str = "example.k8s.io";
        const KIND: &'static str = "Widget";
        const VERSION: &'static str = "v1";
        const URL_PATH_SEGMENT: &'static str = "widgets";
        type Scope = k8s_openapi::ClusterResourceScope;
    }

    #[test]
    fn a_top_level_kind_writes_its_type_and_reads_without_it() {
        let widget = Widget {
            driver_name: "d".into(),
            ..Widget::default()
        };
        let json = serde_json::to_value(&widget).unwrap();
        assert_eq!(json["apiVersion"], "example.k8s.io/v1");
        assert_eq!(json["kind"], "Widget");
        assert_eq!(json["driverName"], "d");
        let read: Widget = serde_json::from_value(json).unwrap();
        assert_eq!(read, widget);
        let bare: Widget =
            serde_json::from_value(serde_json::json!({"metadata": {}, "driverName": "d"})).unwrap();
        assert_eq!(bare, widget);
    }
}
