//! Custom resources against their CRD's structural schema, as apiextensions-apiserver does on
//! every create and update: fields the schema does not know are pruned (unless
//! `x-kubernetes-preserve-unknown-fields`), then required fields, types and enums are checked,
//! then the schema's CEL rules (`x-kubernetes-validations`, [`super::cel`]) unless those errors
//! block them; every violation is one field error of a 422 Invalid (k8s.io/apimachinery field
//! errors).

use serde_json::Value;

use super::cel;
use crate::errors::{ApiError, FieldError};
use crate::resources::ResourceType;

/// Prunes `object` and validates it, when `rt` is a custom resource with a schema; `old` is the
/// stored object an update replaces, which the schema's transition rules compare with.
pub fn apply(rt: &ResourceType, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
    let Some(schema) = &rt.schema else {
        return Ok(());
    };
    prune_object(schema, object);
    let mut errors = Vec::new();
    validate(object, schema, "", &mut errors, true);
    if cel::has_rules(schema) {
        if cel::blocked_by(&errors) {
            errors.push(cel::not_checked());
        } else {
            errors.extend(cel::validate(schema, object, old));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid_fields(rt, name, &errors))
}

/// Removes the fields of a custom resource its version's `schema` does not declare (but
/// `apiVersion`, `kind` and `metadata`): on every write, and on every read through a version
/// other than the one the object was written through.
pub(crate) fn prune_object(schema: &Value, object: &mut Value) {
    if let Some(fields) = object.as_object_mut() {
        for (key, value) in fields.iter_mut() {
            if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                prune(value, &schema["properties"][key]);
            }
        }
        if !preserves_unknown(schema) && schema["properties"].is_object() {
            fields.retain(|key, _| {
                matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                    || schema["properties"].get(key).is_some()
            });
        }
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

/// Removes the fields of `value` its `schema` does not declare (a missing schema keeps all:
/// it is a preserved part).
fn prune(value: &mut Value, schema: &Value) {
    if !schema.is_object() || preserves_unknown(schema) {
        return;
    }
    match value {
        Value::Object(fields) => {
            if let Some(properties) = schema["properties"].as_object() {
                fields.retain(|key, _| properties.contains_key(key));
                for (key, field) in fields.iter_mut() {
                    prune(field, &properties[key]);
                }
            } else if schema["additionalProperties"].is_object() {
                for field in fields.values_mut() {
                    prune(field, &schema["additionalProperties"]);
                }
            } else if schema["type"] == "object" && schema["additionalProperties"] != true {
                fields.clear();
            }
        }
        Value::Array(items) => {
            for item in items {
                prune(item, &schema["items"]);
            }
        }
        _ => {}
    }
}

/// `path.key`, or `key` at the root: a field's path as validation errors name it.
pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, actual: &str) -> bool {
    expected == actual || (expected == "number" && actual == "integer")
}

fn validate(value: &Value, schema: &Value, path: &str, errors: &mut Vec<FieldError>, root: bool) {
    if !schema.is_object() {
        return;
    }
    if value.is_null() {
        // Nulls of nullable fields are kept; others are left to the writer (as the server of
        // v1.19 does not prune them either).
        return;
    }
    let actual = type_name(value);
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if actual != "integer" && actual != "string" {
            errors.push(FieldError {
                field: path.to_string(),
                reason: "FieldValueTypeInvalid",
                detail: format!("Invalid value: \"{actual}\": {path} in body must be of type integer,string: \"{actual}\""),
            });
        }
        return;
    }
    if let Some(expected) = schema["type"].as_str()
        && !type_matches(expected, actual)
    {
        // A type error is TypeInvalid (which blocks the CEL rules), worded as Invalid.
        errors.push(FieldError {
            field: path.to_string(),
            reason: "FieldValueTypeInvalid",
            detail: format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
            ),
        });
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errors.push(FieldError {
            field: path.to_string(),
            reason: "FieldValueNotSupported",
            detail: format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        });
    }
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let field_schema = match schema["properties"].get(key) {
                    Some(s) => s,
                    None => &schema["additionalProperties"],
                };
                validate(field, field_schema, &join(path, key), errors, false);
            }
            // The properties' errors come first, then the missing ones (as kube-apiserver's
            // validator reports them).
            for required in schema["required"].as_array().into_iter().flatten() {
                let Some(key) = required.as_str() else {
                    continue;
                };
                if !fields.contains_key(key) {
                    errors.push(FieldError {
                        field: join(path, key),
                        reason: "FieldValueRequired",
                        detail: "Required value".to_string(),
                    });
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                validate(
                    item,
                    &schema["items"],
                    &format!("{path}[{i}]"),
                    errors,
                    false,
                );
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn rt() -> ResourceType {
        ResourceType {
            group: "example.com".into(),
            version: "v1".into(),
            plural: "widgets".into(),
            singular: "widget".into(),
            kind: "Widget".into(),
            namespaced: true,
            subresources: vec!["status".into()],
            short_names: vec![],
            schema: Some(Arc::new(json!({"type": "object", "properties": {
                "spec": {"type": "object", "required": ["size", "mode"], "properties": {
                    "size": {"type": "integer"},
                    "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "quantity": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}}},
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}))),
            create_only: false,
        }
    }

    #[test]
    fn unknown_fields_are_pruned_and_preserved_parts_kept() {
        let mut object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "extra": 1,
            "spec": {"size": 1, "mode": "Fast", "unknown": true, "labels": {"a": "b"},
                     "free": {"anything": {"goes": 1}}, "quantity": "1Gi"},
            "status": {"ready": true, "other": 2}});
        apply(&rt(), &mut object, None).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                "spec": {"size": 1, "mode": "Fast", "labels": {"a": "b"},
                         "free": {"anything": {"goes": 1}}, "quantity": "1Gi"},
                "status": {"ready": true}})
        );
    }

    #[test]
    fn violations_are_one_invalid_error_with_causes() {
        let mut object = json!({"metadata": {"name": "w"}, "spec": {"mode": "Medium"}});
        let error = apply(&rt(), &mut object, None).unwrap_err();
        assert_eq!(error.code.as_u16(), 422);
        assert_eq!(
            error.message,
            "Widget.example.com \"w\" is invalid: [spec.mode: Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\", spec.size: Required value]"
        );
        let causes = &error.details.unwrap()["causes"];
        assert_eq!(causes[1]["reason"], "FieldValueRequired");
        assert_eq!(causes[1]["field"], "spec.size");
        let mut typed = json!({"metadata": {"name": "w"}, "spec": {"size": "big", "mode": "Fast"}});
        assert_eq!(
            apply(&rt(), &mut typed, None).unwrap_err().message,
            "Widget.example.com \"w\" is invalid: spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
        );
    }

    #[test]
    fn cel_rules_run_after_the_schema_unless_its_errors_block_them() {
        let mut with_rules = rt();
        let mut schema = (*with_rules.schema.take().unwrap()).clone();
        schema["properties"]["spec"]["x-kubernetes-validations"] =
            json!([{"rule": "self.size < 10", "message": "too big"}]);
        with_rules.schema = Some(Arc::new(schema));
        let refusal = |spec: Value| {
            let mut object = json!({"metadata": {"name": "w"}, "spec": spec});
            apply(&with_rules, &mut object, None)
                .err()
                .map(|e| e.message)
        };
        // (case, spec, the refusal's message).
        let cases = [
            ("valid", json!({"size": 1, "mode": "Fast"}), None),
            (
                "a broken rule",
                json!({"size": 11, "mode": "Fast"}),
                Some(
                    "Widget.example.com \"w\" is invalid: spec: Invalid value: \"object\": too big",
                ),
            ),
            (
                "a type error blocks the rules",
                json!({"size": "big", "mode": "Fast"}),
                Some(
                    "Widget.example.com \"w\" is invalid: [spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\", <nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]",
                ),
            ),
        ];
        for (case, spec, expected) in cases {
            assert_eq!(refusal(spec).as_deref(), expected, "{case}");
        }
    }
}
