//! The CEL rules of a CRD's structural schema (`x-kubernetes-validations`). kube-apiserver
//! (1.25 and later) evaluates them on every create and update of a custom resource, after the
//! schema's own checks (apiextensions-apiserver pkg/apiserver/schema/cel/validation.go), and
//! checks them when a CRD is written, refusing one whose rules do not compile
//! (pkg/apis/apiextensions/validation/validation.go).
//!
//! A rule sits on any schema node and runs for every value at that node (each list item, each
//! map value) with `self` bound to it; a transition rule (one naming `oldSelf`) runs only on an
//! update, where the old object has a value at the same place. A rule that is not true is one
//! field error at its node, worded as kube-apiserver words it: `Invalid value: "<schema type>":
//! <message>` (or the rule's `reason`), the message being the rule's `messageExpression`, its
//! `message`, or `failed rule: <rule>`.
//!
//! The `cel` crate parses and interprets the rules, untyped. Left out: the static type check (a
//! rule that selects a field its schema does not declare is refused when it runs, not when the
//! CRD is written), cost estimates and budgets, Kubernetes' own CEL libraries (lists, regex,
//! quantity, url, ip, authz: a rule calling one of their functions is logged and not enforced),
//! set and map lists' order-insensitive equality, `optionalOldSelf`, the timestamp and duration
//! types of `date-time` and `duration` strings (they are strings here), and the `apiVersion`,
//! `kind` and `metadata` that the rules at an embedded resource's root see.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cel::objects::{Key, Map};
use cel::{Context, Env, ExecutionError, Program};
use serde_json::Value;

use super::schema::join;
use crate::errors::FieldError;

/// Identifiers CEL reserves: a property so named is `__<name>__` in a rule
/// (k8s.io/apiserver/pkg/cel/escaping.go).
const RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The reasons a rule may give for its failure, in the order kube-apiserver lists them.
const REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// The schema's field errors that keep kube-apiserver from evaluating the rules at all: the
/// object does not have the shape the rules were written for (customresource strategy
/// hasBlockingErr; the enum's NotSupported since 1.29).
const BLOCKING: [&str; 5] = [
    "FieldValueRequired",
    "FieldValueNotSupported",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
];

/// The one error that stands for the rules when the schema's errors block them.
pub(super) fn not_checked() -> FieldError {
    FieldError {
        field: root_field(""),
        reason: "FieldValueInvalid",
        detail: "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
    }
}

/// True when one of the schema's `errors` keeps the rules from being evaluated.
pub(super) fn blocked_by(errors: &[FieldError]) -> bool {
    errors.iter().any(|e| BLOCKING.contains(&e.reason))
}

/// CEL's standard library plus the strings extension, as Kubernetes' base environment has them
/// (k8s.io/apiserver/pkg/cel/environment/base.go).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    if let Err(error) = env.add_extension(cel::extensions::strings) {
        tracing::warn!(%error, "CEL rules go without the strings extension");
    }
    Arc::new(env)
});

/// Compiled programs by their source. kube-apiserver compiles a CRD's rules once, when it
/// serves the CRD; here once per rule text, which every server of the process shares (a
/// program depends on its text alone).
static PROGRAMS: LazyLock<Mutex<HashMap<String, Compiled>>> = LazyLock::new(Mutex::default);

/// A program, or the parser's message as cel-go words it (`ERROR: <input>:1:4: Syntax error:
/// …`, then the source line and a caret under the error, each line indented by one space).
type Compiled = Result<Arc<Program>, String>;

fn compile(source: &str) -> Compiled {
    let mut programs = PROGRAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(compiled) = programs.get(source) {
        return compiled.clone();
    }
    let compiled = ENV
        .compile(source)
        .map(Arc::new)
        .map_err(|e| e.to_string().replace("\n|", "\n |"));
    programs.insert(source.to_string(), compiled.clone());
    compiled
}

/// A property's name as a rule spells it, or None when no rule can name it: CEL reserved
/// words become `__<word>__`, and `__`, `.`, `-` and `/` become `__underscores__`, `__dot__`,
/// `__dash__` and `__slash__` (k8s.io/apiserver/pkg/cel/escaping.go Escape).
fn escape(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut escaped = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("__") {
            escaped.push_str("__underscores__");
            rest = after;
            continue;
        }
        match c {
            '.' => escaped.push_str("__dot__"),
            '-' => escaped.push_str("__dash__"),
            '/' => escaped.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => escaped.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(escaped)
}

/// True when `schema` or a schema below it has rules.
pub(super) fn has_rules(schema: &Value) -> bool {
    schema["x-kubernetes-validations"]
        .as_array()
        .is_some_and(|rules| !rules.is_empty())
        || schema["properties"]
            .as_object()
            .is_some_and(|properties| properties.values().any(has_rules))
        || has_rules_below(&schema["items"])
        || has_rules_below(&schema["additionalProperties"])
}

fn has_rules_below(schema: &Value) -> bool {
    schema.is_object() && has_rules(schema)
}

/// The rules of the custom resource `object` (the schema's root), with `old` the stored
/// object on an update; one field error per rule that does not hold.
pub(super) fn validate(schema: &Value, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    walk(schema, object, old, "", true, &mut errors);
    errors
}

/// The rules at `schema`'s node for `value`, then those below it. The old value follows where
/// it can be told apart: an object's field by name, a map's value by key, a `map` list's item
/// by its keys; never an atomic or set list's item.
fn walk(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    root: bool,
    errors: &mut Vec<FieldError>,
) {
    // Null values are not validated: a rule about a nullable field belongs to its parent.
    if !schema.is_object() || value.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    evaluate(schema, value, old, path, root, errors);
    match value {
        Value::Object(fields) => {
            if let Some(properties) = schema["properties"].as_object() {
                for (key, field) in fields {
                    if let Some(field_schema) = properties.get(key) {
                        let old_field = old.and_then(|o| o.get(key));
                        walk(
                            field_schema,
                            field,
                            old_field,
                            &join(path, key),
                            false,
                            errors,
                        );
                    }
                }
            } else if schema["additionalProperties"].is_object() {
                for (key, field) in fields {
                    let old_field = old.and_then(|o| o.get(key));
                    let field_path = format!("{path}[{key}]");
                    walk(
                        &schema["additionalProperties"],
                        field,
                        old_field,
                        &field_path,
                        false,
                        errors,
                    );
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let old_item = old.and_then(|o| correlated_item(schema, o, item));
                walk(
                    &schema["items"],
                    item,
                    old_item,
                    &format!("{path}[{i}]"),
                    false,
                    errors,
                );
            }
        }
        _ => {}
    }
}

/// The item of the old list `old` that `item` updates: in a `map` list, the one with the
/// same keys; other lists' items have no identity to follow.
fn correlated_item<'a>(schema: &Value, old: &'a Value, item: &Value) -> Option<&'a Value> {
    if schema["x-kubernetes-list-type"] != "map" {
        return None;
    }
    let keys = schema["x-kubernetes-list-map-keys"].as_array()?;
    old.as_array()?.iter().find(|candidate| {
        keys.iter()
            .filter_map(Value::as_str)
            .all(|key| candidate.get(key) == item.get(key))
    })
}

/// Field errors at the root have no path; apimachinery prints that as `<nil>`.
fn root_field(path: &str) -> String {
    if path.is_empty() {
        "<nil>".into()
    } else {
        path.to_string()
    }
}

/// The rules at one node, `value` being the node's value and `old` its old one.
fn evaluate(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    root: bool,
    errors: &mut Vec<FieldError>,
) {
    let Some(rules) = schema["x-kubernetes-validations"]
        .as_array()
        .filter(|r| !r.is_empty())
    else {
        return;
    };
    let schema_type = schema["type"].as_str().unwrap_or_default();
    let as_cel = |v: &Value| {
        if root {
            resource_to_cel(v, schema)
        } else {
            to_cel(v, schema)
        }
    };
    let mut context = Context::with_env(Arc::clone(&*ENV));
    context.add_variable_from_value("self", as_cel(value));
    if let Some(old) = old {
        context.add_variable_from_value("oldSelf", as_cel(old));
    }
    for rule in rules {
        let Some(source) = rule["rule"].as_str().filter(|r| !r.trim().is_empty()) else {
            continue;
        };
        let program = match compile(source) {
            Ok(program) => program,
            // Not reachable through the API, whose CRD check refuses such a rule; worded as
            // kube-apiserver words a rule its stored CRD cannot compile.
            Err(error) => {
                errors.push(FieldError::invalid(
                    root_field(path),
                    &Value::from(schema_type),
                    &format!("rule compile error: compilation failed: {error}"),
                ));
                continue;
            }
        };
        if old.is_none() && program.references().has_variable("oldSelf") {
            continue;
        }
        match program.execute(&context) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(_) => errors.push(failure(rule, schema, schema_type, path, &context)),
            // Kubernetes' own libraries (quantity, url, isSorted…) are not in the `cel` crate:
            // refusing objects a real server accepts would be worse than not enforcing the rule.
            Err(ExecutionError::UndeclaredReference(name))
                if program.references().has_function(name.as_str()) =>
            {
                tracing::warn!(rule = source, function = %name, "kube-sim does not enforce a CEL rule calling a function it lacks");
            }
            Err(error) => errors.push(FieldError::invalid(
                root_field(path),
                &Value::from(schema_type),
                &evaluation_error(&error, rule),
            )),
        }
    }
}

/// The field error of a rule that did not hold: at its `fieldPath` below the node if it has
/// one, with its `reason`'s type, worded by its `messageExpression` (when that gives a
/// one-line string), its `message`, or the rule itself.
fn failure(
    rule: &Value,
    schema: &Value,
    schema_type: &str,
    path: &str,
    context: &Context,
) -> FieldError {
    let field = match rule["fieldPath"]
        .as_str()
        .and_then(|p| normalized_field_path(p, schema))
    {
        Some(below) => join(path, &below),
        None => root_field(path),
    };
    let message = rule["messageExpression"]
        .as_str()
        .and_then(|source| evaluate_message(source, context))
        .unwrap_or_else(|| message_or_default(rule));
    match rule["reason"].as_str() {
        Some("FieldValueForbidden") => FieldError::forbidden(field, message),
        Some("FieldValueRequired") => FieldError::required_because(field, &message),
        Some("FieldValueDuplicate") => FieldError {
            field,
            reason: "FieldValueDuplicate",
            detail: format!("Duplicate value: {schema_type:?}"),
        },
        _ => FieldError::invalid(field, &Value::from(schema_type), &message),
    }
}

/// A messageExpression's message; None (kube-apiserver then uses the rule's message) when it
/// fails, is not a string, or is empty or has line breaks once trimmed.
fn evaluate_message(source: &str, context: &Context) -> Option<String> {
    let program = compile(source).ok()?;
    match program.execute(context) {
        Ok(cel::Value::String(message)) => {
            let message = message.trim();
            (!message.is_empty() && !message.contains('\n')).then(|| message.to_string())
        }
        other => {
            tracing::debug!(?other, source, "messageExpression gave no message");
            None
        }
    }
}

/// ruleMessageOrDefault: the trimmed message, else `failed rule: <rule>`.
fn message_or_default(rule: &Value) -> String {
    match rule["message"].as_str().map(str::trim) {
        Some(message) if !message.is_empty() => message.to_string(),
        _ => format!("failed rule: {}", rule_error_string(rule)),
    }
}

/// ruleErrorString: how an evaluation error names its rule (its message, if it has one).
fn rule_error_string(rule: &Value) -> String {
    match rule["message"].as_str().map(str::trim) {
        Some(message) if !message.is_empty() => message.to_string(),
        _ => rule["rule"].as_str().unwrap_or_default().trim().to_string(),
    }
}

/// An evaluation error as kube-apiserver words it, with cel-go's wording of the common errors
/// (the `cel` crate's own for the rest).
fn evaluation_error(error: &ExecutionError, rule: &Value) -> String {
    let rule = rule_error_string(rule);
    let error = match error {
        ExecutionError::NoSuchOverload(_) | ExecutionError::UnsupportedBinaryOperator(..) => {
            return format!(
                "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {rule}"
            );
        }
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::DivisionByZero(_) => "division by zero".into(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".into(),
        ExecutionError::Overflow(..) => "integer overflow".into(),
        other => other.to_string(),
    };
    format!("{error} evaluating rule: {rule}")
}

/// A rule's `fieldPath` (`.a.b`, `.m['key']`) as the field path below the rule's node, or None
/// when it names nothing `schema` declares (ValidFieldPath): a declared property is a child
/// (`a.b`), a map's key an index (`m[key]`).
fn normalized_field_path(field_path: &str, schema: &Value) -> Option<String> {
    let mut normalized = String::new();
    let mut schema = schema;
    let mut rest = field_path;
    while !rest.is_empty() {
        let (name, after) = if let Some(quoted) = rest.strip_prefix("['") {
            let end = quoted.find("']")?;
            (&quoted[..end], &quoted[end + 2..])
        } else {
            let named = rest.strip_prefix('.')?;
            let end = named.find(['.', '[']).unwrap_or(named.len());
            (&named[..end], &named[end..])
        };
        if name.is_empty() || name.contains('\\') {
            return None;
        }
        if let Some(properties) = schema["properties"].as_object() {
            schema = properties.get(name)?;
            normalized = join(&normalized, name);
        } else if schema["additionalProperties"].is_object() {
            schema = &schema["additionalProperties"];
            normalized = format!("{normalized}[{name}]");
        } else {
            return None;
        }
        rest = after;
    }
    (!normalized.is_empty()).then_some(normalized)
}

/// A JSON value as the CEL value its schema types it to: an object with properties is an
/// object whose fields are the escaped names of its declared properties (others are not
/// visible), a map (`additionalProperties`) keeps its keys, an integer is an int, a number a
/// double, an array a list; an absent field is absent, so `has()` is false.
fn to_cel(value: &Value, schema: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) if schema["type"] != "number" => cel::Value::Int(i),
            (None, Some(u)) if schema["type"] != "number" => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::from(s.as_str()),
        Value::Array(items) => cel::Value::List(Arc::new(
            items.iter().map(|i| to_cel(i, &schema["items"])).collect(),
        )),
        Value::Object(fields) => {
            let entries: HashMap<Key, cel::Value> = match schema["properties"].as_object() {
                Some(properties) => fields
                    .iter()
                    .filter_map(|(name, field)| {
                        let field_schema = properties.get(name)?;
                        Some((key(escape(name)?), to_cel(field, field_schema)))
                    })
                    .collect(),
                None => fields
                    .iter()
                    .map(|(name, field)| {
                        (
                            key(name.clone()),
                            to_cel(field, &schema["additionalProperties"]),
                        )
                    })
                    .collect(),
            };
            cel::Value::Map(Map {
                map: Arc::new(entries),
            })
        }
    }
}

fn key(name: String) -> Key {
    Key::String(Arc::new(name))
}

/// The resource at the schema's root: its declared properties, plus `apiVersion`, `kind` and
/// the `name` and `generateName` of its metadata, which the root's rules see whatever the
/// schema says of them (model.WithTypeAndObjectMeta).
fn resource_to_cel(object: &Value, schema: &Value) -> cel::Value {
    let cel::Value::Map(declared) = to_cel(object, schema) else {
        return to_cel(object, schema);
    };
    let mut entries = (*declared.map).clone();
    for name in ["apiVersion", "kind"] {
        match object.get(name) {
            Some(Value::String(s)) => {
                entries.insert(key(name.into()), cel::Value::from(s.as_str()))
            }
            _ => entries.remove(&key(name.into())),
        };
    }
    let metadata: HashMap<Key, cel::Value> = ["name", "generateName"]
        .into_iter()
        .filter_map(|name| {
            let value = object["metadata"][name].as_str()?;
            Some((key(name.into()), cel::Value::from(value)))
        })
        .collect();
    entries.insert(
        key("metadata".into()),
        cel::Value::Map(Map {
            map: Arc::new(metadata),
        }),
    );
    cel::Value::Map(Map {
        map: Arc::new(entries),
    })
}

/// The CRD's rules as kube-apiserver checks them when the CRD is written: each one given, its
/// message, reason and fieldPath well formed, and, where those are, its rule and
/// messageExpression compiling. The path of a schema shared by every version is the one
/// kube-apiserver's internal version gives it (`spec.validation.openAPIV3Schema`).
pub(super) fn crd_errors(crd: &Value) -> Vec<FieldError> {
    let versions = crd["spec"]["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut errors = Vec::new();
    let shared = versions
        .split_first()
        .filter(|(first, rest)| rest.iter().all(|v| v["schema"] == first["schema"]));
    match shared {
        Some((first, _)) => check_schema(
            &first["schema"]["openAPIV3Schema"],
            "spec.validation.openAPIV3Schema",
            &mut errors,
        ),
        None => {
            for (i, version) in versions.iter().enumerate() {
                let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
                check_schema(&version["schema"]["openAPIV3Schema"], &path, &mut errors);
            }
        }
    }
    errors
}

fn check_schema(schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if !schema.is_object() {
        return;
    }
    for (key, property) in schema["properties"].as_object().into_iter().flatten() {
        check_schema(property, &format!("{path}.properties[{key}]"), errors);
    }
    check_schema(&schema["items"], &format!("{path}.items"), errors);
    check_schema(
        &schema["additionalProperties"],
        &format!("{path}.additionalProperties"),
        errors,
    );
    let rules = schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten();
    let mut compiled = Vec::new();
    let mut malformed = false;
    for (i, rule) in rules.enumerate() {
        let at = move |field: &str| format!("{path}.x-kubernetes-validations[{i}].{field}");
        let before = errors.len();
        check_rule(rule, schema, &at, errors);
        malformed |= errors.len() > before;
        compiled.push((at, rule));
    }
    // kube-apiserver compiles a node's rules only when they are all well formed.
    if malformed {
        return;
    }
    for (at, rule) in compiled {
        if let Err(error) = compile(rule["rule"].as_str().unwrap_or_default()) {
            errors.push(FieldError::invalid(
                at("rule"),
                rule,
                &format!("compilation failed: {error}"),
            ));
        }
        if let Some(Err(error)) = rule["messageExpression"].as_str().map(compile) {
            errors.push(FieldError::invalid(
                at("messageExpression"),
                rule,
                &format!("messageExpression compilation failed: {error}"),
            ));
        }
    }
}

/// The checks of one rule that need no compiling.
fn check_rule(
    rule: &Value,
    schema: &Value,
    at: &dyn Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) {
    let source = rule["rule"].as_str().unwrap_or_default().trim();
    let given_message = rule["message"].as_str().unwrap_or_default();
    let message = given_message.trim();
    if source.is_empty() {
        errors.push(FieldError::required_because(
            at("rule"),
            "rule is not specified",
        ));
    } else if !given_message.is_empty() && message.is_empty() {
        errors.push(FieldError::invalid(
            at("message"),
            &rule["message"],
            "message must be non-empty if specified",
        ));
    } else if message.contains('\n') {
        errors.push(FieldError::invalid(
            at("message"),
            &rule["message"],
            "message must not contain line breaks",
        ));
    } else if source.contains('\n') && message.is_empty() {
        errors.push(FieldError::required_because(
            at("message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if rule["messageExpression"]
        .as_str()
        .is_some_and(|e| !e.is_empty() && e.trim().is_empty())
    {
        errors.push(FieldError::required_because(
            at("messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
    }
    if let Some(reason) = rule["reason"].as_str()
        && !REASONS.contains(&reason)
    {
        errors.push(FieldError::not_supported(
            at("reason"),
            &rule["reason"],
            &REASONS,
        ));
    }
    if let Some(field_path) = rule["fieldPath"].as_str() {
        let why = if !field_path.is_empty() && field_path.trim().is_empty() {
            Some("fieldPath must be non-empty if specified")
        } else if field_path.contains('\n') {
            Some("fieldPath must not contain line breaks")
        } else if !field_path.is_empty() && normalized_field_path(field_path, schema).is_none() {
            Some("fieldPath must be a valid path")
        } else {
            None
        };
        if let Some(why) = why {
            errors.push(FieldError::invalid(
                at("fieldPath"),
                &rule["fieldPath"],
                why,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `field: detail` of each error, as a Status message lists them.
    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect()
    }

    #[test]
    fn property_names_escape_as_kubernetes_escapes_them() {
        let cases = [
            ("name", Some("name")),
            ("namespace", Some("__namespace__")),
            ("in", Some("__in__")),
            ("x-y", Some("x__dash__y")),
            ("a.b/c", Some("a__dot__b__slash__c")),
            ("a__b", Some("a__underscores__b")),
            ("a___b", Some("a__underscores___b")),
            ("_x", Some("_x")),
            ("1st", None),
            ("", None),
            ("a b", None),
            ("é", None),
        ];
        for (name, escaped) in cases {
            assert_eq!(escape(name).as_deref(), escaped, "{name}");
        }
    }

    /// The schema of the rules' table: rules at the root, on an object, on fields, on list
    /// items and on map values, as the group snapshot CRDs write them.
    fn schema() -> Value {
        json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name != 'forbidden'", "message": "not that name"}],
        "properties": {
            "spec": {"type": "object",
                "x-kubernetes-validations": [
                    {"rule": "(has(self.a) && !has(self.b)) || (!has(self.a) && has(self.b))", "message": "exactly one of a or b"},
                    {"rule": "!has(self.size) || self.size != 13", "reason": "FieldValueForbidden", "fieldPath": ".size"},
                    {"rule": "!has(self.size) || self.size != 14", "reason": "FieldValueRequired", "message": " fourteen "},
                    {"rule": "!has(self.size) || self.size != 15", "reason": "FieldValueDuplicate", "fieldPath": ".labels['k']"},
                    {"rule": "!has(self.size) || self.size != 16 || self.b == 'x'"},
                    {"rule": "!has(self.size) || self.size != 17 || self.size + 'x' == 'y'"},
                    {"rule": "!has(self.size) || self.size != 18 || quantity('1Gi').isInteger()"},
                ],
                "properties": {
                    "a": {"type": "string", "x-kubernetes-validations": [{"rule": "self.matches('^[a-z]+$')"}]},
                    "b": {"type": "string"},
                    "size": {"type": "integer", "x-kubernetes-validations": [
                        {"rule": "self < 100", "messageExpression": "self == 101 ? 'size is 101' : 'size too big'"},
                        {"rule": "self >= oldSelf", "message": "size may only grow"}]},
                    "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 1.5"}]},
                    "driver": {"type": "string", "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "driver is immutable once set"}]},
                    "source": {"type": "object",
                        "x-kubernetes-validations": [{"rule": "has(self.name) && has(self.__namespace__)", "message": "name and namespace"}],
                        "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}}},
                    "names": {"type": "array",
                        "x-kubernetes-validations": [{"rule": "size(self) > 0", "message": "at least one name"}],
                        "items": {"type": "string", "x-kubernetes-validations": [
                            {"rule": "self.startsWith('n')"},
                            {"rule": "self == oldSelf", "message": "never correlated"}]}},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": {"type": "string"},
                            "port": {"type": "integer", "x-kubernetes-validations": [
                                {"rule": "self == oldSelf", "message": "port is immutable"}]}}}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string",
                        "x-kubernetes-validations": [{"rule": "self != 'bad'"}, {"rule": "self == oldSelf", "message": "labels stay"}]}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }},
            "status": {"type": "object", "properties": {
                "phase": {"type": "string", "x-kubernetes-validations": [
                    {"rule": "oldSelf != 'Done' || self == 'Done'", "message": "Done is final"}]}}},
        }})
    }

    fn widget(name: &str, spec: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
    }

    #[test]
    fn rules_hold_or_fail_as_kube_apiserver_words_it() {
        let schema = schema();
        // (case, object, old object on an update, the errors).
        let cases: Vec<(&str, Value, Option<Value>, Vec<&str>)> = vec![
            (
                "a valid create",
                widget("w", json!({"a": "x", "driver": "d", "size": 1})),
                None,
                vec![],
            ),
            (
                "a rule at the root sees the metadata's name",
                widget("forbidden", json!({"a": "x"})),
                None,
                vec!["<nil>: Invalid value: \"object\": not that name"],
            ),
            (
                "exactly one of: both",
                widget("w", json!({"a": "x", "b": "y"})),
                None,
                vec!["spec: Invalid value: \"object\": exactly one of a or b"],
            ),
            (
                "exactly one of: neither",
                widget("w", json!({})),
                None,
                vec!["spec: Invalid value: \"object\": exactly one of a or b"],
            ),
            (
                "transition rules do not run on create",
                widget("w", json!({"a": "x", "driver": "d", "labels": {"k": "v"}})),
                None,
                vec![],
            ),
            (
                "a transition rule on update",
                widget("w", json!({"a": "x", "driver": "other"})),
                Some(widget("w", json!({"a": "x", "driver": "d"}))),
                vec!["spec.driver: Invalid value: \"string\": driver is immutable once set"],
            ),
            (
                "a transition rule where the old object has no value",
                widget("w", json!({"a": "x", "driver": "set-now"})),
                Some(widget("w", json!({"a": "x"}))),
                vec![],
            ),
            (
                "the same value passes a transition rule",
                widget("w", json!({"a": "x", "driver": "d", "size": 2})),
                Some(widget("w", json!({"a": "x", "driver": "d", "size": 1}))),
                vec![],
            ),
            (
                "an int compares with an int",
                widget("w", json!({"a": "x", "size": 1})),
                Some(widget("w", json!({"a": "x", "size": 2}))),
                vec!["spec.size: Invalid value: \"integer\": size may only grow"],
            ),
            (
                "a reserved word is escaped",
                widget("w", json!({"a": "x", "source": {"name": "n"}})),
                None,
                vec!["spec.source: Invalid value: \"object\": name and namespace"],
            ),
            (
                "an escaped reserved word is present",
                widget(
                    "w",
                    json!({"a": "x", "source": {"name": "n", "namespace": "ns"}}),
                ),
                None,
                vec![],
            ),
            (
                "each list item, without a message",
                widget("w", json!({"a": "x", "names": ["n1", "m2", "n3", "x"]})),
                None,
                vec![
                    "spec.names[1]: Invalid value: \"string\": failed rule: self.startsWith('n')",
                    "spec.names[3]: Invalid value: \"string\": failed rule: self.startsWith('n')",
                ],
            ),
            (
                "an empty list",
                widget("w", json!({"a": "x", "names": []})),
                None,
                vec!["spec.names: Invalid value: \"array\": at least one name"],
            ),
            (
                "atomic list items have no old value",
                widget("w", json!({"a": "x", "names": ["n2"]})),
                Some(widget("w", json!({"a": "x", "names": ["n1"]}))),
                vec![],
            ),
            (
                "map list items follow their keys",
                widget(
                    "w",
                    json!({"a": "x", "ports": [{"name": "new", "port": 1}, {"name": "http", "port": 81}]}),
                ),
                Some(widget(
                    "w",
                    json!({"a": "x", "ports": [{"name": "http", "port": 80}]}),
                )),
                vec!["spec.ports[1].port: Invalid value: \"integer\": port is immutable"],
            ),
            (
                "map values, old ones by key",
                widget(
                    "w",
                    json!({"a": "x", "labels": {"k": "bad", "j": "v2", "new": "v"}}),
                ),
                Some(widget(
                    "w",
                    json!({"a": "x", "labels": {"k": "bad", "j": "v1"}}),
                )),
                vec![
                    "spec.labels[j]: Invalid value: \"string\": labels stay",
                    "spec.labels[k]: Invalid value: \"string\": failed rule: self != 'bad'",
                ],
            ),
            (
                "a messageExpression words the message",
                widget("w", json!({"a": "x", "size": 101})),
                None,
                vec!["spec.size: Invalid value: \"integer\": size is 101"],
            ),
            (
                "a number is a double",
                widget("w", json!({"a": "x", "ratio": 2})),
                None,
                vec!["spec.ratio: Invalid value: \"number\": failed rule: self < 1.5"],
            ),
            (
                "a reason and a fieldPath",
                widget("w", json!({"a": "x", "size": 13})),
                None,
                vec!["spec.size: Forbidden: failed rule: !has(self.size) || self.size != 13"],
            ),
            (
                "a Required reason with a trimmed message",
                widget("w", json!({"a": "x", "size": 14})),
                None,
                vec!["spec: Required value: fourteen"],
            ),
            (
                "a Duplicate reason at a map key",
                widget("w", json!({"a": "x", "size": 15})),
                None,
                vec!["spec.labels[k]: Duplicate value: \"object\""],
            ),
            (
                "an absent field is an evaluation error",
                widget("w", json!({"a": "x", "size": 16})),
                None,
                vec![
                    "spec: Invalid value: \"object\": no such key: b evaluating rule: !has(self.size) || self.size != 16 || self.b == 'x'",
                ],
            ),
            (
                "an operator of no overload",
                widget("w", json!({"a": "x", "size": 17})),
                None,
                vec![
                    "spec: Invalid value: \"object\": 'no such overload': call arguments did not match a supported operator, function or macro signature for rule: !has(self.size) || self.size != 17 || self.size + 'x' == 'y'",
                ],
            ),
            (
                "a regular expression",
                widget("w", json!({"a": "X1"})),
                None,
                vec!["spec.a: Invalid value: \"string\": failed rule: self.matches('^[a-z]+$')"],
            ),
            (
                "a function kube-sim lacks leaves its rule unenforced",
                widget("w", json!({"a": "x", "size": 18})),
                None,
                vec![],
            ),
            (
                "a status write",
                json!({"metadata": {"name": "w"}, "spec": {"a": "x"}, "status": {"phase": "Running"}}),
                Some(
                    json!({"metadata": {"name": "w"}, "spec": {"a": "x"}, "status": {"phase": "Done"}}),
                ),
                vec!["status.phase: Invalid value: \"string\": Done is final"],
            ),
            (
                "a null value is not validated",
                widget("w", json!({"a": "x", "driver": null})),
                Some(widget("w", json!({"a": "x", "driver": "d"}))),
                vec![],
            ),
        ];
        for (case, object, old, expected) in cases {
            let errors = validate(&schema, &object, old.as_ref());
            assert_eq!(messages(&errors), expected, "{case}");
        }
    }

    #[test]
    fn crd_rules_are_checked_when_the_crd_is_written() {
        let crd = |rules: Value| {
            json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "driver": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
                    "x-kubernetes-validations": rules}}}}}]}})
        };
        let at = "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations";
        let cases = [
            (
                "rules that compile",
                json!([{"rule": "self.driver == oldSelf.driver", "fieldPath": ".labels['k']", "reason": "FieldValueForbidden"}]),
                vec![],
            ),
            (
                "a syntax error",
                json!([{"rule": "1 +"}]),
                vec![format!(
                    "{at}[0].rule: Invalid value: {{\"rule\":\"1 +\"}}: compilation failed: ERROR: <input>:1:4: Syntax error: mismatched input '<EOF>' expecting {{'[', '{{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}}\n | 1 +\n | ...^"
                )],
            ),
            (
                "a messageExpression that does not compile",
                json!([{"rule": "true", "messageExpression": "'a' +"}]),
                vec![format!(
                    "{at}[0].messageExpression: Invalid value: {{\"messageExpression\":\"'a' +\",\"rule\":\"true\"}}: messageExpression compilation failed: ERROR: <input>:1:6: Syntax error: mismatched input '<EOF>' expecting {{'[', '{{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}}\n | 'a' +\n | .....^"
                )],
            ),
            (
                "an empty rule keeps the others from compiling",
                json!([{"rule": " "}, {"rule": "1 +"}]),
                vec![format!(
                    "{at}[0].rule: Required value: rule is not specified"
                )],
            ),
            (
                "malformed messages, reasons and fieldPaths",
                json!([{"rule": "true", "message": " "}, {"rule": "a ||\nb"}, {"rule": "true", "reason": "Bad"}, {"rule": "true", "fieldPath": ".nope"}]),
                vec![
                    format!(
                        "{at}[0].message: Invalid value: \" \": message must be non-empty if specified"
                    ),
                    format!(
                        "{at}[1].message: Required value: message must be specified if rule contains line breaks"
                    ),
                    format!(
                        "{at}[2].reason: Unsupported value: \"Bad\": supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\""
                    ),
                    format!(
                        "{at}[3].fieldPath: Invalid value: \".nope\": fieldPath must be a valid path"
                    ),
                ],
            ),
        ];
        for (case, rules, expected) in cases {
            assert_eq!(messages(&crd_errors(&crd(rules))), expected, "{case}");
        }
        let two_schemas = json!({"spec": {"versions": [
            {"name": "v1", "schema": {"openAPIV3Schema": {"type": "object"}}},
            {"name": "v2", "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-validations": [{"rule": ""}]}}}]}});
        assert_eq!(
            messages(&crd_errors(&two_schemas)),
            [
                "spec.versions[1].schema.openAPIV3Schema.x-kubernetes-validations[0].rule: Required value: rule is not specified"
            ]
        );
    }
}
