//! A PV's sync: its finalizer, and for a released volume of ours DeleteVolume and the PV's
//! deletion, as [`crate::deletion::plan`] decides.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::GoStatus;
use csi_kinds::migration;
use csi_kinds::secrets::{self, DeletionSecret, SecretRef, TemplateInputs};
use csi_proto::csi::v1 as csi;
use csi_sidecar::finalizers::{add_builtin_finalizer, remove_builtin_finalizer};
use csi_sidecar::workers::Synced;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::deletion::{self, PV_FINALIZER, VolumePlan};
use crate::sync_error::SyncError;

use super::Provisioner;

impl Provisioner {
    pub(super) async fn sync_volume(&self, name: &str) -> Result<Synced, SyncError> {
        let Some(volume) = self.caches.volumes.get(&ObjectRef::new(name)) else {
            return Ok(Synced::Done);
        };
        if self.volume_writes.lags(&name.to_string(), true, None) {
            return Ok(Synced::Waiting);
        }
        self.carry_out_volume_plan(name, Arc::new(volume.to_volume()))
            .await
            .map(|()| Synced::Done)
    }

    async fn carry_out_volume_plan(
        &self,
        name: &str,
        volume: Arc<PersistentVolume>,
    ) -> Result<(), SyncError> {
        let publishes = self
            .settings
            .driver
            .has_controller(ControllerCapability::PublishUnpublishVolume);
        let attached_to = self
            .caches
            .attachments
            .state()
            .into_iter()
            .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
            .map(|va| va.spec.node_name.clone());
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match deletion::plan(
            &volume,
            &self.settings.driver.name,
            publishes,
            attached_to.is_some(),
        ) {
            VolumePlan::Nothing => Ok(()),
            VolumePlan::AddFinalizer => {
                add_builtin_finalizer(&api, &volume, PV_FINALIZER).await?;
                Ok(())
            }
            VolumePlan::RemoveFinalizer => {
                remove_builtin_finalizer(&api, &volume, PV_FINALIZER).await?;
                Ok(())
            }
            // CSI migration: the cache keeps no in-tree source, so the PV as stored says whether
            // it is an in-tree volume the driver took over; deleted as its CSI form. Otherwise
            // upstream's words for a PV of ours without a CSI source.
            VolumePlan::NotCsi => match self.migrated_volume(&api, name).await {
                Ok(Some(translated)) => {
                    Box::pin(self.carry_out_volume_plan(name, Arc::new(translated))).await
                }
                Ok(None) => {
                    self.delete_failed(&volume, "invalid CSI PV".to_string())
                        .await
                }
                Err(message) => self.delete_failed(&volume, message).await,
            },
            VolumePlan::StillAttached => {
                let node = attached_to.unwrap_or_default();
                let message = format!("persistentvolume {name} is still attached to node {node}");
                self.delete_failed(&volume, message).await
            }
            // As upstream, a node's instance deletes only what it can have created: volumes
            // accessible from its node (other nodes' instances delete theirs).
            VolumePlan::Delete { .. }
                if self
                    .node
                    .as_ref()
                    .is_some_and(|node| !node.deployment.created_here(&volume)) =>
            {
                Ok(())
            }
            VolumePlan::Delete { volume_id, secret } => {
                let started = Instant::now();
                let class = volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone())
                    .unwrap_or_default();
                let secrets = match self.deletion_secrets(&volume, secret).await {
                    Ok(secrets) => secrets,
                    Err(message) => return self.delete_failed(&volume, message).await,
                };
                let request = csi::DeleteVolumeRequest { volume_id, secrets };
                if let Err(status) = self.csi.delete_volume(request, self.settings.timeout).await {
                    let message = GoStatus(&status).to_string();
                    self.settings.metrics.delete_failed(&class);
                    return self.delete_failed(&volume, message).await;
                }
                // A PV held by finalizers comes back from the DELETE with its deletion
                // timestamp: that copy is current, no GET needed. Boxed, as 3.4 KB inline
                // it would size every running sync's future.
                let remaining = match api.delete(name, &DeleteParams::default()).await {
                    Ok(either) => either.left().map(Box::new),
                    Err(kube::Error::Api(status)) if status.code == 404 => None,
                    Err(source) => {
                        return Err(SyncError::Api {
                            what: format!("deleting PV {name}"),
                            source,
                        });
                    }
                };
                if let Some(current) = remaining {
                    remove_builtin_finalizer(&api, &current, PV_FINALIZER).await?;
                }
                self.volume_writes.deleted(name.to_string());
                self.settings.metrics.deleted(&class, started.elapsed());
                tracing::info!(volume = %name, "volume deleted");
                Ok(())
            }
        }
    }

    /// The PV `name` as stored, as the CSI volume of its in-tree source (`None`: it has none
    /// that migrates); an error message when it cannot be read or translated.
    async fn migrated_volume(
        &self,
        api: &Api<PersistentVolume>,
        name: &str,
    ) -> Result<Option<PersistentVolume>, String> {
        let stored = api
            .get(name)
            .await
            .map_err(|error| format!("reading PV {name}: {error}"))?;
        migration::in_tree_to_csi(&stored).map_err(|error| error.to_string())
    }

    /// DeleteVolume's secrets. As upstream: a Secret that cannot be read is logged and the
    /// delete goes on without (it may be gone already), but a class whose secret parameters
    /// do not resolve fails the delete (the error), to be retried once the class is fixed.
    async fn deletion_secrets(
        &self,
        volume: &PersistentVolume,
        source: DeletionSecret,
    ) -> Result<HashMap<String, String>, String> {
        let reference: Option<SecretRef> = match source {
            DeletionSecret::Annotated(reference) => reference,
            DeletionSecret::FromStorageClass => {
                let spec = volume.spec.clone().unwrap_or_default();
                let class = spec.storage_class_name.unwrap_or_default();
                let class = self.caches.classes.get(&ObjectRef::new(&class));
                match (class, spec.claim_ref) {
                    (Some(class), Some(claim)) => {
                        let no_annotations = BTreeMap::new();
                        let inputs = TemplateInputs {
                            pv_name: &volume.name_any(),
                            pvc_name: claim.name.as_deref().unwrap_or_default(),
                            pvc_namespace: claim.namespace.as_deref().unwrap_or_default(),
                            pvc_annotations: &no_annotations,
                        };
                        let parameters = class.parameters.clone().unwrap_or_default();
                        secrets::secret_reference(
                            secrets::SecretKind::Provisioner,
                            &parameters,
                            &inputs,
                        )
                        .map_err(|error| {
                            format!(
                                "failed to get secretreference for volume {}: {error}",
                                volume.name_any()
                            )
                        })?
                    }
                    _ => {
                        tracing::warn!(volume = %volume.name_any(), "no StorageClass or claim reference: deleting without secrets");
                        None
                    }
                }
            }
        };
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        match csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference).await {
            Ok(data) => Ok(data.into_inner()),
            Err(error) => {
                tracing::warn!(volume = %volume.name_any(), %error, "deleting without secrets");
                Ok(HashMap::new())
            }
        }
    }

    /// A `VolumeFailedDelete` warning on the PV; the sync fails with `message`.
    async fn delete_failed(
        &self,
        volume: &PersistentVolume,
        message: String,
    ) -> Result<(), SyncError> {
        self.warn(&volume.object_ref(&()), "VolumeFailedDelete", message)
            .await
    }
}
