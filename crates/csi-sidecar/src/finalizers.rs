//! Finalizer edits on objects other controllers also write, so that a finalizer someone else
//! added or removed meanwhile is never lost or brought back (external-provisioner #1217). On
//! built-in kinds one finalizer is added or removed by value with a strategic merge patch
//! ([`add_builtin_finalizer`], [`remove_builtin_finalizer`]): nothing to guard, so nothing to
//! fail when another controller changed the list (pv-protection's finalizer leaves a PV being
//! deleted at the moment ours does). Custom resources take no strategic merge: their lists
//! are replaced by a JSON patch guarded by a `test` of the list read, which fails and is
//! retried from fresh state after a concurrent change.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::writes::patch_or_update;

#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    #[error("updating the finalizers of {0}: forbidden")]
    Forbidden(String),
    #[error("updating the finalizers of {0}: {1}")]
    Failed(String, kube::Error),
    #[error("getting {0}: {1}")]
    Get(String, kube::Error),
    #[error("building the finalizer patch: {0}")]
    Patch(String),
}

impl FinalizerError {
    /// What went wrong, without our context: the API's refusal as client-go prints it, for
    /// texts that quote upstream's (`could not add PersistentVolume finalizer: <cause>`).
    pub fn cause(&self) -> String {
        match self {
            Self::Failed(_, error) | Self::Get(_, error) => {
                crate::api_errors::GoApiError(error).to_string()
            }
            Self::Forbidden(_) | Self::Patch(_) => self.to_string(),
        }
    }
}

/// `finalizers` without `finalizer`.
pub fn without(finalizers: &[String], finalizer: &str) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect()
}

/// Removes one finalizer from the current object (a GET: the caller's copy may be stale), as
/// [`remove_finalizer_from`] does.
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    name: &str,
    finalizer: &str,
) -> Result<(), FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(current) = api
        .get_opt(name)
        .await
        .map_err(|e| FinalizerError::Get(name.to_string(), e))?
    else {
        return Ok(());
    };
    remove_finalizer_from(api, &current, finalizer).await?;
    Ok(())
}

/// Sets an object's finalizers, guarded by a `test` of the current list (others may add
/// theirs): a concurrent change fails the patch and the sync is retried from fresh state.
pub async fn set_finalizers<K>(
    api: &Api<K>,
    object: &K,
    finalizers: Vec<String>,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    set_finalizers_and_annotations(api, object, finalizers, &BTreeMap::new()).await
}

/// [`set_finalizers`] that also sets (`Some`) or removes (`None`) annotations in the same
/// patch, so what a finalizer needs is written with it, in one request.
pub async fn set_finalizers_and_annotations<K>(
    api: &Api<K>,
    object: &K,
    finalizers: Vec<String>,
    annotations: &BTreeMap<&str, Option<String>>,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let patch = guarded_patch(object.meta(), &finalizers, annotations);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| FinalizerError::Patch(e.to_string()))?;
    let what = format!("{} {}", K::kind(&Default::default()), object.name_any());
    let read = object.meta();
    let edit = |current: &mut ObjectMeta| edit_guarded(current, read, finalizers, annotations);
    let namespace = object.namespace();
    let name = object.name_any();
    let patch = Patch::Json::<()>(patch);
    match patch_or_update(api, namespace.as_deref(), &name, &patch, edit).await {
        Ok(updated) => Ok(updated),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(FinalizerError::Forbidden(what)),
        Err(error) => Err(FinalizerError::Failed(what, error)),
    }
}

/// The guarded patch's change made to an object read afresh, for an update: `false` (nothing
/// changed) when its finalizers are no longer those the new list was built from.
fn edit_guarded(
    current: &mut ObjectMeta,
    read: &ObjectMeta,
    finalizers: Vec<String>,
    annotations: &BTreeMap<&str, Option<String>>,
) -> bool {
    if current.finalizers.as_deref().unwrap_or_default()
        != read.finalizers.as_deref().unwrap_or_default()
    {
        return false;
    }
    current.finalizers = Some(finalizers);
    let current_annotations = current.annotations.get_or_insert_with(BTreeMap::new);
    for (key, value) in annotations {
        match value {
            Some(value) => {
                current_annotations.insert(key.to_string(), value.clone());
            }
            None => {
                current_annotations.remove(*key);
            }
        }
    }
    true
}

/// The JSON patch: a `test` of the finalizers read (of the resourceVersion when there were
/// none, or when the whole annotation map is added: an `add` of a map would replace one
/// written meanwhile), the new list, then one operation per annotation. Removing an
/// annotation `meta` does not have is no operation.
fn guarded_patch(
    meta: &ObjectMeta,
    finalizers: &[String],
    annotations: &BTreeMap<&str, Option<String>>,
) -> serde_json::Value {
    let version_test =
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": meta.resource_version});
    let mut operations = match &meta.finalizers {
        Some(current) => vec![
            json!({"op": "test", "path": "/metadata/finalizers", "value": current}),
            json!({"op": "replace", "path": "/metadata/finalizers", "value": finalizers}),
        ],
        None => vec![
            version_test.clone(),
            json!({"op": "add", "path": "/metadata/finalizers", "value": finalizers}),
        ],
    };
    match &meta.annotations {
        Some(current) => {
            for (key, value) in annotations {
                let path = format!("/metadata/annotations/{}", pointer_token(key));
                match value {
                    Some(value) => {
                        operations.push(json!({"op": "add", "path": path, "value": value}));
                    }
                    None if current.contains_key(*key) => {
                        operations.push(json!({"op": "remove", "path": path}));
                    }
                    None => {}
                }
            }
        }
        None => {
            let added: BTreeMap<&str, &String> = annotations
                .iter()
                .filter_map(|(key, value)| Some((*key, value.as_ref()?)))
                .collect();
            if !added.is_empty() {
                if meta.finalizers.is_some() {
                    operations.insert(0, version_test);
                }
                operations
                    .push(json!({"op": "add", "path": "/metadata/annotations", "value": added}));
            }
        }
    }
    serde_json::Value::Array(operations)
}

/// A map key as one JSON pointer token (RFC 6901: `~` and `/` escaped).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Whether a guarded patch failed because the object changed since it was read: a failed
/// `test` (422) or a resourceVersion conflict (409).
pub fn is_stale_read(error: &FinalizerError) -> bool {
    matches!(error, FinalizerError::Failed(_, kube::Error::Api(status)) if status.code == 422 || status.code == 409)
}

/// Adds `finalizer` to `object`, a built-in kind, unless it is there: a strategic merge patch
/// merges it into the list by value. `None`: the object is gone.
pub async fn add_builtin_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    if object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(Some(object.clone()));
    }
    let patch = json!({"metadata": {"finalizers": [finalizer]}});
    patch_builtin_finalizers(api, object, patch, |finalizers| {
        if !finalizers.iter().any(|f| f == finalizer) {
            finalizers.push(finalizer.to_string());
        }
    })
    .await
}

/// Removes `finalizer` from `object`, a built-in kind, if it is there: a strategic merge patch
/// deletes it from the list by value. `None`: the object is gone.
pub async fn remove_builtin_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    if !object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(Some(object.clone()));
    }
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}});
    patch_builtin_finalizers(api, object, patch, |finalizers| {
        finalizers.retain(|f| f != finalizer);
    })
    .await
}

/// Sends a strategic merge `patch` of the finalizers; where RBAC grants no `patch`, `edit`
/// makes the same change to the list of a fresh read, written back as an update.
async fn patch_builtin_finalizers<K>(
    api: &Api<K>,
    object: &K,
    patch: serde_json::Value,
    edit: impl FnOnce(&mut Vec<String>),
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let what = format!("{} {}", K::kind(&Default::default()), object.name_any());
    let namespace = object.namespace();
    let edit = |current: &mut ObjectMeta| {
        edit(current.finalizers.get_or_insert_with(Vec::new));
        true
    };
    let patch = Patch::Strategic(patch);
    match patch_or_update(api, namespace.as_deref(), &object.name_any(), &patch, edit).await {
        Ok(updated) => Ok(updated),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(FinalizerError::Forbidden(what)),
        Err(error) => Err(FinalizerError::Failed(what, error)),
    }
}

/// Adds `finalizer` to `object` unless it is there; when the list changed since `object` was
/// read (a cache can lag our own earlier write), once more from a fresh GET. `None`: the
/// object is gone.
pub async fn add_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    change_finalizers(api, object, |object| {
        let finalizers = object.finalizers();
        (!finalizers.iter().any(|f| f == finalizer)).then(|| {
            let mut list = finalizers.to_vec();
            list.push(finalizer.to_string());
            list
        })
    })
    .await
}

/// Removes `finalizer` from `object` (a custom resource: built-in kinds take
/// [`remove_builtin_finalizer`]) if it is there; when the list changed since `object` was read
/// (another controller's finalizer went meanwhile), once more from a fresh GET instead of
/// failing the sync. `None`: the object is gone.
pub async fn remove_finalizer_from<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    change_finalizers(api, object, |object| {
        let finalizers = object.finalizers();
        finalizers
            .iter()
            .any(|f| f == finalizer)
            .then(|| without(finalizers, finalizer))
    })
    .await
}

/// Writes the list `change` makes of an object's finalizers (`None`: nothing to change), from
/// `object` and, when that patch finds the list changed meanwhile, once more from a fresh GET.
async fn change_finalizers<K>(
    api: &Api<K>,
    object: &K,
    change: impl Fn(&K) -> Option<Vec<String>>,
) -> Result<Option<K>, FinalizerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(finalizers) = change(object) else {
        return Ok(Some(object.clone()));
    };
    let first = set_finalizers(api, object, finalizers).await;
    if !matches!(&first, Err(error) if is_stale_read(error)) {
        return first;
    }
    drop(first);
    // Boxed: the rare retry's fresh object and requests would otherwise be part of every
    // caller's future (a PV is 3.4 KB inline, the retry state 12 KB).
    Box::pin(async {
        let name = object.name_any();
        let fresh = api
            .get_opt(&name)
            .await
            .map_err(|e| FinalizerError::Failed(name, e))?;
        match fresh {
            Some(fresh) => match change(&fresh) {
                Some(finalizers) => set_finalizers(api, &fresh, finalizers).await,
                None => Ok(Some(fresh)),
            },
            None => Ok(None),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(finalizers: Option<&[&str]>, annotations: Option<&[(&str, &str)]>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some("7".into()),
            finalizers: finalizers.map(|f| f.iter().map(|s| s.to_string()).collect()),
            annotations: annotations.map(|a| {
                a.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn guarded_patches() {
        let record = "example.com/record";
        let set = BTreeMap::from([(record, Some("v".to_string()))]);
        let unset = BTreeMap::from([(record, None)]);
        let version = json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"});
        let none = BTreeMap::new();
        let table = [
            (
                "finalizers only",
                meta(Some(&["a"]), None),
                &none,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "f"]},
                ]),
            ),
            (
                "no finalizers yet: guarded by the resourceVersion",
                meta(None, Some(&[])),
                &none,
                json!([version, {"op": "add", "path": "/metadata/finalizers", "value": ["a", "f"]}]),
            ),
            (
                "an annotation set, its key escaped",
                meta(Some(&["a"]), Some(&[("other", "x")])),
                &set,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "f"]},
                    {"op": "add", "path": "/metadata/annotations/example.com~1record", "value": "v"},
                ]),
            ),
            (
                "the first annotation: the map added, guarded by the resourceVersion too",
                meta(Some(&["a"]), None),
                &set,
                json!([
                    version,
                    {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "f"]},
                    {"op": "add", "path": "/metadata/annotations", "value": {record: "v"}},
                ]),
            ),
            (
                "an annotation removed",
                meta(Some(&["a"]), Some(&[(record, "v")])),
                &unset,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "f"]},
                    {"op": "remove", "path": "/metadata/annotations/example.com~1record"},
                ]),
            ),
            (
                "removing an absent annotation is no operation",
                meta(Some(&["a"]), Some(&[])),
                &unset,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": ["a"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "f"]},
                ]),
            ),
        ];
        for (what, meta, annotations, expected) in table {
            let finalizers = vec!["a".to_string(), "f".to_string()];
            let patch = guarded_patch(&meta, &finalizers, annotations);
            assert_eq!(patch, expected, "{what}");
            serde_json::from_value::<json_patch::Patch>(patch).expect("a valid JSON patch");
        }
        assert_eq!(pointer_token("a~b/c"), "a~0b~1c");
    }

    /// The update that stands in for a forbidden patch makes the same change, and refuses where
    /// the patch's `test` would have failed.
    #[test]
    fn guarded_edits_for_an_update() {
        let add_record = BTreeMap::from([("record", Some("r".to_string()))]);
        let drop_record = BTreeMap::from([("record", None)]);
        let table = [
            (
                "a finalizer and an annotation added to an object with neither",
                meta(None, None),
                meta(None, None),
                add_record.clone(),
                Some(meta(Some(&["a", "f"]), Some(&[("record", "r")]))),
            ),
            (
                "annotations of others kept; ours removed",
                meta(Some(&["a", "f"]), Some(&[("record", "r"), ("other", "o")])),
                meta(Some(&["a", "f"]), Some(&[("record", "r"), ("other", "o")])),
                drop_record.clone(),
                Some(meta(Some(&["a", "f"]), Some(&[("other", "o")]))),
            ),
            (
                "an empty list read as none",
                meta(Some(&[]), None),
                meta(None, None),
                BTreeMap::new(),
                Some(meta(Some(&["a", "f"]), None)),
            ),
            (
                "a finalizer added by another since the read",
                meta(Some(&["a", "other"]), None),
                meta(Some(&["a"]), None),
                add_record.clone(),
                None,
            ),
            (
                "a finalizer removed by another since the read",
                meta(None, None),
                meta(Some(&["b"]), None),
                drop_record,
                None,
            ),
        ];
        for (what, current, read, annotations, expected) in table {
            let finalizers = vec!["a".to_string(), "f".to_string()];
            let mut edited = current.clone();
            let applied = edit_guarded(&mut edited, &read, finalizers, &annotations);
            match expected {
                Some(expected) => {
                    assert!(applied, "{what}");
                    assert_eq!(edited.finalizers, expected.finalizers, "{what}");
                    assert_eq!(
                        edited.annotations.unwrap_or_default(),
                        expected.annotations.unwrap_or_default(),
                        "{what}"
                    );
                }
                None => {
                    assert!(!applied, "{what}");
                    assert_eq!(edited, current, "{what}: nothing changed");
                }
            }
        }
    }
}
