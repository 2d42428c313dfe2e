//! cbt.storage.k8s.io/v1beta1 SnapshotMetadataService (KEP-3314, changed block tracking): the
//! cluster-scoped object, named after a CSI driver, that tells backup applications where the
//! driver's Kubernetes SnapshotMetadata gRPC service listens, which audience their tokens must
//! be issued for, and which CA signs the service's certificate. The csi-snapshot-metadata
//! sidecar reads it for the audience when `--audience` is not given.
//!
//! Its CRD ([`SnapshotMetadataService::crd`]; `manifests/crds/` holds it as YAML, written by the
//! `snapshot-metadata-crds` binary and checked fresh by a test) has upstream's names, scope,
//! short name, required fields and `caCert` as `format: byte`.

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "cbt.storage.k8s.io";
pub const VERSION: &str = "v1beta1";
/// The `api-approved.kubernetes.io` annotation of upstream's CRD (a protected `*.k8s.io` group
/// needs one, or the API server refuses the CRD).
pub const API_APPROVAL: &str =
    "https://github.com/kubernetes-csi/external-snapshot-metadata/pull/2";
/// The command that writes `manifests/crds/cbt.storage.k8s.io_*` (named in the file).
pub const CRDS_COMMAND: &str = "cargo run -p csi-snapshot-metadata --bin snapshot-metadata-crds";

/// Base64 in JSON, as Kubernetes encodes a Go `[]byte`.
fn bytes(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "byte"})
}

/// Where a CSI driver's Kubernetes SnapshotMetadata service listens and how a backup client
/// reaches it. One per driver, named after the driver.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "cbt.storage.k8s.io",
    version = "v1beta1",
    kind = "SnapshotMetadataService",
    shortname = "sms",
    derive = "PartialEq",
    derive = "Default",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-csi/external-snapshot-metadata/pull/2"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMetadataServiceSpec {
    /// The service's TCP endpoint (`host:port`).
    pub address: String,
    /// The audience a client's token (each request's `security_token`) must be issued for.
    pub audience: String,
    /// PEM bundle of the CA that signed the service's certificate.
    #[schemars(schema_with = "bytes")]
    pub ca_cert: ByteString,
}

impl SnapshotMetadataService {
    /// Its CustomResourceDefinition.
    pub fn crd() -> CustomResourceDefinition {
        <Self as CustomResourceExt>::crd()
    }
}

/// The CRDs of this group (one), in the order they are installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![SnapshotMetadataService::crd()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed YAML is what the types generate (`make crds` rewrites it).
    #[test]
    fn committed_crd_is_current() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let stale = crate::crd::stale_crds(&root, &["manifests/crds"], &crds(), CRDS_COMMAND);
        assert!(
            stale.is_empty(),
            "stale: {stale:?}: run `make crds` and commit it"
        );
    }

    #[test]
    fn crd_carries_upstream_names_scope_and_schema() {
        let crd = serde_json::to_value(SnapshotMetadataService::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "snapshotmetadataservices.cbt.storage.k8s.io"
        );
        assert_eq!(
            crd["metadata"]["annotations"]["api-approved.kubernetes.io"],
            API_APPROVAL
        );
        let spec = &crd["spec"];
        assert_eq!(spec["group"], GROUP);
        assert_eq!(spec["scope"], "Cluster");
        assert_eq!(spec["names"]["kind"], "SnapshotMetadataService");
        assert_eq!(spec["names"]["plural"], "snapshotmetadataservices");
        assert_eq!(spec["names"]["singular"], "snapshotmetadataservice");
        assert_eq!(spec["names"]["shortNames"], serde_json::json!(["sms"]));
        let version = &spec["versions"][0];
        assert_eq!(version["name"], VERSION);
        assert_eq!(version["served"], true);
        assert_eq!(version["storage"], true);
        let schema = &version["schema"]["openAPIV3Schema"];
        assert_eq!(schema["required"], serde_json::json!(["spec"]));
        let spec_schema = &schema["properties"]["spec"];
        let mut required: Vec<&str> = spec_schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort_unstable();
        assert_eq!(required, ["address", "audience", "caCert"]);
        assert_eq!(spec_schema["properties"]["caCert"]["format"], "byte");
        assert_eq!(spec_schema["properties"]["caCert"]["type"], "string");
        assert_eq!(spec_schema["properties"]["address"]["type"], "string");
        assert_eq!(spec_schema["properties"]["audience"]["type"], "string");
    }

    /// `caCert` is base64 on the wire, as upstream's `[]byte`.
    #[test]
    fn ca_cert_reads_and_writes_base64() {
        let object = serde_json::json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": "hostpath.csi.k8s.io"},
            "spec": {"address": "csi-snapshot-metadata.csi-suite:6443", "audience": "aud",
                     "caCert": "dGhpcyBpcyB0ZXh0IGNhIGNlcnQK"}
        });
        let sms: SnapshotMetadataService = serde_json::from_value(object.clone()).unwrap();
        assert_eq!(sms.spec.ca_cert.0, b"this is text ca cert\n");
        assert_eq!(sms.spec.audience, "aud");
        assert_eq!(serde_json::to_value(&sms).unwrap(), object);
    }
}
