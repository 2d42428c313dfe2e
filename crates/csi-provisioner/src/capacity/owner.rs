//! The owner of the CSIStorageCapacity objects (external-provisioner `pkg/owner`): walk up the
//! controller owner references from the provisioner's Pod, so the objects are garbage
//! collected with its Deployment or StatefulSet.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::{Client, Resource, ResourceExt};

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("getting {what}: {source}")]
    Get { what: String, source: kube::Error },
    #[error("{0} has no controller owner reference")]
    NoController(String),
    #[error("the owner reference {0} has an invalid apiVersion")]
    ApiVersion(String),
}

/// The owner `level` steps up from Pod `pod` in `namespace`: 0 is the Pod itself, 1 its
/// controller (read from the Pod, no further GET), 2 that controller's controller (one GET of
/// the ReplicaSet for a Deployment), and so on.
pub async fn find(
    client: &Client,
    namespace: &str,
    pod: &str,
    level: u32,
) -> Result<OwnerReference, OwnerError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let object = pods.get(pod).await.map_err(|source| OwnerError::Get {
        what: format!("pod {namespace}/{pod}"),
        source,
    })?;
    let mut owner = OwnerReference {
        api_version: Pod::api_version(&()).into_owned(),
        kind: Pod::kind(&()).into_owned(),
        name: object.name_any(),
        uid: object.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut references = object.owner_references().to_vec();
    for step in 0..level {
        // The Pod's references came with it; a higher owner's are one GET each, and the top
        // owner's own references are never needed.
        if step > 0 {
            references = owner_references_of(client, namespace, &owner).await?;
        }
        let controller = references
            .iter()
            .find(|r| r.controller == Some(true))
            .cloned()
            .ok_or_else(|| OwnerError::NoController(format!("{} {}", owner.kind, owner.name)))?;
        owner = controller;
    }
    Ok(OwnerReference {
        controller: Some(true),
        block_owner_deletion: None,
        ..owner
    })
}

/// The owner references of the object `reference` points to (a GET through discovery).
async fn owner_references_of(
    client: &Client,
    namespace: &str,
    reference: &OwnerReference,
) -> Result<Vec<OwnerReference>, OwnerError> {
    let (group, version) = match reference.api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", reference.api_version.as_str()),
    };
    if version.is_empty() {
        return Err(OwnerError::ApiVersion(reference.api_version.clone()));
    }
    let what = format!("{} {}/{}", reference.kind, namespace, reference.name);
    let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| OwnerError::Get {
            what: what.clone(),
            source,
        })?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let object = api
        .get(&reference.name)
        .await
        .map_err(|source| OwnerError::Get { what, source })?;
    Ok(object.owner_references().to_vec())
}
