//! Resources one API group serves from another's storage, converted at the API boundary as
//! kube-apiserver does: events.k8s.io/v1 Events are core/v1 Events in storage
//! (pkg/registry/events/rest/storage_events.go serves them with the core event registry), so
//! an Event written through either group is read, listed and watched through both. A custom
//! resource of a CRD with several versions (conversion None) is served through each: its
//! `apiVersion` rewritten, pruned by the version's schema (apiextensions-apiserver's
//! `schemaCoercingConverter`).

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::resources::ResourceType;

/// core/v1 Event field ⇔ events.k8s.io/v1 Event field, for the fields whose names differ
/// (pkg/apis/events/v1/conversion.go; `reportingComponent` is the core/v1 JSON name of the
/// internal ReportingController, k8s.io/api/core/v1/types.go).
const RENAMED: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("source", "deprecatedSource"),
    ("message", "note"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Fields both versions name alike.
const SHARED: [&str; 7] = [
    "reason",
    "type",
    "series",
    "eventTime",
    "reportingInstance",
    "related",
    "action",
];

/// Fields the Go types serialize even when empty (no `omitempty`, or a struct or
/// `metav1.Time`, which `omitempty` does not drop), with their empty value.
const CORE_ALWAYS: [&str; 7] = [
    "involvedObject",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "reportingComponent",
    "reportingInstance",
];
const EVENTS_ALWAYS: [&str; 5] = [
    "eventTime",
    "regarding",
    "deprecatedSource",
    "deprecatedFirstTimestamp",
    "deprecatedLastTimestamp",
];

/// Empty value of an always-serialized field: structs are `{}`, strings `""`, times `null`.
fn empty(field: &str) -> Value {
    match field {
        "involvedObject" | "source" | "regarding" | "deprecatedSource" => json!({}),
        "reportingComponent" | "reportingInstance" => json!(""),
        _ => Value::Null,
    }
}

/// True for resources stored as another group's (events.k8s.io Events).
fn is_converted(rt: &ResourceType) -> bool {
    rt.storage_group() != rt.group
}

/// The resource whose storage (and registry semantics) serves `rt`: itself, but for
/// events.k8s.io Events, which are core/v1 Events.
pub fn storage_type(rt: &ResourceType) -> ResourceType {
    if is_converted(rt) {
        ResourceType {
            group: rt.storage_group().into(),
            version: "v1".into(),
            ..rt.clone()
        }
    } else {
        rt.clone()
    }
}

fn is_core_event(rt: &ResourceType) -> bool {
    rt.kind == "Event" && rt.storage_group().is_empty()
}

/// The object as clients of `rt` send it, in storage shape. Events are stored in the shape
/// the core/v1 Go type serializes to, so that reading and writing back unchanged is a no-op.
pub fn to_storage(rt: &ResourceType, object: Value) -> Value {
    match object {
        Value::Object(secret) if rt.group.is_empty() && rt.kind == "Secret" => {
            Value::Object(merge_string_data(secret))
        }
        Value::Object(from) if is_core_event(rt) => {
            let events = is_converted(rt);
            Value::Object(reshape(
                from,
                "v1",
                |core, events_name| {
                    if events { events_name } else { core }
                },
            ))
        }
        other => other,
    }
}

/// A Secret's write-only `stringData` is merged into `data`, winning over it, and never
/// stored (Convert_v1_Secret_To_core_Secret, pkg/apis/core/v1/conversion.go).
fn merge_string_data(mut secret: Map<String, Value>) -> Map<String, Value> {
    use base64::Engine;
    let Some(Value::Object(strings)) = secret.remove("stringData") else {
        return secret;
    };
    let data = secret
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    if let Value::Object(data) = data {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(key, Value::String(encoded));
        }
    }
    secret
}

/// A stored object as clients of `rt` read it.
pub fn to_served<'a>(rt: &ResourceType, object: &'a Value) -> Cow<'a, Value> {
    match object.as_object() {
        Some(from) if is_converted(rt) => Cow::Owned(Value::Object(reshape(
            from.clone(),
            &rt.api_version(),
            |core, _| core,
        ))),
        Some(_)
            if object["apiVersion"]
                .as_str()
                .is_some_and(|v| v != rt.api_version()) =>
        {
            let mut served = object.clone();
            served["apiVersion"] = json!(rt.api_version());
            if let Some(schema) = &rt.schema {
                crate::apiserver::schema::prune_object(schema, &mut served);
            }
            Cow::Owned(served)
        }
        _ => Cow::Borrowed(object),
    }
}

/// Rebuilds an Event in the shape of `api_version` (`v1`: core, else events.k8s.io), taking
/// each renamed field from the name `source_name(core, events)` picks.
fn reshape(
    mut from: Map<String, Value>,
    api_version: &str,
    source_name: impl Fn(&'static str, &'static str) -> &'static str,
) -> Map<String, Value> {
    let core = api_version == "v1";
    let mut to = Map::new();
    copy_common(&mut from, &mut to, api_version);
    for (core_name, events_name) in RENAMED {
        if let Some(value) = from.remove(source_name(core_name, events_name)) {
            to.insert(if core { core_name } else { events_name }.into(), value);
        }
    }
    for field in SHARED {
        if let Some(value) = from.remove(field) {
            to.insert(field.into(), value);
        }
    }
    let always: &[&str] = if core { &CORE_ALWAYS } else { &EVENTS_ALWAYS };
    for field in always {
        let value = to.remove(*field).filter(|v| !v.is_null());
        to.insert((*field).into(), value.unwrap_or_else(|| empty(field)));
    }
    drop_empty_strings(&mut to, core);
    to
}

fn copy_common(from: &mut Map<String, Value>, to: &mut Map<String, Value>, api_version: &str) {
    to.insert("kind".into(), json!("Event"));
    to.insert("apiVersion".into(), json!(api_version));
    if let Some(metadata) = from.remove("metadata") {
        to.insert("metadata".into(), metadata);
    }
}

/// `omitempty` strings of the events.k8s.io type (`reportingController`, `note`, …) vanish
/// when empty; the core type's `reportingComponent`/`reportingInstance` do not.
fn drop_empty_strings(to: &mut Map<String, Value>, core: bool) {
    to.retain(|field, value| {
        let always = core && matches!(field.as_str(), "reportingComponent" | "reportingInstance");
        always || value.as_str().is_none_or(|s| !s.is_empty())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    fn events_rt() -> ResourceType {
        builtin()
            .into_iter()
            .find(|t| t.group == "events.k8s.io")
            .unwrap()
    }

    #[test]
    fn events_group_round_trips_through_core_storage() {
        let rt = events_rt();
        let sent = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "csi-attacher", "reportingInstance": "csi-attacher-1",
            "action": "Attach", "reason": "Attached", "type": "Normal", "note": "attached",
            "regarding": {"kind": "Pod", "name": "p"},
            "related": {"kind": "Node", "name": "n"},
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"},
            "deprecatedSource": {"component": "kubelet", "host": "n"},
            "deprecatedCount": 3,
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:00:02Z",
        });
        let stored = to_storage(&rt, sent.clone());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["source"]["component"], "kubelet");
        assert_eq!(stored["reportingComponent"], "csi-attacher");
        assert_eq!(stored["message"], "attached");
        assert_eq!(stored["count"], 3);
        assert_eq!(stored["firstTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(*to_served(&rt, &stored), sent);
        let core = storage_type(&rt);
        let served = to_served(&core, &stored);
        assert_eq!(served["involvedObject"]["kind"], "Pod");
        assert_eq!(served["series"]["count"], 2);
    }

    #[test]
    fn secret_string_data_is_merged_into_data() {
        let rt = builtin().into_iter().find(|t| t.kind == "Secret").unwrap();
        let sent = json!({"metadata": {"name": "s"}, "data": {"a": "b2xk", "keep": "eA=="},
            "stringData": {"a": "new", "b": "two"}});
        let stored = to_storage(&rt, sent);
        assert_eq!(
            stored,
            json!({"metadata": {"name": "s"}, "data": {"a": "bmV3", "keep": "eA==", "b": "dHdv"}})
        );
    }

    #[test]
    fn always_serialized_fields_are_filled() {
        let rt = events_rt();
        let core = storage_type(&rt);
        let sent = json!({"metadata": {"name": "e"}, "message": "m", "unknown": 1});
        let stored = to_storage(&core, sent);
        assert_eq!(stored["involvedObject"], json!({}));
        assert_eq!(stored["reportingComponent"], "");
        assert!(stored.get("count").is_none() && stored.get("unknown").is_none());
        let served = to_served(&rt, &stored);
        assert_eq!(served["regarding"], json!({}));
        assert_eq!(served["deprecatedSource"], json!({}));
        assert!(served["eventTime"].is_null() && served.get("eventTime").is_some());
        assert!(served.get("reportingController").is_none());
        assert_eq!(served["note"], "m");
    }
}
