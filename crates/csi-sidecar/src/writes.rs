//! Writes that work under upstream's RBAC as well as ours. Our chart grants `patch` on claims
//! and VolumeSnapshots, one request per change; upstream's rules (external-provisioner's and
//! snapshot-controller's `rbac.yaml`) grant only `update` there, because the Go sidecars read
//! and update. A drop-in replacement must run under either, so a patch the server forbids is
//! done again as a GET and an update guarded by the resourceVersion read: three requests
//! instead of one, only where the RBAC asks for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;

/// Sends `patch` to `name`; where RBAC forbids `patch` (403), reads the object, lets `edit`
/// make the same change to its metadata, and sends it back as an update. The object is read
/// and written whole (as a dynamic object), never through `K`: the caches' lean types leave
/// fields out, and an update from one would erase them. `edit` returns `false` when the object
/// read is no longer the one the patch was built for: that is a 409 Conflict, as the server
/// answers a patch whose guard failed, so callers retry from fresh state either way. `None`:
/// the object is gone.
pub async fn patch_or_update<K, P>(
    api: &Api<K>,
    namespace: Option<&str>,
    name: &str,
    patch: &Patch<P>,
    edit: impl FnOnce(&mut ObjectMeta) -> bool,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
    P: serde::Serialize + std::fmt::Debug,
{
    match api.patch(name, &PatchParams::default(), patch).await {
        Ok(updated) => Ok(Some(updated)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        // Boxed: the rare fallback's object and requests would otherwise be part of every
        // caller's future.
        Err(kube::Error::Api(status)) if patch_not_authorized(&status) => {
            Box::pin(update_instead(api, namespace, name, edit)).await
        }
        Err(error) => Err(error),
    }
}

async fn update_instead<K>(
    api: &Api<K>,
    namespace: Option<&str>,
    name: &str,
    edit: impl FnOnce(&mut ObjectMeta) -> bool,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let resource = ApiResource::erase::<K>(&K::DynamicType::default());
    let client = api.clone().into_client();
    let whole: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client, namespace, &resource),
        None => Api::all_with(client, &resource),
    };
    let Some(mut current) = whole.get_opt(name).await? else {
        return Ok(None);
    };
    if !edit(&mut current.metadata) {
        return Err(changed_since_read(&resource.kind, name));
    }
    match whole.replace(name, &PostParams::default(), &current).await {
        Ok(updated) => serde_json::to_value(updated)
            .and_then(serde_json::from_value)
            .map(Some)
            .map_err(kube::Error::SerdeError),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}

/// A 403 from the authorizer, not from admission: the API server words every authorization
/// denial `User "…" cannot patch resource "…"`, whatever the authorizer. Other 403s (a
/// finalizer added to an object being deleted, a terminating namespace) would be refused to
/// an update as well, so they are returned as they are, without the GET.
fn patch_not_authorized(status: &Status) -> bool {
    status.code == 403 && status.message.contains(" cannot patch resource ")
}

/// The 409 the server would have answered, naming the object.
fn changed_since_read(kind: &str, name: &str) -> kube::Error {
    let message = format!("{kind} {name} changed since it was read");
    kube::Error::Api(Status::failure(&message, "Conflict").with_code(409).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_authorization_denials_are_retried_as_updates() {
        let table = [
            (
                403,
                r#"persistentvolumeclaims "data" is forbidden: User "system:serviceaccount:csi:provisioner" cannot patch resource "persistentvolumeclaims" in API group "" in the namespace "apps""#,
                true,
            ),
            (
                403,
                r#"volumesnapshots.snapshot.storage.k8s.io "snap" is forbidden: User "system:serviceaccount:csi:snapshot-controller" cannot patch resource "volumesnapshots" in API group "snapshot.storage.k8s.io" in the namespace "apps": RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found"#,
                true,
            ),
            (
                403,
                r#"persistentvolumeclaims "data" is forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"csi-suite.io/provisioning-protection"}"#,
                false,
            ),
            (
                403,
                r#"persistentvolumeclaims "data" is forbidden: unable to create new content in namespace apps because it is being terminated"#,
                false,
            ),
            (
                409,
                r#"Operation cannot be fulfilled on persistentvolumeclaims "data": User "x" cannot patch resource "y""#,
                false,
            ),
        ];
        for (code, message, want) in table {
            let status = Status::failure(message, "Forbidden").with_code(code);
            assert_eq!(patch_not_authorized(&status), want, "{code} {message}");
        }
    }
}
