//! objectstorage.k8s.io/v1alpha1: BucketClass, BucketClaim, Bucket, BucketAccessClass and
//! BucketAccess, with v1alpha1's field names, scopes, required fields and defaults, and the
//! CustomResourceDefinitions generated from these types ([`crds`]; `manifests/crds/` holds them
//! as YAML, written by the `cosi-crds` binary and checked fresh by a test).
//!
//! Protocols are plain strings in the schema, as upstream's: a claim may say `GCS` where the
//! constant is `GCP`, and [`Protocol`] reads both.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use crate::crd::{ObjectReference, TopLevelKind, TypeOf, top_level_crd};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const GROUP: &str = "objectstorage.k8s.io";
pub const VERSION: &str = "v1alpha1";
/// The `api-approved.kubernetes.io` annotation upstream's install adds to every COSI CRD (the
/// KEP), without which the API server refuses a CRD of a `*.k8s.io` group.
pub const API_APPROVAL: &str = "https://github.com/kubernetes/enhancements/tree/master/keps/sig-storage/1979-object-storage-support";
/// The command that writes `manifests/crds/objectstorage.k8s.io_*` (named in each file).
pub const CRDS_COMMAND: &str = "cargo run -p cosi --bin cosi-crds";

/// What happens to the bucket at the provider when its Bucket object goes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum DeletionPolicy {
    /// The bucket stays (v1alpha1's default).
    #[default]
    Retain,
    Delete,
}

/// A data protocol a bucket serves or an access is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    S3,
    Azure,
    /// Google Cloud Storage: written `GCP` (upstream's constant); `GCS` (its documentation's
    /// word) is read as the same.
    Gcp,
    /// Any other word, kept as written so the controller can name it in an Event.
    Other(String),
}

impl Protocol {
    pub fn as_str(&self) -> &str {
        match self {
            Self::S3 => "S3",
            Self::Azure => "Azure",
            Self::Gcp => "GCP",
            Self::Other(other) => other,
        }
    }
}

impl From<&str> for Protocol {
    fn from(word: &str) -> Self {
        match word {
            "S3" => Self::S3,
            "Azure" => Self::Azure,
            "GCP" | "GCS" => Self::Gcp,
            other => Self::Other(other.to_string()),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = Cow::<str>::deserialize(deserializer)?;
        Ok(Self::from(&*word))
    }
}

impl JsonSchema for Protocol {
    fn schema_name() -> Cow<'static, str> {
        "Protocol".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string"})
    }
}

/// How accesses authenticate to the provider.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum AuthenticationType {
    /// Access and secret keys, handed to the workload in the credentials Secret.
    Key,
    /// The workload's ServiceAccount, mapped to an identity by the provider.
    #[serde(rename = "IAM")]
    Iam,
}

/// How buckets of one driver are made: top-level fields, no spec (as StorageClass).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BucketClass {
    #[serde(flatten)]
    #[schemars(skip)]
    pub types: TypeOf<BucketClass>,
    #[schemars(skip)]
    pub metadata: ObjectMeta,
    pub driver_name: String,
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Opaque to COSI, passed to DriverCreateBucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// How accesses of one driver are granted: top-level fields, no spec.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BucketAccessClass {
    #[serde(flatten)]
    #[schemars(skip)]
    pub types: TypeOf<BucketAccessClass>,
    #[schemars(skip)]
    pub metadata: ObjectMeta,
    pub driver_name: String,
    pub authentication_type: AuthenticationType,
    /// Opaque to COSI, passed to DriverGrantBucketAccess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

macro_rules! top_level_resource {
    ($kind:ident, $plural:literal) => {
        crate::crd::top_level_resource!(
            $kind,
            GROUP,
            VERSION,
            "objectstorage.k8s.io/v1alpha1",
            $plural
        );

        impl $kind {
            /// Its CustomResourceDefinition, built like kube's derive builds the others.
            pub fn crd() -> CustomResourceDefinition {
                top_level_crd::<Self>(TopLevelKind {
                    group: GROUP,
                    version: VERSION,
                    kind: stringify!($kind),
                    plural: $plural,
                    short_names: &[],
                    scope: "Cluster",
                    approval: API_APPROVAL,
                    printer_columns: Vec::new(),
                })
            }

            /// The class's parameters (none is an empty map).
            pub fn parameters(&self) -> BTreeMap<String, String> {
                self.parameters.clone().unwrap_or_default()
            }
        }
    };
}

top_level_resource!(BucketClass, "bucketclasses");
top_level_resource!(BucketAccessClass, "bucketaccessclasses");

/// A user's request for a bucket: a new one of a class, or an existing Bucket to bind.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "objectstorage.k8s.io",
    version = "v1alpha1",
    kind = "BucketClaim",
    namespaced,
    status = "BucketClaimStatus",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes/enhancements/tree/master/keps/sig-storage/1979-object-storage-support"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BucketClaimSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_class_name: Option<String>,
    pub protocols: Vec<Protocol>,
    /// A Bucket made outside COSI's provisioning (brownfield) to bind instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_bucket_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = bucket_ready_required)]
pub struct BucketClaimStatus {
    #[serde(default)]
    pub bucket_ready: bool,
    /// The Bucket made (or bound) for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_name: Option<String>,
}

/// Upstream's schema requires `bucketReady` in a claim's status (written always, no default);
/// it is read leniently all the same.
fn bucket_ready_required(schema: &mut Schema) {
    if let Some(ready) = schema
        .get_mut("properties")
        .and_then(|properties| properties.get_mut("bucketReady"))
        .and_then(|ready| ready.as_object_mut())
    {
        ready.remove("default");
    }
    if let Some(object) = schema.as_object_mut()
        && let Some(required) = object
            .entry("required")
            .or_insert_with(|| serde_json::json!([]))
            .as_array_mut()
    {
        required.push("bucketReady".into());
    }
}

/// A bucket at the provider, cluster-wide, bound to one BucketClaim.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "objectstorage.k8s.io",
    version = "v1alpha1",
    kind = "Bucket",
    status = "BucketStatus",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes/enhancements/tree/master/keps/sig-storage/1979-object-storage-support"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BucketSpec {
    pub driver_name: String,
    pub bucket_class_name: String,
    /// The BucketClaim this Bucket was made for, or is to be bound to.
    pub bucket_claim: ObjectReference,
    pub protocols: Vec<Protocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// The bucket's identifier at the provider, for a bucket made outside COSI.
    #[serde(
        default,
        rename = "existingBucketID",
        skip_serializing_if = "Option::is_none"
    )]
    pub existing_bucket_id: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BucketStatus {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bucket_ready: bool,
    /// The bucket's identifier at the provider (DriverCreateBucket's bucket_id).
    #[serde(default, rename = "bucketID", skip_serializing_if = "Option::is_none")]
    pub bucket_id: Option<String>,
}

/// A workload's request for credentials to a claimed bucket, delivered in a Secret.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "objectstorage.k8s.io",
    version = "v1alpha1",
    kind = "BucketAccess",
    plural = "bucketaccesses",
    namespaced,
    status = "BucketAccessStatus",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes/enhancements/tree/master/keps/sig-storage/1979-object-storage-support"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BucketAccessSpec {
    pub bucket_claim_name: String,
    /// Empty: the bucket's protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    pub bucket_access_class_name: String,
    /// Filled with the credentials; an existing Secret of this name is left as it is.
    pub credentials_secret_name: String,
    /// With IAM authentication: the ServiceAccount mapped to the provider's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BucketAccessStatus {
    /// The account at the provider (DriverGrantBucketAccess's account_id), for the revoke.
    #[serde(default, rename = "accountID", skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    #[serde(default)]
    pub access_granted: bool,
}

/// The five CRDs, in the order they are installed (classes first).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        BucketClass::crd(),
        BucketAccessClass::crd(),
        BucketClaim::crd(),
        Bucket::crd(),
        BucketAccess::crd(),
    ]
}

#[cfg(test)]
mod tests {

    use super::*;

    /// The committed YAML (and the chart's copy) is what the types generate (`make crds`
    /// rewrites both).
    #[test]
    fn committed_crds_are_current() {
        crate::crd::assert_committed("charts/csi-suite/files/cosi-crds", &crds(), CRDS_COMMAND);
    }

    /// Names, scopes, the approval annotation and the required fields of v1alpha1.
    #[test]
    fn crds_carry_upstream_names_scopes_and_required_fields() {
        let crds = crds();
        let table: Vec<(String, String, String, String, Vec<String>)> = crds
            .iter()
            .map(|crd| {
                let schema = serde_json::to_value(
                    crd.spec.versions[0]
                        .schema
                        .as_ref()
                        .and_then(|s| s.open_api_v3_schema.as_ref()),
                )
                .unwrap();
                let required_at = |value: &serde_json::Value| -> Vec<String> {
                    value["required"]
                        .as_array()
                        .map(|r| r.iter().map(|f| f.as_str().unwrap().to_string()).collect())
                        .unwrap_or_default()
                };
                let mut required = required_at(&schema);
                for part in ["spec", "status"] {
                    required.extend(
                        required_at(&schema["properties"][part])
                            .into_iter()
                            .map(|f| format!("{part}.{f}")),
                    );
                }
                required.sort();
                (
                    crd.metadata.name.clone().unwrap(),
                    crd.spec.names.kind.clone(),
                    crd.spec.scope.clone(),
                    crd.metadata.annotations.clone().unwrap()["api-approved.kubernetes.io"].clone(),
                    required,
                )
            })
            .collect();
        let strings = |fields: &[&str]| fields.iter().map(|f| f.to_string()).collect::<Vec<_>>();
        let row = |name: &str, kind: &str, scope: &str, required: &[&str]| {
            (
                name.to_string(),
                kind.to_string(),
                scope.to_string(),
                API_APPROVAL.to_string(),
                strings(required),
            )
        };
        assert_eq!(
            table,
            vec![
                row(
                    "bucketclasses.objectstorage.k8s.io",
                    "BucketClass",
                    "Cluster",
                    &["driverName"]
                ),
                row(
                    "bucketaccessclasses.objectstorage.k8s.io",
                    "BucketAccessClass",
                    "Cluster",
                    &["authenticationType", "driverName"]
                ),
                row(
                    "bucketclaims.objectstorage.k8s.io",
                    "BucketClaim",
                    "Namespaced",
                    &["spec", "spec.protocols", "status.bucketReady"]
                ),
                row(
                    "buckets.objectstorage.k8s.io",
                    "Bucket",
                    "Cluster",
                    &[
                        "spec",
                        "spec.bucketClaim",
                        "spec.bucketClassName",
                        "spec.driverName",
                        "spec.protocols"
                    ]
                ),
                row(
                    "bucketaccesses.objectstorage.k8s.io",
                    "BucketAccess",
                    "Namespaced",
                    &[
                        "spec",
                        "spec.bucketAccessClassName",
                        "spec.bucketClaimName",
                        "spec.credentialsSecretName"
                    ]
                ),
            ]
        );
        let class = serde_json::to_value(&crds[0]).unwrap();
        assert_eq!(
            class["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["deletionPolicy"]
                ["default"],
            "Retain"
        );
    }

    /// Objects as upstream's tools write them read back unchanged; `GCS` reads as `GCP`.
    #[test]
    fn objects_read_as_upstream_writes_them() {
        let bucket: Bucket = serde_json::from_value(serde_json::json!({
            "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "Bucket",
            "metadata": {"name": "bucket-1234"},
            "spec": {"driverName": "s3.example.com", "bucketClassName": "fast",
                     "bucketClaim": {"name": "data", "namespace": "app", "uid": "1234"},
                     "protocols": ["S3", "GCS"], "deletionPolicy": "Delete",
                     "existingBucketID": "b-1"},
            "status": {"bucketReady": true, "bucketID": "b-1"}
        }))
        .unwrap();
        assert_eq!(bucket.spec.protocols, vec![Protocol::S3, Protocol::Gcp]);
        assert_eq!(bucket.spec.existing_bucket_id.as_deref(), Some("b-1"));
        assert_eq!(bucket.spec.deletion_policy, DeletionPolicy::Delete);
        let status = bucket.status.as_ref().unwrap();
        assert_eq!(status.bucket_id.as_deref(), Some("b-1"));
        let written = serde_json::to_value(&bucket).unwrap();
        assert_eq!(
            written["spec"]["protocols"],
            serde_json::json!(["S3", "GCP"])
        );
        assert_eq!(written["status"]["bucketID"], "b-1");

        let class: BucketAccessClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "keys"}, "driverName": "s3.example.com",
            "authenticationType": "IAM"
        }))
        .unwrap();
        assert_eq!(class.authentication_type, AuthenticationType::Iam);
        let written = serde_json::to_value(&class).unwrap();
        assert_eq!(written["apiVersion"], "objectstorage.k8s.io/v1alpha1");
        assert_eq!(written["kind"], "BucketAccessClass");
        assert_eq!(written["authenticationType"], "IAM");

        let access: BucketAccess = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "reader", "namespace": "app"},
            "spec": {"bucketClaimName": "data", "bucketAccessClassName": "keys",
                     "credentialsSecretName": "creds", "protocol": "Swift"},
            "status": {"accountID": "acct-1", "accessGranted": true}
        }))
        .unwrap();
        assert_eq!(
            access.spec.protocol,
            Some(Protocol::Other("Swift".to_string()))
        );
        assert_eq!(access.status.unwrap().account_id.as_deref(), Some("acct-1"));
    }
}
