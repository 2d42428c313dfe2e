//! Finalizer edits on objects other controllers also write: a JSON patch guarded by a `test`
//! of the list we read, so a finalizer someone else added or removed meanwhile is never lost
//! or brought back (external-provisioner #1217) — the patch fails and the sync retries.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    #[error("updating the finalizers of {0}: forbidden")]
    Forbidden(String),
    #[error("updating the finalizers of {0}: {1}")]
    Failed(String, kube::Error),
    #[error("building the finalizer patch: {0}")]
    Patch(String),
}

impl From<FinalizerError> for String {
    fn from(error: FinalizerError) -> Self {
        error.to_string()
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

/// Removes one finalizer from the current object (a GET: the caller's copy may be stale).
pub async fn remove_finalizer<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<(), String>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(current) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("getting {name}: {e}"))?
    else {
        return Ok(());
    };
    if !current.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let finalizers = without(current.finalizers(), finalizer);
    set_finalizers(api, &current, finalizers).await?;
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
    let current = object.meta().finalizers.clone();
    let patch = match current {
        Some(current) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ]),
        None => json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": object.meta().resource_version},
            {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
        ]),
    };
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
    let with = |object: &K| {
        let mut list = object.finalizers().to_vec();
        list.push(finalizer.to_string());
        list
    };
    if object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(Some(object.clone()));
    }
    match set_finalizers(api, object, with(object)).await {
        Err(error) if is_stale_read(&error) => {
            let name = object.name_any();
            let fresh = api
                .get_opt(&name)
                .await
                .map_err(|e| FinalizerError::Failed(name, e))?;
            match fresh {
                Some(fresh) if fresh.finalizers().iter().any(|f| f == finalizer) => Ok(Some(fresh)),
                Some(fresh) => set_finalizers(api, &fresh, with(&fresh)).await,
                None => Ok(None),
            }
        }
        other => other,
    }
}
