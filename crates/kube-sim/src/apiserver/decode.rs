//! The decoding step of a built-in object's write: kube-apiserver decodes every body into its
//! Go type before anything else, so a value of the wrong JSON type, a malformed quantity or
//! time, or Secret data that is not base64 refuses the write — 400 BadRequest on create and
//! update ("<Kind> in version "v1" cannot be handled as a <Kind>: …"), 422 Invalid on the field
//! `patch` when a patch produced it (k8s.io/apiserver/pkg/endpoints/handlers/create.go, update.go,
//! patch.go). What decodes is stored as Go encodes it back: a field the type lacks is dropped,
//! a time is in UTC (a Time in whole seconds). The types are k8s-openapi's JSON schemas (v1.33's,
//! so kube-sim keeps fields newer than v1.19's), and `null` is every type's zero value, as for Go.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::http::StatusCode;
use base64::Engine;
use k8s_openapi::api::{authentication, authorization, coordination, core, events, rbac, storage};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::go_time;
use super::schema::join;
use crate::errors::ApiError;
use crate::quantity::{self, QuantityError};
use crate::resources::ResourceType;

/// Why a value cannot be decoded: the path of the field (`spec.renewTime`) and the reason. A
/// time's reason is Go's parse error, which kube-apiserver prints alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DecodeError {
    pub(super) field: String,
    pub(super) reason: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reason {
    /// Printed after the field's path.
    OfField(String),
    /// Printed alone.
    Whole(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reason {
            Reason::OfField(reason) => write!(f, "{}: {reason}", self.field),
            Reason::Whole(reason) => f.write_str(reason),
        }
    }
}

/// A create or update body that does not decode: 400, as the request's decoder answers.
pub(super) fn check_body(served: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    check_kind_body(&served.group, &served.version, &served.kind, object)
}

/// [`check_body`] for a kind without a resource of its own (a subresource's, as TokenRequest).
pub(super) fn check_kind_body(
    group: &str,
    version: &str,
    kind: &str,
    object: &mut Value,
) -> Result<(), ApiError> {
    decode_kind(group, kind, object).map_err(|e| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}"
        ))
    })
}

/// A patched object that does not decode: 422 on the field `patch`, the patched object quoted
/// (the strategic-merge handler quotes the patch as a Go map instead; the decoding error reads
/// the same).
pub(super) fn check_patched(served: &ResourceType, patched: &mut Value) -> Result<(), ApiError> {
    decode(served, patched).map_err(|e| {
        let quoted = serde_json::to_string(&patched.to_string()).unwrap_or_default();
        let detail = format!("Invalid value: {quoted}: {e}");
        let mut error = ApiError::with_reason(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(" \"\" is invalid: patch: {detail}"),
        );
        error.details = Some(json!({
            "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": "patch"}],
        }));
        error
    })
}

/// `object` as its served type holds it: the fields the type does not have are dropped; the
/// first field the type cannot hold refuses it.
pub(super) fn decode(served: &ResourceType, object: &mut Value) -> Result<(), DecodeError> {
    decode_kind(&served.group, &served.kind, object)
}

fn decode_kind(group: &str, kind: &str, object: &mut Value) -> Result<(), DecodeError> {
    let Some(schema) = SCHEMAS.get(&(group, kind)) else {
        return Ok(());
    };
    Walk {
        defs: schema["$defs"].as_object(),
    }
    .value(schema, object, "")
}

/// The root schema of each built-in kind kube-sim serves, by group and kind (CRDs are left
/// out: their schemas are schemas of schemas, validated by apiextensions' own rules).
static SCHEMAS: LazyLock<HashMap<(&'static str, &'static str), Value>> = LazyLock::new(|| {
    fn root<T: JsonSchema>() -> Value {
        SchemaGenerator::default().root_schema_for::<T>().to_value()
    }
    HashMap::from([
        (("", "Namespace"), root::<core::v1::Namespace>()),
        (("", "Node"), root::<core::v1::Node>()),
        (("", "Pod"), root::<core::v1::Pod>()),
        (
            ("", "PersistentVolume"),
            root::<core::v1::PersistentVolume>(),
        ),
        (
            ("", "PersistentVolumeClaim"),
            root::<core::v1::PersistentVolumeClaim>(),
        ),
        (("", "Secret"), root::<core::v1::Secret>()),
        (("", "ConfigMap"), root::<core::v1::ConfigMap>()),
        (("", "Event"), root::<core::v1::Event>()),
        (("", "ServiceAccount"), root::<core::v1::ServiceAccount>()),
        (("events.k8s.io", "Event"), root::<events::v1::Event>()),
        (
            ("storage.k8s.io", "StorageClass"),
            root::<storage::v1::StorageClass>(),
        ),
        (
            ("storage.k8s.io", "VolumeAttachment"),
            root::<storage::v1::VolumeAttachment>(),
        ),
        (
            ("storage.k8s.io", "CSINode"),
            root::<storage::v1::CSINode>(),
        ),
        (
            ("storage.k8s.io", "CSIDriver"),
            root::<storage::v1::CSIDriver>(),
        ),
        (
            ("storage.k8s.io", "CSIStorageCapacity"),
            root::<storage::v1::CSIStorageCapacity>(),
        ),
        // storage.k8s.io/v1's VolumeAttributesClass has v1beta1's fields.
        (
            ("storage.k8s.io", "VolumeAttributesClass"),
            root::<storage::v1beta1::VolumeAttributesClass>(),
        ),
        (
            ("coordination.k8s.io", "Lease"),
            root::<coordination::v1::Lease>(),
        ),
        (
            ("rbac.authorization.k8s.io", "Role"),
            root::<rbac::v1::Role>(),
        ),
        (
            ("rbac.authorization.k8s.io", "ClusterRole"),
            root::<rbac::v1::ClusterRole>(),
        ),
        (
            ("rbac.authorization.k8s.io", "RoleBinding"),
            root::<rbac::v1::RoleBinding>(),
        ),
        (
            ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
            root::<rbac::v1::ClusterRoleBinding>(),
        ),
        (
            ("authentication.k8s.io", "TokenRequest"),
            root::<authentication::v1::TokenRequest>(),
        ),
        (
            ("authentication.k8s.io", "TokenReview"),
            root::<authentication::v1::TokenReview>(),
        ),
        (
            ("authorization.k8s.io", "SubjectAccessReview"),
            root::<authorization::v1::SubjectAccessReview>(),
        ),
        (
            ("authorization.k8s.io", "LocalSubjectAccessReview"),
            root::<authorization::v1::LocalSubjectAccessReview>(),
        ),
    ])
});

/// The apimachinery types whose Go decoders are their own, by schema name.
enum Special {
    Time,
    MicroTime,
    Quantity,
    IntOrString,
    /// Any JSON (FieldsV1, RawExtension).
    Raw,
}

fn special(name: &str) -> Option<Special> {
    Some(match name {
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time" => Special::Time,
        "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime" => Special::MicroTime,
        "io.k8s.apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"
        | "io.k8s.apimachinery.pkg.runtime.RawExtension" => Special::Raw,
        _ => return None,
    })
}

struct Walk<'a> {
    defs: Option<&'a Map<String, Value>>,
}

impl Walk<'_> {
    fn value(&self, schema: &Value, value: &mut Value, path: &str) -> Result<(), DecodeError> {
        if value.is_null() {
            return Ok(());
        }
        let field = if path.is_empty() { "(root)" } else { path };
        let fail = |reason: String| {
            Err(DecodeError {
                field: field.to_string(),
                reason: Reason::OfField(reason),
            })
        };
        if let Some(reference) = schema["$ref"].as_str() {
            let name = reference.rsplit('/').next().unwrap_or_default();
            if let Some(special) = special(name) {
                return match decode_special(&special, value) {
                    Some(reason) => Err(DecodeError {
                        field: field.to_string(),
                        reason,
                    }),
                    None => Ok(()),
                };
            }
            return match self.defs.and_then(|defs| defs.get(name)) {
                Some(definition) => self.value(definition, value, path),
                None => Ok(()),
            };
        }
        match schema["type"].as_str() {
            Some("object") => {
                let found = json_type(value);
                let Some(fields) = value.as_object_mut() else {
                    return fail(format!("expects an object, found {found}"));
                };
                let map_values = schema.get("additionalProperties").filter(|s| s.is_object());
                // A struct's unknown fields have nowhere to go in Go: they are dropped.
                if map_values.is_none() && schema["properties"].is_object() {
                    fields.retain(|name, _| schema["properties"].get(name).is_some());
                }
                for (name, field) in fields.iter_mut() {
                    let field_schema = schema["properties"].get(name).or(map_values);
                    if let Some(field_schema) = field_schema {
                        self.value(field_schema, field, &join(path, name))?;
                    }
                }
                Ok(())
            }
            Some("array") => {
                let found = json_type(value);
                let Some(items) = value.as_array_mut() else {
                    return fail(format!("expects an array, found {found}"));
                };
                for (i, item) in items.iter_mut().enumerate() {
                    self.value(&schema["items"], item, &format!("{path}[{i}]"))?;
                }
                Ok(())
            }
            Some("string") if schema["format"] == "byte" => match value.as_str() {
                Some(text) => match base64::engine::general_purpose::STANDARD.decode(text) {
                    Ok(_) => Ok(()),
                    Err(e) => fail(format!("decode base64: {e}")),
                },
                None => fail("base64Codec: invalid input".into()),
            },
            Some("string") if !value.is_string() => {
                fail(format!("expects a string, found {}", json_type(value)))
            }
            Some("boolean") if !value.is_boolean() => {
                fail(format!("expects true or false, found {}", json_type(value)))
            }
            Some("number") if !value.is_number() => {
                fail(format!("expects a number, found {}", json_type(value)))
            }
            Some("integer") => match integer_reason(value, schema["format"] == "int32") {
                Some(reason) => fail(reason),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn integer_reason(value: &Value, int32: bool) -> Option<String> {
    let Value::Number(number) = value else {
        return Some(format!("expects an integer, found {}", json_type(value)));
    };
    let Some(integer) = number.as_i64() else {
        return Some(if number.is_u64() {
            format!("overflow: {number}")
        } else {
            "can not decode float as int".into()
        });
    };
    (int32 && i32::try_from(integer).is_err()).then(|| format!("overflow: {integer}"))
}

/// Why `value` is no `special`; a time is written back as Go encodes it (in UTC; a Time in
/// whole seconds, a MicroTime with six fractional digits).
fn decode_special(special: &Special, value: &mut Value) -> Option<Reason> {
    match special {
        Special::Raw => None,
        Special::IntOrString => match value {
            Value::String(_) => None,
            other => integer_reason(other, true).map(Reason::OfField),
        },
        Special::Quantity => {
            let text = match value {
                Value::String(text) => text.trim().to_string(),
                Value::Number(number) => number.to_string(),
                _ => return Some(Reason::OfField(QuantityError::Format.to_string())),
            };
            quantity::parse(&text)
                .err()
                .map(|e| Reason::OfField(e.to_string()))
        }
        Special::Time | Special::MicroTime => {
            let micro = matches!(special, Special::MicroTime);
            let Some(text) = value.as_str() else {
                return Some(Reason::OfField(format!(
                    "expects a time string, found {}",
                    json_type(value)
                )));
            };
            let parsed = match go_time::parse(text, micro) {
                Ok(parsed) => parsed,
                Err(error) => return Some(Reason::Whole(error)),
            };
            let Some(time) = parsed.timestamp() else {
                let layout = if micro {
                    go_time::RFC3339_MICRO
                } else {
                    go_time::RFC3339
                };
                return Some(Reason::Whole(format!(
                    "parsing time {text:?} as {layout:?}"
                )));
            };
            let encoded = if micro {
                time.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            } else {
                time.strftime("%Y-%m-%dT%H:%M:%SZ")
            };
            *value = Value::String(encoded.to_string());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in resource of `kind` (kinds served once).
    fn served(kind: &str) -> ResourceType {
        crate::resources::builtin()
            .into_iter()
            .find(|rt| rt.kind == kind)
            .unwrap_or_else(|| panic!("{kind} is served"))
    }

    #[test]
    fn the_first_field_its_type_cannot_hold() {
        let rows = [
            (
                json!({"spec": {"renewTime": "2026-12-02T04:00:00.123456Z", "leaseDurationSeconds": 5}}),
                None,
            ),
            (
                json!({"spec": {"renewTime": null, "holderIdentity": null}}),
                None,
            ),
            (
                json!({"spec": {"renewTime": "2026-12-02T04:00:00Z"}}),
                Some((
                    "spec.renewTime",
                    "parsing time \"2026-12-02T04:00:00Z\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse \"Z\" as \".000000\"",
                )),
            ),
            (
                json!({"spec": {"leaseDurationSeconds": "5"}}),
                Some((
                    "spec.leaseDurationSeconds",
                    "expects an integer, found a string",
                )),
            ),
            (
                json!({"spec": {"leaseDurationSeconds": 1.5}}),
                Some(("spec.leaseDurationSeconds", "can not decode float as int")),
            ),
            (
                json!({"spec": {"leaseTransitions": 3_000_000_000_u64}}),
                Some(("spec.leaseTransitions", "overflow: 3000000000")),
            ),
            (
                json!({"metadata": {"labels": {"a": 1}}}),
                Some(("metadata.labels.a", "expects a string, found a number")),
            ),
            (
                json!({"metadata": {"finalizers": ["a", 2]}}),
                Some(("metadata.finalizers[1]", "expects a string, found a number")),
            ),
            (
                json!({"metadata": {"creationTimestamp": ""}}),
                Some((
                    "metadata.creationTimestamp",
                    "parsing time \"\" as \"2006-01-02T15:04:05Z07:00\": cannot parse \"\" as \"2006\"",
                )),
            ),
            (
                json!({"spec": []}),
                Some(("spec", "expects an object, found an array")),
            ),
            (json!({"spec": {"unknownField": 1}}), None),
        ];
        for (object, expected) in rows {
            let got = decode(&served("Lease"), &mut object.clone()).err();
            let expected = expected.map(|(field, reason): (&str, &str)| DecodeError {
                field: field.into(),
                reason: if reason.starts_with("parsing time") {
                    Reason::Whole(reason.into())
                } else {
                    Reason::OfField(reason.into())
                },
            });
            assert_eq!(got, expected, "{object}");
        }
    }

    #[test]
    fn fields_the_type_lacks_are_dropped() {
        let mut object = json!({
            "metadata": {"name": "l", "bar": 1, "labels": {"any": "key"}},
            "spec": {"holderIdentity": "a", "holder": "b"},
            "status": {"a": 1},
            "foo": 2,
        });
        decode(&served("Lease"), &mut object).unwrap();
        assert_eq!(
            object,
            json!({"metadata": {"name": "l", "labels": {"any": "key"}}, "spec": {"holderIdentity": "a"}})
        );
    }

    #[test]
    fn times_are_written_back_as_go_encodes_them() {
        let mut object = json!({
            "metadata": {"creationTimestamp": "2026-12-02T04:00:00.7+01:00"},
            "spec": {"renewTime": "2026-12-02T04:00:00.000120-00:30", "acquireTime": "2026-12-02T04:00:00.123456Z"},
        });
        decode(&served("Lease"), &mut object).unwrap();
        assert_eq!(
            object["metadata"]["creationTimestamp"],
            "2026-12-02T03:00:00Z"
        );
        assert_eq!(object["spec"]["renewTime"], "2026-12-02T04:30:00.000120Z");
        assert_eq!(object["spec"]["acquireTime"], "2026-12-02T04:00:00.123456Z");
    }

    #[test]
    fn secret_data_is_base64() {
        assert_eq!(
            decode(&served("Secret"), &mut json!({"data": {"a": "YWI="}})),
            Ok(())
        );
        let error = decode(&served("Secret"), &mut json!({"data": {"a": "YWI"}})).unwrap_err();
        assert_eq!(error.field, "data.a");
        assert!(
            error.to_string().starts_with("data.a: decode base64: "),
            "{error}"
        );
        let error = decode(&served("Secret"), &mut json!({"data": {"a": 5}})).unwrap_err();
        assert_eq!(error.to_string(), "data.a: base64Codec: invalid input");
    }
}
