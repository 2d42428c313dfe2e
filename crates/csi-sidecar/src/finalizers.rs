//! Finalizer edits on objects other controllers also write: a JSON patch guarded by a `test`
//! of the list we read, so a finalizer someone else added or removed meanwhile is never lost
//! or brought back (external-provisioner #1217) — the patch fails and the sync retries.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

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
    let patch = guarded_patch(object.meta(), finalizers, annotations);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| FinalizerError::Patch(e.to_string()))?;
    let what = format!("{} {}", K::kind(&Default::default()), object.name_any());
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(updated) => Ok(Some(updated)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(FinalizerError::Forbidden(what)),
        Err(error) => Err(FinalizerError::Failed(what, error)),
    }
}

/// The JSON patch: a `test` of the finalizers read (of the resourceVersion when there were
/// none, or when the whole annotation map is added: an `add` of a map would replace one
/// written meanwhile), the new list, then one operation per annotation. Removing an
/// annotation `meta` does not have is no operation.
fn guarded_patch(
    meta: &ObjectMeta,
    finalizers: Vec<String>,
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

/// Removes `finalizer` from `object` if it is there; when the list changed since `object` was
/// read (another controller's finalizer went meanwhile, as pv-protection's does from a PV
/// being deleted), once more from a fresh GET instead of failing the sync. `None`: the object
/// is gone.
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
            let patch = guarded_patch(&meta, finalizers, annotations);
            assert_eq!(patch, expected, "{what}");
            serde_json::from_value::<json_patch::Patch>(patch).expect("a valid JSON patch");
        }
        assert_eq!(pointer_token("a~b/c"), "a~0b~1c");
    }
}
