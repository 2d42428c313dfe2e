//! Field selectors (`fieldSelector`): terms and escaping, the field labels each kind accepts,
//! and the values they read from an object.
//!
//! Upstream sources followed (the behaviour, not the code):
//! - field selectors: `k8s.io/apimachinery/pkg/fields/selector.go` (terms, escaping);
//! - which field labels a kind accepts: the field label conversion functions of the scheme,
//!   `pkg/apis/core/v1/conversion.go`, `pkg/apis/events/v1/conversion.go`,
//!   `k8s.io/apimachinery/pkg/runtime/conversion.go` (`DefaultMetaV1FieldSelectorConversion`)
//!   and, for custom resources, `apiextensions-apiserver/pkg/apiserver/conversion/converter.go`;
//! - the value of each field label: the `GetAttrs`/`ToSelectableFields` functions of
//!   `pkg/registry/core/{pod,node,namespace,secret,persistentvolume,...}/strategy.go` and
//!   `pkg/apis/events/selection.go` (formerly `pkg/registry/core/event/strategy.go`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::{SelectorError, go_quote};

/// The operator of one field requirement (`fields/selector.go`: `=` and `==` are the same
/// term).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    Equals,
    DoubleEquals,
    NotEquals,
}

/// One `field<op>value` term; `value` is unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub operator: FieldOperator,
    pub value: String,
}

/// A parsed `fieldSelector`: the AND of its terms. The empty selector matches everything.
///
/// Syntax per `k8s.io/apimachinery/pkg/fields/selector.go` (`ParseSelector`): terms split on
/// unescaped commas, operators `=`, `==`, `!=`, values may escape `\,` `\=` `\\`. Unlike label
/// selectors no whitespace is trimmed: `a = b` names the field `a ` (with a space).
///
/// Which fields exist depends on the kind (see [`FieldSelector::validate_for`]); a field that
/// exists but is unset compares as `""`, so `spec.nodeName=` selects unscheduled pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the string form of a field selector, e.g. `metadata.name=a,status.phase!=Failed`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(text);
        // Upstream sorts the raw terms before parsing; this decides which error is reported
        // first when several terms are wrong.
        parts.sort_unstable();
        let mut requirements = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            let Some((field, operator, raw_value)) = split_term(part) else {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            let value = unescape_value(raw_value)?;
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                operator,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, in upstream's evaluation order (sorted by their raw text).
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The value an `=`/`==` term requires of `field`, if any (upstream `RequiresExactMatch`),
    /// e.g. the name of a `metadata.name=<name>` watch.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator != FieldOperator::NotEquals)
            .map(|r| r.value.as_str())
    }

    /// Checks every field against the field labels kube-apiserver accepts for `kind`.
    ///
    /// `kind` is the object Kind for the core group (`"Pod"`, `"Event"`), or `Kind.group` for
    /// other groups (`"Event.events.k8s.io"`, `"Lease.coordination.k8s.io"`; see
    /// [`qualified_kind`]). Supported:
    /// - `Pod`: `metadata.name`, `metadata.namespace`, `spec.nodeName` (and its old alias
    ///   `spec.host`), `spec.restartPolicy`, `spec.schedulerName`, `spec.serviceAccountName`,
    ///   `spec.hostNetwork`, `status.phase`, `status.podIP`, `status.podIPs`,
    ///   `status.nominatedNodeName`;
    /// - `Node`: `metadata.name`, `spec.unschedulable` (not `metadata.namespace`);
    /// - `Namespace`: `metadata.name`, `status.phase` (not `metadata.namespace`);
    /// - `Secret`: `metadata.name`, `metadata.namespace`, `type`;
    /// - `Event` (core/v1): `metadata.name`, `metadata.namespace`, `involvedObject.{kind,
    ///   namespace,name,uid,apiVersion,resourceVersion,fieldPath}`, `reason`,
    ///   `reportingComponent`, `source`, `type`;
    /// - `Event.events.k8s.io`: `metadata.name`, `metadata.namespace`, `regarding.{kind,
    ///   namespace,name,uid,apiVersion,resourceVersion,fieldPath}`, `reason`,
    ///   `reportingController`, `source`, `type`;
    /// - any other kind (PersistentVolume, PersistentVolumeClaim, ConfigMap, storage.k8s.io,
    ///   ...): `metadata.name`, `metadata.namespace`, with upstream's default message otherwise
    ///   (`"x" is not a known field selector: only "metadata.name", "metadata.namespace"`).
    ///
    /// For custom resources use [`FieldSelector::validate_for_custom_resource`].
    pub fn validate_for(&self, kind: &str) -> Result<(), SelectorError> {
        let kind = KindFields::of(kind);
        self.requirements
            .iter()
            .try_for_each(|r| kind.convert(&r.field).map(drop))
    }

    /// Checks every field against what apiextensions-apiserver accepts for a custom resource:
    /// `metadata.name`, `metadata.namespace` when `namespaced`, and the CRD version's
    /// `selectableFields` (given as their `jsonPath`, with or without the leading `.`).
    pub fn validate_for_custom_resource(
        &self,
        namespaced: bool,
        selectable_fields: &[&str],
    ) -> Result<(), SelectorError> {
        for r in &self.requirements {
            let field = r.field.as_str();
            let ok = field == "metadata.name"
                || (namespaced && field == "metadata.namespace")
                || selectable_fields
                    .iter()
                    .any(|s| s.strip_prefix('.').unwrap_or(s) == field);
            if !ok {
                return Err(not_supported(field));
            }
        }
        Ok(())
    }

    /// Whether `object` (of `kind`, spelled as for [`FieldSelector::validate_for`]) satisfies
    /// every term. Call it with a selector that `validate_for` accepted; fields are read as
    /// the kind's `ToSelectableFields` computes them (e.g. an unset `spec.hostNetwork` is
    /// `"false"`, an unset string field is `""`), any other field (e.g. a custom resource's
    /// selectable field) as the dotted JSON path, with bools and numbers in their string form.
    pub fn matches_object(&self, kind: &str, object: &Value) -> bool {
        let kind = KindFields::of(kind);
        self.requirements.iter().all(|r| {
            let field = kind.convert(&r.field).unwrap_or(&r.field);
            r.matches_value(&kind.value(field, object))
        })
    }

    /// Whether a precomputed field set satisfies every term; a missing field is `""`.
    pub fn matches_fields(&self, fields: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(fields.get(&r.field).map_or("", String::as_str)))
    }
}

impl FieldRequirement {
    fn matches_value(&self, actual: &str) -> bool {
        match self.operator {
            FieldOperator::Equals | FieldOperator::DoubleEquals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for FieldSelector {
    /// Upstream's canonical form: `field=value` / `field!=value` terms with the value escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if r.operator == FieldOperator::NotEquals {
                "!="
            } else {
                "="
            };
            write!(f, "{}{op}{}", r.field, escape_value(&r.value))?;
        }
        Ok(())
    }
}

/// How [`FieldSelector::validate_for`] and [`FieldSelector::matches_object`] spell a kind
/// outside the core group: `Kind.group`.
pub fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// Splits on commas not preceded by a backslash escape.
fn split_terms(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&text[start..i]);
            start = i + 1;
        }
    }
    terms.push(&text[start..]);
    terms
}

/// Finds the first operator; at each position `!=` is tried before `==` before `=`.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    const OPERATORS: [(&str, FieldOperator); 3] = [
        ("!=", FieldOperator::NotEquals),
        ("==", FieldOperator::DoubleEquals),
        ("=", FieldOperator::Equals),
    ];
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        OPERATORS
            .iter()
            .find(|(op, _)| rest.starts_with(op))
            .map(|(op, operator)| (&term[..i], *operator, &rest[op.len()..]))
    })
}

/// Undoes `\\`, `\,` and `\=`; any other escape, a dangling `\`, or a bare `,`/`=` is an error.
fn unescape_value(raw: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' || c == '=' {
            // Upstream prints the rune with %v (its code point); the character reads better.
            return Err(SelectorError::InvalidFieldSelector(format!(
                "invalid field selector: unescaped character in value: {c}"
            )));
        } else {
            out.push(c);
        }
    }
    if escaped {
        return Err(SelectorError::InvalidFieldSelector(
            "invalid field selector: invalid escape sequence: \\".to_owned(),
        ));
    }
    Ok(out)
}

fn escape_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

/// The field labels a kind accepts, and how each one reads from the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KindFields {
    Pod,
    Node,
    Namespace,
    Secret,
    CoreEvent,
    EventsEvent,
    /// Every kind without its own field label conversion.
    Default,
}

const CORE_EVENT_FIELDS: [&str; 13] = [
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.namespace",
    "metadata.name",
];

fn not_supported(field: &str) -> SelectorError {
    SelectorError::FieldLabelNotSupported {
        field: field.to_owned(),
        message: format!("field label not supported: {field}"),
    }
}

impl KindFields {
    fn of(kind: &str) -> Self {
        match kind.split_once('.').unwrap_or((kind, "")) {
            ("Pod", "") => Self::Pod,
            ("Node", "") => Self::Node,
            ("Namespace", "") => Self::Namespace,
            ("Secret", "") => Self::Secret,
            ("Event", "") => Self::CoreEvent,
            ("Event", "events.k8s.io") => Self::EventsEvent,
            _ => Self::Default,
        }
    }

    /// The scheme's field label conversion: accepts a label (possibly renaming it to the name
    /// the registry's field set uses) or rejects it with upstream's message.
    fn convert(self, field: &str) -> Result<&str, SelectorError> {
        match self {
            // pkg/apis/core/v1/conversion.go, Pod; `spec.host` is kept for old v1 clients.
            Self::Pod => match field {
                "metadata.name"
                | "metadata.namespace"
                | "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.podIPs"
                | "status.nominatedNodeName" => Ok(field),
                "spec.host" => Ok("spec.nodeName"),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, Node (cluster-scoped: no metadata.namespace).
            Self::Node => match field {
                "metadata.name" | "spec.unschedulable" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForNamespace.
            Self::Namespace => match field {
                "metadata.name" | "status.phase" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForSecret.
            Self::Secret => match field {
                "metadata.name" | "metadata.namespace" | "type" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForEvent.
            Self::CoreEvent => {
                if CORE_EVENT_FIELDS.contains(&field) {
                    Ok(field)
                } else {
                    Err(not_supported(field))
                }
            }
            // pkg/apis/events/v1/conversion.go: the events.k8s.io names map onto the core
            // Event field set (events.k8s.io shares the core Event storage).
            Self::EventsEvent => match field {
                "reason" | "source" | "type" | "metadata.namespace" | "metadata.name" => Ok(field),
                "reportingController" => Ok("reportingComponent"),
                "regarding.kind" => Ok("involvedObject.kind"),
                "regarding.namespace" => Ok("involvedObject.namespace"),
                "regarding.name" => Ok("involvedObject.name"),
                "regarding.uid" => Ok("involvedObject.uid"),
                "regarding.apiVersion" => Ok("involvedObject.apiVersion"),
                "regarding.resourceVersion" => Ok("involvedObject.resourceVersion"),
                "regarding.fieldPath" => Ok("involvedObject.fieldPath"),
                _ => Err(not_supported(field)),
            },
            // k8s.io/apimachinery/pkg/runtime/conversion.go, DefaultMetaV1FieldSelectorConversion.
            Self::Default => match field {
                "metadata.name" | "metadata.namespace" => Ok(field),
                _ => Err(SelectorError::FieldLabelNotSupported {
                    field: field.to_owned(),
                    message: format!(
                        "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                        go_quote(field)
                    ),
                }),
            },
        }
    }

    /// The value of a (converted) field label, as the registry's `ToSelectableFields` computes
    /// it from the typed object.
    fn value<'a>(self, field: &str, object: &'a Value) -> Cow<'a, str> {
        match (self, field) {
            // pkg/registry/core/pod/strategy.go: hostNetwork is a bool, false when unset.
            (Self::Pod, "spec.hostNetwork") => bool_field(object, &["spec", "hostNetwork"]),
            // The v1 -> internal conversion fills serviceAccountName from the deprecated
            // serviceAccount when it is empty.
            (Self::Pod, "spec.serviceAccountName") => first_non_empty(
                object,
                &[&["spec", "serviceAccountName"], &["spec", "serviceAccount"]],
            ),
            // The registry reads the first of the internal podIPs; converting from v1, a
            // non-empty podIP is authoritative, else the first of podIPs.
            (Self::Pod, "status.podIP") => first_non_empty(
                object,
                &[&["status", "podIP"], &["status", "podIPs", "0", "ip"]],
            ),
            // Accepted by the conversion but never put in the pod field set: always "".
            (Self::Pod, "status.podIPs") => Cow::Borrowed(""),
            // pkg/registry/core/node/strategy.go: unschedulable is a bool, false when unset.
            (Self::Node, "spec.unschedulable") => bool_field(object, &["spec", "unschedulable"]),
            (Self::CoreEvent | Self::EventsEvent, _) => self.event_value(field, object),
            _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
        }
    }

    /// pkg/apis/events/selection.go `EventToSelectableFields`: `source` is the source
    /// component, else the reporting controller. The object may be in core/v1 or in
    /// events.k8s.io/v1 shape (`regarding`, `reportingController`, `deprecatedSource`); its
    /// apiVersion decides, else the requested kind.
    fn event_value<'a>(self, field: &str, object: &'a Value) -> Cow<'a, str> {
        let events_shape = match object.get("apiVersion").and_then(Value::as_str) {
            Some(api_version) => api_version.starts_with("events.k8s.io/"),
            None => self == Self::EventsEvent,
        };
        if events_shape {
            if let Some(rest) = field.strip_prefix("involvedObject.") {
                return string_field(object, &["regarding", rest]);
            }
            match field {
                "reportingComponent" => string_field(object, &["reportingController"]),
                "source" => first_non_empty(
                    object,
                    &[&["deprecatedSource", "component"], &["reportingController"]],
                ),
                _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
            }
        } else {
            match field {
                "source" => {
                    first_non_empty(object, &[&["source", "component"], &["reportingComponent"]])
                }
                _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
            }
        }
    }
}

/// Walks object keys; a numeric segment indexes an array.
fn path<'a>(object: &'a Value, segments: &[&str]) -> Option<&'a Value> {
    segments.iter().try_fold(object, |v, s| match v {
        Value::Array(items) => s.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => v.get(*s),
    })
}

/// A field in string form: strings as they are, bools `true`/`false`, numbers in decimal;
/// absent, null or structured values are `""`.
fn string_field<'a>(object: &'a Value, segments: &[&str]) -> Cow<'a, str> {
    match path(object, segments) {
        Some(Value::String(s)) => Cow::Borrowed(s),
        Some(Value::Bool(b)) => Cow::Borrowed(if *b { "true" } else { "false" }),
        Some(Value::Number(n)) => Cow::Owned(n.to_string()),
        _ => Cow::Borrowed(""),
    }
}

/// A Go bool field: `false` unless it is `true`.
fn bool_field<'a>(object: &'a Value, segments: &[&str]) -> Cow<'a, str> {
    let value = path(object, segments)
        .is_some_and(|v| v == &Value::Bool(true) || v.as_str() == Some("true"));
    Cow::Borrowed(if value { "true" } else { "false" })
}

fn first_non_empty<'a>(object: &'a Value, candidates: &[&[&str]]) -> Cow<'a, str> {
    candidates
        .iter()
        .map(|segments| string_field(object, segments))
        .find(|v| !v.is_empty())
        .unwrap_or(Cow::Borrowed(""))
}

#[cfg(test)]
mod tests;
