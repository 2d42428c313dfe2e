//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`). kubectl's typed clients
//! send them for built-in kinds (`kubectl create namespace|configmap|secret|serviceaccount`,
//! the evictions of `kubectl drain`), and client-go does not fall back to JSON after a 415 for
//! protobuf (it does so only for CBOR), so kube-apiserver's answer has to be decoding them.
//! The body is the 4-byte magic `k8s\0` and a `runtime.Unknown` whose `raw` is the object
//! (k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go). Decoded objects become
//! the JSON the same object has in the API (k8s.io/api types' JSON names; empty optional
//! fields omitted). Kinds not listed in [`DECODED`] answer 415 naming what is decoded.

mod auth;

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::apiserver::rfc3339;
use crate::errors::ApiError;

const MAGIC: &[u8] = b"k8s\0";

/// The kinds whose protobuf bodies are decoded.
pub const DECODED: [&str; 11] = [
    "Namespace",
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Eviction",
    "DeleteOptions",
    "TokenRequest",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
];

/// The JSON object of a protobuf request body.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::bad_request("the protobuf body does not start with k8s\\0"))?;
    let unknown = Unknown::decode(envelope).map_err(invalid)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let mut object = match kind.as_str() {
        "Namespace" => namespace(core::Namespace::decode(&*raw).map_err(invalid)?),
        "ConfigMap" => config_map(core::ConfigMap::decode(&*raw).map_err(invalid)?),
        "Secret" => secret(core::Secret::decode(&*raw).map_err(invalid)?),
        "ServiceAccount" => service_account(core::ServiceAccount::decode(&*raw).map_err(invalid)?),
        "Eviction" => eviction(k8s_pb::api::policy::v1::Eviction::decode(&*raw).map_err(invalid)?),
        "DeleteOptions" => delete_options(meta::DeleteOptions::decode(&*raw).map_err(invalid)?),
        "TokenRequest" => auth::token_request(decoded(&raw)?),
        "Role" => auth::role(decoded(&raw)?),
        "ClusterRole" => auth::cluster_role(decoded(&raw)?),
        "RoleBinding" => auth::role_binding(decoded(&raw)?),
        "ClusterRoleBinding" => auth::cluster_role_binding(decoded(&raw)?),
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "kube-sim decodes application/vnd.kubernetes.protobuf bodies of {} only, not {other:?}: send it as application/json",
                DECODED.join(", ")
            )));
        }
    };
    object.insert("kind".into(), json!(kind));
    if let Some(api_version) = type_meta.api_version {
        object.insert("apiVersion".into(), json!(api_version));
    }
    Ok(Value::Object(object))
}

fn decoded<M: Message + Default>(raw: &[u8]) -> Result<M, ApiError> {
    M::decode(raw).map_err(invalid)
}

fn invalid(error: prost::DecodeError) -> ApiError {
    ApiError::bad_request(format!("the protobuf body cannot be decoded: {error}"))
}

/// Builds a JSON object, leaving out fields whose value is absent or empty (Go's omitempty).
#[derive(Default)]
struct Object(Map<String, Value>);

impl Object {
    fn set(mut self, field: &str, value: impl Into<Option<Value>>) -> Self {
        match value.into() {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) if map.is_empty() => {}
            Some(Value::Array(items)) if items.is_empty() => {}
            Some(value) => {
                self.0.insert(field.into(), value);
            }
        }
        self
    }
}

fn strings(map: BTreeMap<String, String>) -> Value {
    json!(map)
}

fn bytes(map: BTreeMap<String, Vec<u8>>) -> Value {
    map.into_iter()
        .map(|(k, v)| (k, json!(STANDARD.encode(v))))
        .collect::<Map<_, _>>()
        .into()
}

fn time(time: Option<meta::Time>) -> Option<Value> {
    let seconds = u64::try_from(time?.seconds?).ok()?;
    Some(json!(rfc3339(seconds)))
}

fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
    let m = m.unwrap_or_default();
    let owners: Vec<Value> = m
        .owner_references
        .into_iter()
        .map(|o| {
            Value::Object(
                Object::default()
                    .set("apiVersion", o.api_version.map(Value::from))
                    .set("kind", o.kind.map(Value::from))
                    .set("name", o.name.map(Value::from))
                    .set("uid", o.uid.map(Value::from))
                    .set("controller", o.controller.map(Value::from))
                    .set(
                        "blockOwnerDeletion",
                        o.block_owner_deletion.map(Value::from),
                    )
                    .0,
            )
        })
        .collect();
    // Go's protobuf marshals ObjectMeta's plain fields even when empty (kubectl sends
    // `generateName: ""`, `generation: 0`); its JSON omits them (`omitempty`), so do we.
    let text = |value: Option<String>| value.filter(|v| !v.is_empty()).map(Value::from);
    Value::Object(
        Object::default()
            .set("name", text(m.name))
            .set("generateName", text(m.generate_name))
            .set("namespace", text(m.namespace))
            .set("uid", text(m.uid))
            .set("resourceVersion", text(m.resource_version))
            .set(
                "generation",
                m.generation.filter(|g| *g != 0).map(Value::from),
            )
            .set("creationTimestamp", time(m.creation_timestamp))
            .set("deletionTimestamp", time(m.deletion_timestamp))
            .set(
                "deletionGracePeriodSeconds",
                m.deletion_grace_period_seconds.map(Value::from),
            )
            .set("labels", strings(m.labels))
            .set("annotations", strings(m.annotations))
            .set("ownerReferences", json!(owners))
            .set("finalizers", json!(m.finalizers))
            .0,
    )
}

fn namespace(n: core::Namespace) -> Map<String, Value> {
    let spec = n.spec.unwrap_or_default();
    let status = n.status.unwrap_or_default();
    Object::default()
        .set("metadata", object_meta(n.metadata))
        .set(
            "spec",
            Value::Object(
                Object::default()
                    .set("finalizers", json!(spec.finalizers))
                    .0,
            ),
        )
        .set(
            "status",
            Value::Object(
                Object::default()
                    .set("phase", status.phase.map(Value::from))
                    .0,
            ),
        )
        .0
}

fn config_map(c: core::ConfigMap) -> Map<String, Value> {
    Object::default()
        .set("metadata", object_meta(c.metadata))
        .set("immutable", c.immutable.map(Value::from))
        .set("data", strings(c.data))
        .set("binaryData", bytes(c.binary_data))
        .0
}

fn secret(s: core::Secret) -> Map<String, Value> {
    Object::default()
        .set("metadata", object_meta(s.metadata))
        .set("immutable", s.immutable.map(Value::from))
        .set("data", bytes(s.data))
        .set("stringData", strings(s.string_data))
        .set("type", s.r#type.map(Value::from))
        .0
}

fn service_account(a: core::ServiceAccount) -> Map<String, Value> {
    let secrets: Vec<Value> = a
        .secrets
        .into_iter()
        .map(|r| {
            Value::Object(
                Object::default()
                    .set("kind", r.kind.map(Value::from))
                    .set("namespace", r.namespace.map(Value::from))
                    .set("name", r.name.map(Value::from))
                    .set("uid", r.uid.map(Value::from))
                    .set("apiVersion", r.api_version.map(Value::from))
                    .set("resourceVersion", r.resource_version.map(Value::from))
                    .set("fieldPath", r.field_path.map(Value::from))
                    .0,
            )
        })
        .collect();
    let pull: Vec<Value> = a
        .image_pull_secrets
        .into_iter()
        .map(|r| Value::Object(Object::default().set("name", r.name.map(Value::from)).0))
        .collect();
    Object::default()
        .set("metadata", object_meta(a.metadata))
        .set("secrets", json!(secrets))
        .set("imagePullSecrets", json!(pull))
        .set(
            "automountServiceAccountToken",
            a.automount_service_account_token.map(Value::from),
        )
        .0
}

fn eviction(e: k8s_pb::api::policy::v1::Eviction) -> Map<String, Value> {
    let options = delete_options(e.delete_options.unwrap_or_default());
    Object::default()
        .set("metadata", object_meta(e.metadata))
        .set("deleteOptions", Value::Object(options))
        .0
}

fn delete_options(options: meta::DeleteOptions) -> Map<String, Value> {
    let preconditions = options.preconditions.unwrap_or_default();
    Object::default()
        .set(
            "gracePeriodSeconds",
            options.grace_period_seconds.map(Value::from),
        )
        .set(
            "preconditions",
            Value::Object(
                Object::default()
                    .set("uid", preconditions.uid.map(Value::from))
                    .set(
                        "resourceVersion",
                        preconditions.resource_version.map(Value::from),
                    )
                    .0,
            ),
        )
        .set(
            "orphanDependents",
            options.orphan_dependents.map(Value::from),
        )
        .set(
            "propagationPolicy",
            options.propagation_policy.map(Value::from),
        )
        .set("dryRun", json!(options.dry_run))
        .0
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;

    fn envelope(kind: &str, api_version: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    #[test]
    fn secrets_decode_to_their_json_without_empty_fields() {
        let secret = core::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("s".into()),
                // What Go's marshalling sends for fields left empty: not in the JSON.
                generate_name: Some(String::new()),
                uid: Some(String::new()),
                generation: Some(0),
                labels: [("a".to_string(), "b".to_string())].into(),
                creation_timestamp: Some(meta::Time {
                    seconds: Some(0),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            data: [("k".to_string(), b"v".to_vec())].into(),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let decoded = decode(&envelope("Secret", "v1", secret.encode_to_vec())).unwrap();
        assert_eq!(
            decoded,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "labels": {"a": "b"}, "creationTimestamp": "1970-01-01T00:00:00Z"},
                "data": {"k": "dg=="}, "type": "Opaque",
            })
        );
    }

    #[test]
    fn other_kinds_and_garbage_are_refused() {
        let pod = core::Pod::default().encode_to_vec();
        let refused = decode(&envelope("Pod", "v1", pod)).unwrap_err();
        assert_eq!(refused.code.as_u16(), 415);
        assert_eq!(decode(b"{}").unwrap_err().code.as_u16(), 400);
        assert_eq!(decode(b"k8s\0\xff\xff").unwrap_err().code.as_u16(), 400);
    }
}
