//! A claim's provisioning: the sync reads the claim and what the caches hold for it,
//! [`crate::step::next_step`] decides, and one `match` carries the step out (the entry in the
//! in-flight record, CreateVolume, the PV, its release, and the failures on the way); a
//! provisioning in flight whose claim is gone is finished from its entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_grpc::conn::GoStatus;
use csi_kinds::cached::CachedClaim;
use csi_kinds::secrets::SecretRefs;
use csi_proto::csi::v1 as csi;
use csi_sidecar::events::EventType;
use csi_sidecar::finalizers::{set_finalizers_and_annotations, without};
use csi_sidecar::lock;
use csi_sidecar::workers::Synced;
use csi_sidecar::writes::patch_or_update;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::protection::{self, PROVISIONING_CLASS, PROVISIONING_PROTECTION};
use crate::provision::{ProvisionPlan, Refusal};
use crate::pv::{PvInputs, in_tree_volume, persistent_volume};
use crate::request::{self, Outcome, SaveFailure};
use crate::step::{self, ClaimLookups, ClaimStep, Observed, Provisioning, Volume};
use crate::sync_error::SyncError;
use crate::topology::TopologyError;
use csi_kinds::annotations::SELECTED_NODE;

use super::inflight::RecordWriteError;
use super::sources::ProtectedSource;
use super::{Provisioner, claim_ref, rand_suffix};

impl Provisioner {
    /// A claim's sync: the claim as cached, what the caches hold for it, and
    /// [`step::next_step`] decides what is done.
    pub(super) async fn sync_claim(
        &self,
        reference: &ObjectRef<CachedClaim>,
    ) -> Result<Synced, SyncError> {
        let claim = match self.current_claim(reference) {
            Ok(Some(claim)) => claim,
            Ok(None) => return Ok(Synced::Done),
            Err(waiting) => return Ok(waiting),
        };
        let uid = claim.uid().unwrap_or_default();
        let observed = self.observe(&claim, &uid);
        let node = self.node.as_ref().map(|node| &node.deployment);
        match step::next_step(&claim, observed, &self.policy(), node, self) {
            ClaimStep::Nothing => Ok(Synced::Done),
            ClaimStep::Wait => Ok(Synced::Waiting),
            ClaimStep::NoVolumeName { error, fatal } => {
                if fatal {
                    let _ = self.fatal.set(error.clone());
                    self.stop.cancel();
                }
                Err(SyncError::VolumeName(error))
            }
            ClaimStep::Finished { release } => {
                lock(&self.pinned).remove(&uid);
                self.record.leave(&uid);
                if release {
                    self.release(&claim).await?;
                }
                Ok(Synced::Done)
            }
            ClaimStep::NoClass(error) => Err(error.into()),
            ClaimStep::ForeignClass { provisioner } => {
                tracing::error!(claim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %provisioner, "Unknown provisioner requested in claim's StorageClass");
                Ok(Synced::Done)
            }
            ClaimStep::BecomeOwner { class } => match &self.node {
                Some(node) => self.become_owner(node, &claim, &class).await,
                // Only a node's instance is told to become owner.
                None => Ok(Synced::Done),
            },
            ClaimStep::Infeasible { wait } => {
                tracing::debug!(claim = %claim.name_any(), ?wait, "provisioning previously failed with an infeasible error");
                Ok(Synced::After(wait))
            }
            ClaimStep::Populator { kind } => {
                self.note_provisioning(&claim).await;
                tracing::info!(claim = %claim.name_any(), %kind, "an external populator provisions the volume");
                self.csi_events
                    .publish(
                        &claim.object_ref(&()),
                        EventType::Normal,
                        "Provisioning",
                        "Assuming an external populator will provision the volume",
                    )
                    .await;
                Ok(Synced::Done)
            }
            ClaimStep::Reschedule { node } => {
                let reason = TopologyError::Reschedule(node).to_string();
                self.measured(&claim, self.reschedule(&claim, reason)).await
            }
            ClaimStep::Refused(refusal) => {
                let refused = async {
                    if let Refusal::Topology(_) = refusal {
                        // Nothing was sent with these inputs: the next attempt gathers them
                        // afresh (a node plugin registered meanwhile), as upstream caches
                        // only the keys and terms it found.
                        lock(&self.pinned).remove(&uid);
                    }
                    tracing::warn!(claim = %claim.name_any(), ?refusal, "provisioning refused");
                    self.failed(&claim, refusal.to_string()).await
                };
                self.measured(&claim, refused).await
            }
            ClaimStep::Provision(provisioning) => {
                self.measured(&claim, self.provision(&claim, *provisioning))
                    .await
            }
        }
    }

    /// What the caches hold for `claim` (with `uid`): its class, and its PV.
    fn observe(&self, claim: &PersistentVolumeClaim, uid: &str) -> Observed {
        let class_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        let class = self.caches.classes.get(&ObjectRef::new(&class_name));
        let volume_name = request::volume_name(
            &self.settings.volume_name_prefix,
            uid,
            self.settings.volume_name_uuid_length,
        );
        let volume = volume_name.as_ref().map_or(Volume::Absent, |name| {
            let cached = self.caches.volumes.get(&ObjectRef::new(name)).is_some();
            if self.volume_writes.lags(name, cached, None) {
                Volume::Lags
            } else if cached {
                Volume::Cached
            } else {
                Volume::Absent
            }
        });
        Observed {
            volume_name,
            volume,
            class,
            in_flight: self.record.entry(uid).map(|entry| Arc::new(entry.class)),
            fallback_hash: rand_suffix(),
        }
    }

    /// A provisioning in flight whose claim is gone (deleted mid-CreateVolume, or while no
    /// provisioner ran): finished from its entry as the claim's sync would — CreateVolume
    /// returns the volume already made, and its PV, bound to the claim that is gone, is
    /// released and reclaimed by the PV controller as any other.
    pub(super) async fn sync_in_flight(&self, uid: &str) -> Result<Synced, SyncError> {
        let Some(entry) = self.record.entry(uid) else {
            return Ok(Synced::Done);
        };
        if self.cached_claim_of(&entry).is_some() {
            // Back in the cache (a relist): the claim's own sync carries on.
            return Ok(Synced::Done);
        }
        let claim = entry.claim;
        let mut observed = self.observe(&claim, uid);
        // Its class as the attempt had it, not as the cache has it now.
        observed.class = None;
        let node = self.node.as_ref().map(|node| &node.deployment);
        match step::next_step(&claim, observed, &self.policy(), node, self) {
            ClaimStep::Wait => Ok(Synced::Waiting),
            ClaimStep::Provision(provisioning) => {
                tracing::info!(claim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %uid, "finishing a provisioning whose claim is gone");
                self.measured(&claim, self.provision(&claim, *provisioning))
                    .await
            }
            ClaimStep::Finished { .. } | ClaimStep::Nothing => {
                self.record.leave(uid);
                Ok(Synced::Done)
            }
            other => Err(SyncError::InFlight {
                uid: uid.to_string(),
                step: format!("{other:?}"),
            }),
        }
    }

    /// Publishes the "Provisioning" Event, then carries out `work`, measured as one
    /// provisioning attempt of the claim's class and data source kind.
    async fn measured(
        &self,
        claim: &PersistentVolumeClaim,
        work: impl Future<Output = Result<(), SyncError>>,
    ) -> Result<Synced, SyncError> {
        let spec = claim.spec.as_ref();
        let labels = crate::metrics::ProvisionLabels {
            class: spec
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default(),
            source: spec
                .and_then(|s| s.data_source.as_ref())
                .map(|d| d.kind.clone())
                .unwrap_or_default(),
        };
        let started = Instant::now();
        self.note_provisioning(claim).await;
        let result = work.await;
        match &result {
            Ok(()) => self
                .settings
                .metrics
                .provisioned(&labels, started.elapsed()),
            Err(_) => self.settings.metrics.provision_failed(&labels),
        }
        result.map(|()| Synced::Done)
    }

    /// The "Provisioning" Event every provisioning attempt starts with.
    async fn note_provisioning(&self, claim: &PersistentVolumeClaim) {
        let message = format!(
            "External provisioner is provisioning volume for claim \"{}/{}\"",
            claim.namespace().unwrap_or_default(),
            claim.name_any()
        );
        self.note(claim, "Provisioning", &message).await;
    }

    /// Carries out a provisioning [`step::next_step`] decided: the data source, the claim's
    /// protection, CreateVolume, the PV, and the release of the claim.
    async fn provision(
        &self,
        claim: &PersistentVolumeClaim,
        provisioning: Provisioning,
    ) -> Result<(), SyncError> {
        let Provisioning {
            plan,
            class,
            selected_node,
            migration,
        } = provisioning;
        let (class, name) = (&*class, plan.name.as_str());
        let (content_source, protected_source) =
            self.content_source(claim, class, &plan.source).await?;
        let secrets = self.provisioner_secrets(claim, &plan.secret_refs).await?;
        let from_source = content_source.is_some();
        let create = request::create_volume(&plan, secrets.clone(), content_source);
        let claim = &self.protect(claim, class).await?;
        if let Some(source) = &protected_source {
            self.protect_source(source).await?;
        }
        let response = match self.csi.create_volume(create, self.settings.timeout).await {
            Ok(response) => response,
            Err(status) => {
                let has_selected_node = selected_node.is_some();
                return self
                    .create_failed(claim, class, &plan, has_selected_node, status)
                    .await;
            }
        };
        let (volume, bytes) =
            match request::created_volume(response, plan.requested_bytes, from_source) {
                Ok(created) => created,
                Err(error) => {
                    if let Some(volume_id) = error.abandoned_volume() {
                        let cleanup_failed = |status: &tonic::Status| {
                            ("ProvisioningFailed", error.cleanup_failed(name, status))
                        };
                        self.abandon(claim, volume_id, secrets, cleanup_failed)
                            .await?;
                    }
                    return self.failed(claim, error.to_string()).await;
                }
            };
        let pv = persistent_volume(&PvInputs {
            name,
            driver: &self.settings.driver.name,
            identity: &self.identity,
            claim,
            class,
            volume: &volume,
            bytes,
            fs_type: &plan.fs_type,
            secrets: &plan.secret_refs,
            controller_publish_readonly: self.settings.controller_publish_readonly,
            topology: plan.topology_supported,
            attributes_class: plan.attributes_class.as_deref(),
        });
        let pv = match migration {
            None => pv,
            Some(plugin) => match in_tree_volume(pv, plugin) {
                Ok(pv) => pv,
                // As upstream: a volume whose PV cannot be written is deleted again.
                Err(error) => {
                    let cleanup_failed = |status: &tonic::Status| {
                        (
                            "ProvisioningFailed",
                            format!(
                                "{error}; deleting volume {}: {}",
                                volume.volume_id,
                                GoStatus(status)
                            ),
                        )
                    };
                    self.abandon(claim, &volume.volume_id, secrets, cleanup_failed)
                        .await?;
                    return self.failed(claim, error.to_string()).await;
                }
            },
        };
        // Boxed: the PV and its create request are the largest state of a provisioning
        // sync; inline they would size every running one's future.
        Box::pin(self.save(claim, pv, &volume.volume_id, secrets)).await?;
        lock(&self.pinned).remove(&claim.uid().unwrap_or_default());
        let message = format!("Successfully provisioned volume {name}");
        self.note(claim, "ProvisioningSucceeded", &message).await;
        if let Some(ProtectedSource::Snapshot(snapshot)) = &protected_source {
            self.release_snapshot(snapshot, claim.uid().as_deref())
                .await;
        }
        self.release(claim).await
    }

    /// The provisioner secret's data (none without one); a failure is reported.
    async fn provisioner_secrets(
        &self,
        claim: &PersistentVolumeClaim,
        refs: &SecretRefs,
    ) -> Result<HashMap<String, String>, SyncError> {
        let Some(reference) = &refs.provisioner else {
            return Ok(HashMap::new());
        };
        match csi_sidecar::secrets::fetch_secret_data(self.client.clone(), reference).await {
            Ok(data) => Ok(data.into_inner()),
            Err(error) => self.failed(claim, error.to_string()).await,
        }
    }

    /// A failed CreateVolume: rescheduled, retried as still in progress, or final. A final
    /// error means the driver created nothing, so the claim is released until its next
    /// attempt: deleted meanwhile, it goes at once, even with no provisioner left to run.
    async fn create_failed(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        plan: &ProvisionPlan,
        has_selected_node: bool,
        status: tonic::Status,
    ) -> Result<(), SyncError> {
        if let Some(capacity) = &self.settings.capacity {
            capacity.refresh.class(&class.name_any());
        }
        let error = GoStatus(&status).to_string();
        let outcome = request::classify(status.code(), plan.topology_supported, has_selected_node);
        match outcome {
            Outcome::Reschedule => self.reschedule(claim, error).await,
            Outcome::InBackground => self.failed(claim, error).await,
            Outcome::Finished | Outcome::Infeasible => {
                let uid = claim.uid().unwrap_or_default();
                lock(&self.pinned).remove(&uid);
                self.release(claim).await?;
                if outcome == Outcome::Infeasible {
                    let class_uid = class.uid().unwrap_or_default();
                    self.infeasible.add(uid.clone(), class_uid, Instant::now());
                    let message = format!(
                        "Volume provisioning failed with infeasible error. Retries will be delayed. {error}"
                    );
                    return self.failed(claim, message).await;
                }
                self.failed(claim, error).await
            }
        }
    }

    /// Creates the PV; AlreadyExists counts as done. After a failure the claim is retried
    /// and CreateVolume (idempotent by name) returns the same volume, until the API server
    /// has refused the PV [`request::PV_SAVE_REFUSALS`] times: then the volume is deleted
    /// (with `secrets`) and reported, and provisioning starts over, as the library does.
    async fn save(
        &self,
        claim: &PersistentVolumeClaim,
        pv: serde_json::Value,
        volume_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<(), SyncError> {
        let object: PersistentVolume = serde_json::from_value(pv).map_err(SyncError::BuildPv)?;
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let uid = claim.uid().unwrap_or_default();
        let error = match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                self.volume_writes.created(object.name_any());
                lock(&self.save_refusals).remove(&uid);
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                lock(&self.save_refusals).remove(&uid);
                return Ok(());
            }
            Err(error) => error,
        };
        let code = match &error {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        };
        let refusals = lock(&self.save_refusals).get(&uid).copied().unwrap_or(0);
        match request::save_failure(refusals, code) {
            SaveFailure::Retry { refusals } => {
                lock(&self.save_refusals).insert(uid, refusals);
                self.failed(claim, format!("saving PV {}: {error}", object.name_any()))
                    .await
            }
            SaveFailure::DeleteVolume => {
                let message = format!(
                    "Error creating provisioned PV object for claim {}/{}: {error}. Deleting the volume.",
                    claim.namespace().unwrap_or_default(),
                    claim.name_any()
                );
                let failure = self.failed(claim, message).await;
                let cleanup_failed = |status: &tonic::Status| {
                    let message = format!(
                        "Error cleaning provisioned volume {volume_id} for claim {}/{}: {}",
                        claim.namespace().unwrap_or_default(),
                        claim.name_any(),
                        GoStatus(status)
                    );
                    ("ProvisioningCleanupFailed", message)
                };
                self.abandon(claim, volume_id, secrets, cleanup_failed)
                    .await?;
                lock(&self.save_refusals).remove(&uid);
                failure
            }
        }
    }

    /// Enters the claim in the in-flight record before the first CreateVolume, so neither a
    /// crash nor a deleted claim can lose track of a volume being created. Where the record
    /// cannot be written (no RBAC for the Lease), and on claims protected so before the
    /// record, the provisioning-protection finalizer does it instead, with the class recorded
    /// in the same patch.
    async fn protect(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<PersistentVolumeClaim, SyncError> {
        let protected = claim
            .finalizers()
            .iter()
            .any(|f| f == PROVISIONING_PROTECTION);
        if protected && claim.annotations().contains_key(PROVISIONING_CLASS) {
            return Ok(claim.clone());
        }
        if !protected && self.record.available() {
            match self.record.enter(claim, class).await {
                Ok(()) => return Ok(claim.clone()),
                Err(RecordWriteError::Forbidden(_)) => {}
                Err(error) => return Err(SyncError::Record(error)),
            }
        }
        let mut finalizers = claim.finalizers().to_vec();
        if !protected {
            finalizers.push(PROVISIONING_PROTECTION.to_string());
        }
        let record = protection::record(class).map_err(SyncError::ClassRecord)?;
        let annotations = BTreeMap::from([(PROVISIONING_CLASS, Some(record))]);
        self.patch_claim(claim, finalizers, &annotations)
            .await?
            .ok_or_else(|| SyncError::ClaimGone(claim.name_any()))
    }

    /// The PV exists, or nothing was created: the claim leaves the in-flight record, and a
    /// claim protected by the finalizer loses it and its class record.
    async fn release(&self, claim: &PersistentVolumeClaim) -> Result<(), SyncError> {
        self.record.leave(&claim.uid().unwrap_or_default());
        let finalized = claim
            .finalizers()
            .iter()
            .any(|f| f == PROVISIONING_PROTECTION);
        if !finalized && !claim.annotations().contains_key(PROVISIONING_CLASS) {
            return Ok(());
        }
        let finalizers = without(claim.finalizers(), PROVISIONING_PROTECTION);
        let annotations = BTreeMap::from([(PROVISIONING_CLASS, None)]);
        self.patch_claim(claim, finalizers, &annotations)
            .await
            .map(drop)
    }

    pub(super) async fn set_claim_finalizers(
        &self,
        claim: &PersistentVolumeClaim,
        finalizers: Vec<String>,
    ) -> Result<Option<PersistentVolumeClaim>, SyncError> {
        self.patch_claim(claim, finalizers, &BTreeMap::new()).await
    }

    async fn patch_claim(
        &self,
        claim: &PersistentVolumeClaim,
        finalizers: Vec<String>,
        annotations: &BTreeMap<&str, Option<String>>,
    ) -> Result<Option<PersistentVolumeClaim>, SyncError> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        let write = self.claim_writes.writing(claim_ref(claim), claim);
        let updated = set_finalizers_and_annotations(&api, claim, finalizers, annotations).await?;
        write.answered(updated.as_ref());
        Ok(updated)
    }

    /// Deletes a new volume the provisioner must not keep (too small, without its source, or
    /// without a PV the API server accepts) with the secrets its CreateVolume had (the class's
    /// provisioner secret serves both). A failure is the warning `cleanup_failed` words (its
    /// reason and message) and a retry, which finds the volume again by its name. Once it is
    /// gone, a claim on its way out is released: nothing is left to protect, and a new attempt
    /// would only create another volume to delete.
    async fn abandon(
        &self,
        claim: &PersistentVolumeClaim,
        volume_id: &str,
        secrets: HashMap<String, String>,
        cleanup_failed: impl FnOnce(&tonic::Status) -> (&'static str, String),
    ) -> Result<(), SyncError> {
        let request = csi::DeleteVolumeRequest {
            volume_id: volume_id.to_string(),
            secrets,
        };
        if let Err(status) = self.csi.delete_volume(request, self.settings.timeout).await {
            let (reason, message) = cleanup_failed(&status);
            return self.warn(&claim.object_ref(&()), reason, message).await;
        }
        tracing::info!(claim = %claim.name_any(), %volume_id, "deleted a new volume the provisioner cannot keep");
        lock(&self.pinned).remove(&claim.uid().unwrap_or_default());
        self.record.leave(&claim.uid().unwrap_or_default());
        if claim.metadata.deletion_timestamp.is_some() {
            self.release(claim).await?;
        }
        Ok(())
    }

    /// Gives the scheduler another choice: removes selected-node from the claim.
    async fn reschedule(
        &self,
        claim: &PersistentVolumeClaim,
        message: String,
    ) -> Result<(), SyncError> {
        lock(&self.pinned).remove(&claim.uid().unwrap_or_default());
        let failure = self.failed(claim, message).await;
        if claim.annotations().contains_key(SELECTED_NODE) {
            let api: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
            let patch = json!({"metadata": {"annotations": {SELECTED_NODE: null}}});
            let edit = |fresh: &mut ObjectMeta| {
                if let Some(annotations) = fresh.annotations.as_mut() {
                    annotations.remove(SELECTED_NODE);
                }
                true
            };
            let namespace = claim.namespace();
            patch_or_update(
                &api,
                namespace.as_deref(),
                &claim.name_any(),
                &Patch::Merge(patch),
                edit,
            )
            .await
            .map_err(|source| SyncError::Api {
                what: format!("removing {SELECTED_NODE}"),
                source,
            })?;
        }
        failure
    }
}

impl ClaimLookups for Provisioner {
    fn infeasible(&self, uid: &str, class_uid: &str) -> Option<Duration> {
        self.infeasible
            .remaining(uid, &class_uid.to_string(), Instant::now())
    }
}
