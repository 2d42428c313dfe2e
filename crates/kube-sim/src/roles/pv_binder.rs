//! The PV controller subset of kube-controller-manager
//! (pkg/controller/volume/persistentvolume/pv_controller.go) plus the PVC and PV protection
//! controllers (pkg/controller/volume/{pvcprotection,pvprotection}): claims are bound to
//! matching PVs or handed to their class's external provisioner, PV phases follow their
//! claims, and protection finalizers go once nothing uses the object.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::scheduling::{claim_matches_pv, parse_quantity, pv_matches_node};
use super::{Informers, RoleError, Timing, merge_patch, merge_patch_status, reconcile_loop};
use csi_sidecar::events::{EventRecorder, EventType};

use csi_kinds::annotations::{BETA_STORAGE_PROVISIONER, SELECTED_NODE, STORAGE_PROVISIONER};
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub use crate::apiserver::admission::{PV_PROTECTION, PVC_PROTECTION};
/// The provisioner of classes for pre-created local PVs: nothing provisions for them.
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

struct Caches {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    pods: Store<Pod>,
    nodes: Store<k8s_openapi::api::core::v1::Node>,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let mut informers = Informers::new(&client, &shutdown);
    let caches = Arc::new(Caches {
        claims: informers.all(),
        volumes: informers.all(),
        classes: informers.all(),
        pods: informers.all(),
        nodes: informers.all(),
    });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let events = Arc::new(EventRecorder::new(
        client.clone(),
        "persistentvolume-controller",
        "",
    ));
    reconcile_loop("pv-binder", wake, timing.resync, shutdown, || {
        pass(client.clone(), caches.clone(), events.clone())
    })
    .await;
    Ok(())
}

async fn pass(
    client: Client,
    caches: Arc<Caches>,
    events: Arc<EventRecorder>,
) -> Result<(), RoleError> {
    for claim in caches.claims.state() {
        if let Err(error) = sync_claim(&client, &caches, &events, &claim).await {
            tracing::warn!(claim = %key(&claim), %error, "pv-binder: claim sync failed");
        }
    }
    for volume in caches.volumes.state() {
        if let Err(error) = sync_volume(&client, &caches, &volume).await {
            tracing::warn!(volume = %volume.name_any(), %error, "pv-binder: volume sync failed");
        }
    }
    Ok(())
}

fn key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    )
}

fn class_name(claim: &PersistentVolumeClaim) -> String {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

fn phase_of_claim(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn phase_of_volume(volume: &PersistentVolume) -> &str {
    volume
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The claim a PV's claimRef names, if it still exists with the same UID.
fn claimed_by(caches: &Caches, volume: &PersistentVolume) -> Option<Arc<PersistentVolumeClaim>> {
    let reference = volume.spec.as_ref()?.claim_ref.as_ref()?;
    let claim = caches
        .claims
        .get(&ObjectRef::new(reference.name.as_deref()?).within(reference.namespace.as_deref()?))?;
    match &reference.uid {
        Some(uid) if Some(uid) != claim.metadata.uid.as_ref() => None,
        _ => Some(claim),
    }
}

fn refers_to(reference: &ObjectReference, claim: &PersistentVolumeClaim) -> bool {
    reference.name.as_deref() == Some(&claim.name_any())
        && reference.namespace == claim.namespace()
        && reference
            .uid
            .as_ref()
            .is_none_or(|uid| Some(uid) == claim.metadata.uid.as_ref())
}

async fn sync_claim(
    client: &Client,
    caches: &Caches,
    events: &EventRecorder,
    claim: &PersistentVolumeClaim,
) -> Result<(), RoleError> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &claim.namespace().unwrap_or_default());
    if claim.metadata.deletion_timestamp.is_some() {
        return release_claim_protection(&api, caches, claim).await;
    }
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if !volume_name.is_empty() {
        return match caches.volumes.get(&ObjectRef::new(&volume_name)) {
            Some(volume) => complete_binding(client, claim, &volume, false).await,
            // The PV this claim was bound to is gone (pv_controller: ClaimLost).
            None if phase_of_claim(claim) == "Bound" => {
                merge_patch_status(
                    &api,
                    &claim.name_any(),
                    json!({"status": {"phase": "Lost"}}),
                )
                .await?;
                events
                    .publish(
                        &claim.object_ref(&()),
                        EventType::Warning,
                        "ClaimLost",
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                    )
                    .await;
                Ok(())
            }
            None => Ok(()),
        };
    }
    // A PV pre-bound to this claim (by an admin, a provisioner or the scheduler) wins.
    if let Some(volume) = caches.volumes.state().into_iter().find(|v| {
        v.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|r| refers_to(r, claim))
            && v.metadata.deletion_timestamp.is_none()
    }) {
        return complete_binding(client, claim, &volume, false).await;
    }
    let class = class_name(claim);
    let storage_class = (!class.is_empty())
        .then(|| caches.classes.get(&ObjectRef::new(&class)))
        .flatten();
    if !class.is_empty() && storage_class.is_none() {
        events
            .publish(
                &claim.object_ref(&()),
                EventType::Warning,
                "ProvisioningFailed",
                &format!("storageclass.storage.k8s.io \"{class}\" not found"),
            )
            .await;
        return Ok(());
    }
    let delayed = storage_class
        .as_ref()
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let selected_node = claim.annotations().get(SELECTED_NODE).cloned();
    let node = selected_node
        .as_ref()
        .and_then(|n| caches.nodes.get(&ObjectRef::new(n)));
    if delayed && selected_node.is_none() {
        events
            .publish(
                &claim.object_ref(&()),
                EventType::Normal,
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            )
            .await;
        return Ok(());
    }
    let candidates: Vec<Arc<PersistentVolume>> = caches
        .volumes
        .state()
        .into_iter()
        .filter(|v| v.spec.as_ref().is_some_and(|s| s.claim_ref.is_none()))
        .filter(|v| v.metadata.deletion_timestamp.is_none() && phase_of_volume(v) != "Released")
        .filter(|v| claim_matches_pv(claim, v))
        .filter(|v| !delayed || node.as_ref().is_some_and(|n| pv_matches_node(v, n)))
        .collect();
    if let Some(volume) = candidates.into_iter().min_by_key(|v| capacity(v)) {
        return complete_binding(client, claim, &volume, true).await;
    }
    let Some(provisioner) = storage_class
        .as_ref()
        .map(|c| c.provisioner.clone())
        .filter(|p| p != NO_PROVISIONER)
    else {
        return Ok(());
    };
    if claim.annotations().get(STORAGE_PROVISIONER) != Some(&provisioner) {
        merge_patch(&api, &claim.name_any(), json!({"metadata": {"annotations": {STORAGE_PROVISIONER: provisioner, BETA_STORAGE_PROVISIONER: provisioner}}})).await?;
        let message = format!(
            "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
        );
        events
            .publish(
                &claim.object_ref(&()),
                EventType::Normal,
                "ExternalProvisioning",
                &message,
            )
            .await;
    }
    Ok(())
}

fn capacity(volume: &PersistentVolume) -> crate::quantity::Quantity {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(parse_quantity)
        .unwrap_or_default()
}

/// Binds in pv_controller's order: the PV's claimRef, the PV phase, the claim's volumeName
/// and annotations, the claim's phase, capacity and access modes. Every write is skipped when
/// already done, so repeated passes converge without extra requests.
async fn complete_binding(
    client: &Client,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    chosen_by_us: bool,
) -> Result<(), RoleError> {
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &claim.namespace().unwrap_or_default());
    let spec = volume.spec.clone().unwrap_or_default();
    let reference = spec.claim_ref.clone();
    let needs_reference = reference.as_ref().is_none_or(|r| r.uid.is_none());
    if let Some(reference) = &reference
        && !refers_to(reference, claim)
    {
        return Ok(());
    }
    if needs_reference {
        let claim_ref = json!({
            "kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": claim.namespace(), "name": claim.name_any(),
            "uid": claim.metadata.uid, "resourceVersion": claim.metadata.resource_version,
        });
        // Guarded by the PV's resourceVersion, so two claims racing for one PV cannot both
        // win (pv_controller relies on update conflicts the same way).
        let mut operations = vec![
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": volume.metadata.resource_version}),
            json!({"op": "add", "path": "/spec/claimRef", "value": claim_ref}),
        ];
        if chosen_by_us {
            operations.push(if volume.metadata.annotations.is_some() {
                json!({"op": "add", "path": "/metadata/annotations/pv.kubernetes.io~1bound-by-controller", "value": "yes"})
            } else {
                json!({"op": "add", "path": "/metadata/annotations", "value": {BOUND_BY_CONTROLLER: "yes"}})
            });
        }
        let patch: json_patch::Patch = serde_json::from_value(json!(operations))
            .map_err(|e| RoleError::Invalid(e.to_string()))?;
        match volumes
            .patch(
                &volume.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(_) => {}
            // Lost the race (the PV changed): the next pass sees who won.
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
    }
    if phase_of_volume(volume) != "Bound" {
        merge_patch_status(
            &volumes,
            &volume.name_any(),
            json!({"status": {"phase": "Bound"}}),
        )
        .await?;
    }
    let claim_spec = claim.spec.clone().unwrap_or_default();
    if claim_spec.volume_name.as_deref() != Some(&volume.name_any())
        || !claim.annotations().contains_key(BIND_COMPLETED)
    {
        let mut annotations = BTreeMap::from([(BIND_COMPLETED.to_string(), "yes".to_string())]);
        if chosen_by_us {
            annotations.insert(BOUND_BY_CONTROLLER.to_string(), "yes".to_string());
        }
        merge_patch(&claims, &claim.name_any(), json!({"metadata": {"annotations": annotations}, "spec": {"volumeName": volume.name_any()}})).await?;
    }
    let status = claim.status.clone().unwrap_or_default();
    // The capacity is copied only when the claim becomes Bound (updateClaimStatus): later a
    // smaller claim capacity than the PV's means the filesystem still waits for the node to
    // grow it, and must not be overwritten.
    if status.phase.as_deref() != Some("Bound") || status.access_modes != spec.access_modes {
        let capacity: Option<BTreeMap<String, Quantity>> =
            if status.phase.as_deref() == Some("Bound") {
                status.capacity.clone()
            } else {
                spec.capacity.clone()
            };
        merge_patch_status(&claims, &claim.name_any(), json!({"status": {"phase": "Bound", "capacity": capacity, "accessModes": spec.access_modes}})).await?;
        tracing::info!(claim = %key(claim), volume = %volume.name_any(), "bound");
    }
    Ok(())
}

/// PV phases follow their claims: Available without a claimRef, Released once the claim is
/// gone; Recycle is not supported (Failed), Delete is left to the external provisioner.
async fn sync_volume(
    client: &Client,
    caches: &Caches,
    volume: &PersistentVolume,
) -> Result<(), RoleError> {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let name = volume.name_any();
    let spec = volume.spec.clone().unwrap_or_default();
    let phase = phase_of_volume(volume);
    if volume.metadata.deletion_timestamp.is_some() {
        if phase != "Bound" && volume.finalizers().iter().any(|f| f == PV_PROTECTION) {
            remove_finalizer(&api, &name, volume.finalizers(), PV_PROTECTION).await?;
        }
        return Ok(());
    }
    let wanted = match &spec.claim_ref {
        None => "Available",
        Some(reference) if reference.uid.is_none() => "Available",
        Some(_) if claimed_by(caches, volume).is_some() => "Bound",
        Some(_) => match spec.persistent_volume_reclaim_policy.as_deref() {
            Some("Recycle") => "Failed",
            _ => "Released",
        },
    };
    if phase == wanted || (phase == "Failed" && wanted == "Released") {
        return Ok(());
    }
    let mut status = json!({"status": {"phase": wanted}});
    if wanted == "Failed" {
        status["status"]["message"] =
            json!("Recycle reclaim policy is not supported by this cluster");
    }
    merge_patch_status(&api, &name, status).await?;
    tracing::info!(volume = %name, from = phase, to = wanted, "volume phase");
    Ok(())
}

/// A deleting claim keeps `kubernetes.io/pvc-protection` while a pod that is not terminated
/// uses it.
async fn release_claim_protection(
    api: &Api<PersistentVolumeClaim>,
    caches: &Caches,
    claim: &PersistentVolumeClaim,
) -> Result<(), RoleError> {
    if !claim.finalizers().iter().any(|f| f == PVC_PROTECTION) {
        return Ok(());
    }
    let namespace = claim.namespace();
    let in_use = caches.pods.state().iter().any(|pod| {
        pod.namespace() == namespace
            && !pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed")
            && pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|volumes| {
                    volumes.iter().any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| c.claim_name == claim.name_any())
                    })
                })
    });
    if in_use {
        return Ok(());
    }
    remove_finalizer(api, &claim.name_any(), claim.finalizers(), PVC_PROTECTION).await
}

/// Removes one finalizer with a JSON patch guarded by a `test` of the current list, so a
/// concurrent change of the finalizers is never overwritten.
pub(crate) async fn remove_finalizer<K>(
    api: &Api<K>,
    name: &str,
    current: &[String],
    finalizer: &str,
) -> Result<(), RoleError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let remaining: Vec<&String> = current.iter().filter(|f| *f != finalizer).collect();
    let patch = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "replace", "path": "/metadata/finalizers", "value": remaining},
    ]);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| RoleError::Invalid(e.to_string()))?;
    match api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Changed meanwhile (422 from the failed test) or gone: the next pass sees the new state.
        Err(kube::Error::Api(status))
            if status.code == 422 || status.code == 404 || status.code == 409 =>
        {
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}
