//! Data sources: a clone's source claim and a restore's snapshot carry a protection finalizer
//! while the driver copies from them, released once no Pending claim needs them (the
//! cloning-protection sync, and the sweep of snapshots).

use std::sync::Arc;

use csi_kinds::cached::CachedClaim;
use csi_proto::csi::v1 as csi;
use csi_sidecar::finalizers::{FinalizerError, remove_finalizer, set_finalizers, without};
use csi_sidecar::workers::Synced;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use crate::claims::{self, CLONING_PROTECTION, DataSource};
use crate::provision::PlannedSource;
use crate::request;
use crate::snapshots::{self, SOURCE_PROTECTION};
use crate::sync_error::{SnapshotSourceCause, SnapshotSourceError, SyncError};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};

use super::{Key, Provisioner, claim_keys};

/// A data source that carries a protection finalizer while the driver copies from it.
pub(super) enum ProtectedSource {
    Claim(Arc<PersistentVolumeClaim>),
    Snapshot(Box<VolumeSnapshot>),
}

impl Provisioner {
    pub(super) async fn sync_clone_source(
        &self,
        reference: &ObjectRef<CachedClaim>,
    ) -> Result<Synced, SyncError> {
        match self.current_claim(reference) {
            Ok(Some(claim)) if claim_keys(&*claim).any(|k| matches!(k, Key::CloneSource(_))) => {
                self.release_clone_source(&claim).await
            }
            Ok(_) => Ok(Synced::Done),
            Err(waiting) => Ok(waiting),
        }
    }

    /// The cloning-protection controller's job: a source claim being deleted loses its
    /// finalizer once no Pending claim clones from it.
    async fn release_clone_source(
        &self,
        source: &PersistentVolumeClaim,
    ) -> Result<Synced, SyncError> {
        let wanted = DataSource::Claim {
            name: source.name_any(),
            namespace: source.namespace().unwrap_or_default(),
        };
        if self.still_needed(&wanted, None) {
            return Ok(Synced::Waiting);
        }
        let finalizers = without(source.finalizers(), CLONING_PROTECTION);
        self.set_claim_finalizers(source, finalizers).await?;
        Ok(Synced::Done)
    }

    /// Whether a Pending claim other than `except` still has `source` as its data source
    /// (claims of every namespace with the CrossNamespaceVolumeDataSource gate).
    fn still_needed(&self, source: &DataSource, except: Option<&str>) -> bool {
        let claims = self.caches.claims.state();
        claims::still_needed_by_pending_claims(
            claims.iter().map(|c| &**c),
            source,
            except,
            self.settings.cross_namespace_data_sources,
        )
    }

    /// CreateVolume's content source and the object to protect while the driver copies from
    /// it; a snapshot is read (and checked) now. A failure is reported.
    pub(super) async fn content_source(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        source: &PlannedSource,
    ) -> Result<(Option<csi::VolumeContentSource>, Option<ProtectedSource>), SyncError> {
        Ok(match source {
            PlannedSource::Empty => (None, None),
            PlannedSource::Clone {
                source,
                volume_handle,
            } => (
                Some(request::volume_content(volume_handle.clone())),
                Some(ProtectedSource::Claim(source.clone())),
            ),
            PlannedSource::Snapshot { name, namespace } => {
                match self.snapshot_source(claim, class, name, namespace).await {
                    Ok((handle, snapshot)) => (
                        Some(request::snapshot_content(handle)),
                        Some(ProtectedSource::Snapshot(Box::new(snapshot))),
                    ),
                    Err(error) => {
                        tracing::warn!(claim = %claim.name_any(), ?error, "restore refused");
                        return self.failed(claim, error.to_string()).await;
                    }
                }
            }
        })
    }

    /// GETs the snapshot and its content (live, as upstream: the caches hold no snapshots)
    /// and checks them; returns the snapshot handle and the snapshot.
    async fn snapshot_source(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        name: &str,
        namespace: &str,
    ) -> Result<(String, VolumeSnapshot), SnapshotSourceError> {
        let fail = |cause: SnapshotSourceCause| SnapshotSourceError {
            snapshot: name.to_string(),
            cause,
        };
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), namespace);
        let snapshot = snapshots.get(name).await.map_err(|source| {
            fail(SnapshotSourceCause::GetSnapshot {
                name: name.to_string(),
                source,
            })
        })?;
        let content_name = snapshots::bound_content(&snapshot).map_err(|e| fail(e.into()))?;
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let content = contents.get(&content_name).await.map_err(|source| {
            fail(SnapshotSourceCause::GetContent {
                content: content_name.clone(),
                snapshot: name.to_string(),
                source,
            })
        })?;
        let handle = snapshots::snapshot_source(
            claim,
            &self.settings.driver.name,
            &class.name_any(),
            &snapshot,
            &content,
            self.settings.prevent_volume_mode_conversion,
        )
        .map_err(|e| fail(e.into()))?;
        Ok((handle, snapshot))
    }

    /// Puts the source's protection finalizer on before CreateVolume, so the source stays
    /// while the driver copies from it.
    pub(super) async fn protect_source(&self, source: &ProtectedSource) -> Result<(), SyncError> {
        match source {
            ProtectedSource::Claim(claim) => {
                if claim.finalizers().iter().any(|f| f == CLONING_PROTECTION) {
                    return Ok(());
                }
                let mut finalizers = claim.finalizers().to_vec();
                finalizers.push(CLONING_PROTECTION.to_string());
                self.set_claim_finalizers(claim, finalizers).await.map(drop)
            }
            ProtectedSource::Snapshot(snapshot) => {
                if snapshot.finalizers().iter().any(|f| f == SOURCE_PROTECTION) {
                    return Ok(());
                }
                let mut finalizers = snapshot.finalizers().to_vec();
                finalizers.push(SOURCE_PROTECTION.to_string());
                let api: Api<VolumeSnapshot> = Api::namespaced(
                    self.client.clone(),
                    &snapshot.namespace().unwrap_or_default(),
                );
                match set_finalizers(&api, snapshot, finalizers).await {
                    Ok(_) => Ok(()),
                    // Tolerated so that RBAC without `update` on snapshots keeps working.
                    Err(FinalizerError::Forbidden(message)) => {
                        tracing::warn!(snapshot = %snapshot.name_any(), %message, "cannot protect the source snapshot");
                        Ok(())
                    }
                    Err(error) => Err(SyncError::Finalizers(error)),
                }
            }
        }
    }

    /// Drops the snapshot's protection once no other Pending claim restores from it (the
    /// sweeper retries what fails here).
    pub(super) async fn release_snapshot(&self, snapshot: &VolumeSnapshot, except: Option<&str>) {
        let source = DataSource::Snapshot {
            name: snapshot.name_any(),
            namespace: snapshot.namespace().unwrap_or_default(),
        };
        if self.still_needed(&source, except) {
            return;
        }
        let api: Api<VolumeSnapshot> = Api::namespaced(
            self.client.clone(),
            &snapshot.namespace().unwrap_or_default(),
        );
        if let Err(error) = remove_finalizer(&api, &snapshot.name_any(), SOURCE_PROTECTION).await {
            tracing::warn!(snapshot = %snapshot.name_any(), %error, "removing the source-protection finalizer");
        }
    }

    /// `SnapshotFinalizerController`: every sweep interval, snapshots whose restores are all
    /// done lose the source-protection finalizer. Without permission to list snapshots it
    /// stops quietly, as upstream.
    pub(super) async fn sweep_snapshots(self: Arc<Self>, shutdown: CancellationToken) {
        let api: Api<VolumeSnapshot> = Api::all(self.client.clone());
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.snapshot_orphan_sweep_interval) => {}
            }
            let snapshots = match api.list(&kube::api::ListParams::default()).await {
                Ok(list) => list.items,
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    tracing::info!(
                        "no permission to list volumesnapshots: the orphaned source-protection sweeper stops"
                    );
                    return;
                }
                // The snapshot CRDs are not installed (yet).
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(error) => {
                    tracing::warn!(%error, "listing volumesnapshots for the sweep");
                    continue;
                }
            };
            for snapshot in snapshots
                .iter()
                .filter(|s| s.finalizers().iter().any(|f| f == SOURCE_PROTECTION))
            {
                self.release_snapshot(snapshot, None).await;
            }
        }
    }
}
