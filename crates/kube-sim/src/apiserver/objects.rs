//! The object semantics of kube-apiserver's registry (k8s.io/apiserver/pkg/registry/rest and
//! generic/registry/store.go): what create, update, patch and delete do to an object's
//! metadata, as pure functions over JSON.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::names::{is_dns1123_label, is_dns1123_subdomain};
use crate::resources::ResourceType;

/// kube-apiserver's time format for `metav1.Time`: RFC 3339 with whole seconds.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(now)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(seconds: u64) -> String {
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// `generateName` suffix: 5 characters from apimachinery's rand.String alphabet (no vowels, no
/// ambiguous characters; k8s.io/apiserver/pkg/storage/names/generate.go).
pub fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let random = uuid::Uuid::new_v4();
    random.as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// Fills in what create sets: name (from generateName), namespace, uid, creationTimestamp,
/// generation, kind/apiVersion, and per-kind defaults of the status. Validates the name
/// (k8s.io/apiserver/pkg/registry/rest/create.go BeforeCreate; names:
/// https://kubernetes.io/docs/concepts/overview/working-with-objects/names/).
pub fn prepare_create(
    rt: &ResourceType,
    namespace: Option<&str>,
    mut object: Value,
) -> Result<Value, ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    if let Some(kind) = object["kind"].as_str()
        && !kind.is_empty()
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind {kind:?} does not match the resource {}",
            rt.plural
        )));
    }
    object["kind"] = json!(rt.kind);
    object["apiVersion"] = json!(rt.api_version());
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let meta = &mut object["metadata"];
    if let (Some(path_ns), Some(body_ns)) = (namespace, meta["namespace"].as_str())
        && !body_ns.is_empty()
        && body_ns != path_ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let name = match (
        meta["name"].as_str().filter(|n| !n.is_empty()),
        meta["generateName"].as_str(),
    ) {
        (Some(name), _) => name.to_string(),
        (None, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", generated_suffix()),
        _ => {
            return Err(ApiError::invalid(
                &rt.kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
    };
    let valid = if rt.kind == "Namespace" {
        is_dns1123_label(&name)
    } else {
        is_dns1123_subdomain(&name)
    };
    if !valid {
        return Err(ApiError::invalid(
            &rt.kind,
            &name,
            format!(
                "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 name must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
    meta["name"] = json!(name);
    match namespace {
        Some(ns) => meta["namespace"] = json!(ns),
        None => {
            if let Some(m) = meta.as_object_mut() {
                m.remove("namespace");
            }
        }
    }
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(now_rfc3339());
    if let Some(m) = meta.as_object_mut() {
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("resourceVersion");
    }
    if has_spec(rt) {
        meta["generation"] = json!(1);
    }
    default_status(rt, &mut object);
    default_spec(rt, &mut object);
    if rt.group.is_empty() && rt.kind == "PersistentVolumeClaim" {
        normalize_data_sources(&mut object["spec"]);
    }
    Ok(object)
}

/// What the claim strategy's PrepareForCreate does to a new claim's data sources
/// (pkg/api/persistentvolumeclaim/util.go, AnyVolumeDataSource): a `dataSource` of any kind
/// but a claim or a VolumeSnapshot is dropped, as before populators (they are named in
/// `dataSourceRef`); then each of the two fields is filled from the other, but for a
/// `dataSourceRef` into another namespace, which `dataSource` cannot name.
fn normalize_data_sources(spec: &mut Value) {
    let is_claim_or_snapshot = |source: &Value| {
        let group = source["apiGroup"].as_str().unwrap_or_default();
        match source["kind"].as_str() {
            Some("PersistentVolumeClaim") => group.is_empty(),
            Some("VolumeSnapshot") => group == "snapshot.storage.k8s.io",
            _ => false,
        }
    };
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    if spec
        .get("dataSource")
        .is_some_and(|source| !source.is_null() && !is_claim_or_snapshot(source))
    {
        spec.remove("dataSource");
    }
    let local = |source: &Value| {
        let mut copy = serde_json::Map::new();
        for field in ["apiGroup", "kind", "name"] {
            if let Some(value) = source.get(field).filter(|v| !v.is_null()) {
                copy.insert(field.to_string(), value.clone());
            }
        }
        Value::Object(copy)
    };
    let set = |field: &str, spec: &serde_json::Map<String, Value>| {
        spec.get(field).is_some_and(|v| !v.is_null())
    };
    match (set("dataSource", spec), set("dataSourceRef", spec)) {
        (true, false) => {
            let copy = local(&spec["dataSource"]);
            spec.insert("dataSourceRef".to_string(), copy);
        }
        (false, true)
            if spec["dataSourceRef"]["namespace"]
                .as_str()
                .is_none_or(str::is_empty) =>
        {
            let copy = local(&spec["dataSourceRef"]);
            spec.insert("dataSource".to_string(), copy);
        }
        _ => {}
    }
}

/// Built-in kinds whose Go type holds the spec as a struct value, so a real server always
/// stores and returns one (`{}` at least): a JSON patch that adds `/spec/taints` to a Node
/// created without a spec succeeds there.
fn default_spec(rt: &ResourceType, object: &mut Value) {
    let struct_spec = match rt.group.as_str() {
        "" => matches!(
            rt.kind.as_str(),
            "Node"
                | "Pod"
                | "PersistentVolume"
                | "PersistentVolumeClaim"
                | "Namespace"
                | "Service"
                | "ReplicationController"
        ),
        "apps" => rt.kind != "ControllerRevision",
        "storage.k8s.io" => matches!(
            rt.kind.as_str(),
            "CSIDriver" | "CSINode" | "VolumeAttachment"
        ),
        "coordination.k8s.io" => rt.kind == "Lease",
        _ => false,
    };
    if struct_spec && !object["spec"].is_object() {
        object["spec"] = json!({});
    }
    // pkg/apis/core/v1/defaults.go SetDefaults_PersistentVolume(Claim): every body decoded,
    // so an update that drops these gets them back.
    if rt.group.is_empty()
        && matches!(
            rt.kind.as_str(),
            "PersistentVolume" | "PersistentVolumeClaim"
        )
    {
        let spec = &mut object["spec"];
        if spec["volumeMode"].is_null() {
            spec["volumeMode"] = json!("Filesystem");
        }
        if rt.kind == "PersistentVolume"
            && spec["persistentVolumeReclaimPolicy"]
                .as_str()
                .is_none_or(str::is_empty)
        {
            spec["persistentVolumeReclaimPolicy"] = json!("Retain");
        }
    }
}

/// Kinds whose objects carry a generation: those with a spec whose strategies set it to 1 on
/// create and bump it on spec changes. The persistent volume kinds' strategies do not (a real
/// server leaves their `metadata.generation` unset).
fn has_spec(rt: &ResourceType) -> bool {
    !matches!(
        rt.kind.as_str(),
        "ConfigMap"
            | "Secret"
            | "Event"
            | "ServiceAccount"
            | "Namespace"
            | "PersistentVolumeClaim"
            | "PersistentVolume"
            | "VolumeAttributesClass"
    )
}

/// The phase a new object starts in (the kinds' PrepareForCreate in pkg/registry/core/pod,
/// persistentvolume, persistentvolumeclaim and namespace strategy.go).
fn default_status(rt: &ResourceType, object: &mut Value) {
    let phase = match rt.kind.as_str() {
        "Pod" | "PersistentVolumeClaim" | "PersistentVolume" => "Pending",
        "Namespace" => "Active",
        _ => return,
    };
    if !object["status"].is_object() {
        object["status"] = json!({});
    }
    if object["status"]["phase"].as_str().is_none_or(str::is_empty) {
        object["status"]["phase"] = json!(phase);
    }
}

/// Metadata fields an update cannot change (registry/rest/update.go, ObjectMeta strategy).
const IMMUTABLE_METADATA: [&str; 6] = [
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "namespace",
];

/// The object an update (PUT or patch) stores: `incoming` as sent, with immutable metadata
/// from `current`; on the main resource the status of kinds with a status subresource is
/// kept, on `/status` only the status is taken — but for claims everything but the spec, as
/// their status strategy only resets the spec (metadata written through `/status` is kept). Bumps generation when the spec changed
/// (https://kubernetes.io/docs/concepts/overview/working-with-objects/#object-spec-and-status;
/// status subresource: pkg/registry/core/persistentvolumeclaim/strategy.go
/// PrepareForUpdate/statusStrategy).
pub fn prepare_update(
    rt: &ResourceType,
    current: &Value,
    incoming: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    let name = current["metadata"]["name"].as_str().unwrap_or_default();
    if !incoming.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    if let Some(sent) = incoming["metadata"]["name"].as_str()
        && sent != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({sent}) does not match the name on the URL ({name})"
        )));
    }
    let status_keeps_metadata = rt.group.is_empty() && rt.kind == "PersistentVolumeClaim";
    let mut next = if status_only && !status_keeps_metadata {
        let mut next = current.clone();
        next["status"] = incoming["status"].clone();
        next
    } else {
        let mut next = incoming;
        if !next["metadata"].is_object() {
            next["metadata"] = json!({});
        }
        for field in IMMUTABLE_METADATA {
            match current["metadata"].get(field) {
                Some(value) => next["metadata"][field] = value.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        next["metadata"]["name"] = json!(name);
        if status_only {
            match current.get("spec") {
                Some(spec) => next["spec"] = spec.clone(),
                None => {
                    if let Some(m) = next.as_object_mut() {
                        m.remove("spec");
                    }
                }
            }
        } else if rt.has_status() {
            match current.get("status") {
                Some(status) => next["status"] = status.clone(),
                None => {
                    if let Some(m) = next.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        next
    };
    next["kind"] = json!(rt.kind);
    next["apiVersion"] = json!(rt.api_version());
    default_spec(rt, &mut next);
    if has_spec(rt) && spec_of(&next) != spec_of(current) {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        next["metadata"]["generation"] = json!(generation + 1);
    }
    Ok(next)
}

/// Everything but metadata and status: what generation tracks.
fn spec_of(object: &Value) -> Value {
    let mut spec = object.clone();
    if let Some(map) = spec.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("kind");
        map.remove("apiVersion");
    }
    spec
}

/// The `metadata.resourceVersion` a write must match, if the client sent one.
pub fn expected_version(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .filter(|v| !v.is_empty())
}

pub fn finalizers(object: &Value) -> Vec<&str> {
    object["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

pub fn is_deleting(object: &Value) -> bool {
    object["metadata"]["deletionTimestamp"].is_string()
}

/// DeleteOptions from the body (may be empty) and the query
/// (k8s.io/apimachinery/pkg/apis/meta/v1/types.go DeleteOptions).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

impl DeleteOptions {
    pub fn parse(body: &[u8], query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        let grace = body["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
        let propagation = body["propagationPolicy"]
            .as_str()
            .map(str::to_string)
            .or_else(|| query.get("propagationPolicy").cloned())
            .or_else(|| match body["orphanDependents"].as_bool() {
                Some(true) => Some("Orphan".into()),
                _ => None,
            });
        if let Some(policy) = &propagation
            && !matches!(policy.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::bad_request(format!(
                "unknown propagationPolicy {policy:?}"
            )));
        }
        Ok(Self {
            grace_period_seconds: grace,
            propagation,
            precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_string),
            precondition_resource_version: body["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_string),
        })
    }

    /// Preconditions: the object must still be the one the client meant
    /// (k8s.io/apiserver/pkg/storage/interfaces.go Preconditions.Check).
    pub fn check(&self, rt: &ResourceType, object: &Value) -> Result<(), ApiError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(uid) = &self.precondition_uid {
            let actual = object["metadata"]["uid"].as_str().unwrap_or_default();
            if uid != actual {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(version) = &self.precondition_resource_version {
            let actual = object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default();
            if version != actual {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {version}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    fn rt(plural: &str) -> ResourceType {
        builtin()
            .into_iter()
            .find(|t| t.plural == plural && t.group.is_empty())
            .unwrap()
    }

    #[test]
    fn times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_334_400), "2026-11-22T08:00:00Z");
    }

    #[test]
    fn claim_data_sources_are_normalized_on_create() {
        let claim_source = json!({"kind": "PersistentVolumeClaim", "name": "src"});
        let snapshot =
            json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"});
        let populator =
            json!({"apiGroup": "populators.example.com", "kind": "Sample", "name": "p"});
        let elsewhere = json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s", "namespace": "other"});
        let wrong_group = json!({"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "s"});
        // (dataSource, dataSourceRef) sent -> stored.
        let cases = [
            ((None, None), (None, None)),
            (
                (Some(&claim_source), None),
                (Some(&claim_source), Some(&claim_source)),
            ),
            ((Some(&snapshot), None), (Some(&snapshot), Some(&snapshot))),
            ((Some(&populator), None), (None, None)),
            ((Some(&wrong_group), None), (None, None)),
            (
                (None, Some(&populator)),
                (Some(&populator), Some(&populator)),
            ),
            ((None, Some(&elsewhere)), (None, Some(&elsewhere))),
            (
                (Some(&populator), Some(&snapshot)),
                (Some(&snapshot), Some(&snapshot)),
            ),
            (
                (Some(&claim_source), Some(&populator)),
                (Some(&claim_source), Some(&populator)),
            ),
        ];
        for ((source, reference), (stored_source, stored_reference)) in cases {
            let mut spec = json!({"accessModes": ["ReadWriteOnce"]});
            if let Some(source) = source {
                spec["dataSource"] = source.clone();
            }
            if let Some(reference) = reference {
                spec["dataSourceRef"] = reference.clone();
            }
            let claim = prepare_create(
                &rt("persistentvolumeclaims"),
                Some("default"),
                json!({"metadata": {"name": "c"}, "spec": spec}),
            )
            .unwrap();
            let sent = (source, reference);
            assert_eq!(claim["spec"].get("dataSource"), stored_source, "{sent:?}");
            assert_eq!(
                claim["spec"].get("dataSourceRef"),
                stored_reference,
                "{sent:?}"
            );
        }
    }

    #[test]
    fn create_fills_metadata_and_defaults() {
        let pod = prepare_create(
            &rt("pods"),
            Some("default"),
            json!({"metadata": {"generateName": "web-"}, "spec": {}}),
        )
        .unwrap();
        let name = pod["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert_eq!(pod["metadata"]["generation"], 1);
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(pod["apiVersion"], "v1");
        assert!(
            pod["metadata"]["uid"].is_string() && pod["metadata"]["creationTimestamp"].is_string()
        );
        let missing =
            prepare_create(&rt("pods"), Some("default"), json!({"metadata": {}})).unwrap_err();
        assert_eq!(missing.code.as_u16(), 422);
        let bad = prepare_create(
            &rt("configmaps"),
            Some("default"),
            json!({"metadata": {"name": "Bad_Name"}}),
        )
        .unwrap_err();
        assert_eq!(bad.code.as_u16(), 422);
        let mismatch = prepare_create(
            &rt("configmaps"),
            Some("a"),
            json!({"metadata": {"name": "x", "namespace": "b"}}),
        )
        .unwrap_err();
        assert_eq!(mismatch.code.as_u16(), 400);
    }

    #[test]
    fn update_keeps_immutable_fields_and_status_and_bumps_generation() {
        let pods = rt("pods");
        let current = prepare_create(
            &pods,
            Some("ns"),
            json!({"metadata": {"name": "c"}, "spec": {"a": 1}, "status": {"phase": "Bound"}}),
        )
        .unwrap();
        let incoming = json!({"metadata": {"name": "c", "uid": "forged", "labels": {"x": "y"}}, "spec": {"a": 2}, "status": {"phase": "Lost"}});
        let next = prepare_update(&pods, &current, incoming, false).unwrap();
        assert_eq!(next["metadata"]["uid"], current["metadata"]["uid"]);
        assert_eq!(next["metadata"]["labels"]["x"], "y");
        assert_eq!(
            next["status"]["phase"], "Bound",
            "status ignored on the main resource"
        );
        assert_eq!(next["metadata"]["generation"], 2);
        let status = prepare_update(
            &pods,
            &current,
            json!({"metadata": {"name": "c"}, "spec": {"a": 9}, "status": {"phase": "Lost"}}),
            true,
        )
        .unwrap();
        assert_eq!(status["status"]["phase"], "Lost");
        assert_eq!(status["spec"]["a"], 1, "spec ignored on /status");
        assert_eq!(status["metadata"]["generation"], 1);
        let renamed = prepare_update(
            &pods,
            &current,
            json!({"metadata": {"name": "other"}}),
            false,
        )
        .unwrap_err();
        assert_eq!(renamed.code.as_u16(), 400);
    }

    #[test]
    fn delete_options() {
        let none = HashMap::new();
        let options = DeleteOptions::parse(br#"{"gracePeriodSeconds": 0, "propagationPolicy": "Foreground", "preconditions": {"uid": "u1"}}"#, &none).unwrap();
        assert_eq!(options.grace_period_seconds, Some(0));
        assert_eq!(options.propagation.as_deref(), Some("Foreground"));
        let object = json!({"metadata": {"name": "x", "uid": "u2", "resourceVersion": "5"}});
        assert_eq!(
            options
                .check(&rt("pods"), &object)
                .unwrap_err()
                .code
                .as_u16(),
            409
        );
        let query = HashMap::from([("propagationPolicy".to_string(), "Orphan".to_string())]);
        assert_eq!(
            DeleteOptions::parse(b"", &query)
                .unwrap()
                .propagation
                .as_deref(),
            Some("Orphan")
        );
        assert!(DeleteOptions::parse(br#"{"propagationPolicy": "Sometimes"}"#, &none).is_err());
    }
}
