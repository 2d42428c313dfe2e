//! cosi-controller: BucketClaims and the Buckets made for them, cluster-wide. Caches of
//! claims, classes and Buckets; a claim's change, a change of its Bucket (found by the
//! Bucket's `bucketClaim`) and a change of a class re-queue the claims concerned on the shared
//! keyed workers; each sync acts on [`claim::plan`]'s one step.

use std::sync::Arc;
use std::time::Duration;

use csi_kinds::objectstorage::{Bucket, BucketClaim, BucketClass};
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::finalizers::{FinalizerError, add_finalizer, remove_finalizer};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::claim::{
    self, BUCKET_CLAIM_FINALIZER, ClaimPlan, FAILED_CREATE_BUCKET, FAILED_DELETE_BUCKET, Refusal,
};

/// The Event source, as upstream's controller names itself.
pub const COMPONENT: &str = "cosi-controller-manager";

#[derive(Clone, Debug)]
pub struct Settings {
    pub workers: usize,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub resync: Duration,
    pub cache_sync: Arc<CacheSyncHealth>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("creating Bucket {name}: {source}")]
    CreateBucket { name: String, source: kube::Error },
    #[error("binding Bucket {name}: {source}")]
    BindBucket { name: String, source: kube::Error },
    #[error("deleting Bucket {name}: {source}")]
    DeleteBucket { name: String, source: kube::Error },
    #[error("writing the status: {0}")]
    Status(kube::Error),
}

struct Controller {
    client: Client,
    claims: Store<BucketClaim>,
    classes: Store<BucketClass>,
    buckets: Store<Bucket>,
    events: EventRecorder,
    settings: Settings,
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, settings: Settings, shutdown: CancellationToken) {
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let work = workers.clone();
    let claims =
        informers.all_with(move |c: &BucketClaim| work.trigger_for(ObjectRef::from_obj(c), c));
    let work = workers.clone();
    let buckets = informers.all_with(move |b: &Bucket| {
        let reference = &b.spec.bucket_claim;
        if let (Some(name), Some(namespace)) = (&reference.name, &reference.namespace) {
            work.trigger(ObjectRef::new(name).within(namespace));
        }
    });
    let classes = informers.all::<BucketClass>();
    let Some(wake) = informers.synced().await else {
        return;
    };
    let controller = Arc::new(Controller {
        events: EventRecorder::new(client.clone(), COMPONENT, ""),
        client,
        claims,
        classes,
        buckets,
        settings,
    });
    tracing::info!("cosi-controller started");
    workers
        .reconcile(
            &controller,
            JoinSet::new(),
            &wake,
            controller.settings.resync,
            &shutdown,
        )
        .await;
    controller.events.flush().await;
}

impl Reconciler for Controller {
    type Key = ObjectRef<BucketClaim>;
    type Error = ClaimError;

    fn keys(&self) -> Vec<Self::Key> {
        let claims = self.claims.state();
        claims.iter().map(|c| ObjectRef::from_obj(&**c)).collect()
    }

    /// What a claim's plan reads, as one version: the claim's, its class's and its Bucket's.
    fn offer(&self, key: &Self::Key) -> Offer {
        let Some(claim) = self.claims.get(key) else {
            return Offer::Gone;
        };
        let (class, bucket) = self.inputs(&claim);
        let version = |v: Option<String>| v.unwrap_or_default();
        Offer::at(Some(format!(
            "{}/{}/{}",
            version(claim.resource_version()),
            version(class.and_then(|c| c.resource_version())),
            version(bucket.and_then(|b| b.resource_version())),
        )))
    }

    fn sync(self: Arc<Self>, key: Self::Key) -> SyncFuture<ClaimError> {
        Box::pin(async move { self.sync_claim(&key).await })
    }
}

impl Controller {
    fn inputs(&self, claim: &BucketClaim) -> (Option<Arc<BucketClass>>, Option<Arc<Bucket>>) {
        let class = claim
            .spec
            .bucket_class_name
            .as_ref()
            .and_then(|name| self.classes.get(&ObjectRef::new(name)));
        let bucket =
            claim::bucket_name(claim).and_then(|name| self.buckets.get(&ObjectRef::new(&name)));
        (class, bucket)
    }

    async fn sync_claim(&self, key: &ObjectRef<BucketClaim>) -> Result<Synced, ClaimError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(Synced::Done);
        };
        let (class, bucket) = self.inputs(&claim);
        let namespace = claim.namespace().unwrap_or_default();
        let claims: Api<BucketClaim> = Api::namespaced(self.client.clone(), &namespace);
        let buckets: Api<Bucket> = Api::all(self.client.clone());
        let step = claim::plan(&claim, class.as_deref(), bucket.as_deref());
        tracing::debug!(claim = %key, ?step, "syncing BucketClaim");
        match step {
            ClaimPlan::Done | ClaimPlan::WaitForBucket(_) => {}
            ClaimPlan::AddFinalizer => {
                add_finalizer(&claims, &claim, BUCKET_CLAIM_FINALIZER).await?;
            }
            ClaimPlan::CreateBucket(bucket) => {
                let name = bucket.name_any();
                match buckets.create(&PostParams::default(), &bucket).await {
                    Ok(_) => tracing::info!(claim = %key, bucket = %name, "created Bucket"),
                    // Made by an earlier sync the cache does not show yet.
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(source) => {
                        let error = ClaimError::CreateBucket { name, source };
                        self.warn(&claim, FAILED_CREATE_BUCKET, &error).await;
                        return Err(error);
                    }
                }
            }
            ClaimPlan::BindBucket {
                name,
                claim: reference,
                protocols,
            } => {
                let patch = json!({"spec": {"bucketClaim": reference, "protocols": protocols}});
                if let Err(source) = buckets
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    let error = ClaimError::BindBucket { name, source };
                    self.warn(&claim, FAILED_CREATE_BUCKET, &error).await;
                    return Err(error);
                }
                tracing::info!(claim = %key, bucket = %name, "bound existing Bucket");
            }
            ClaimPlan::SetStatus { bucket_name, ready } => {
                let patch = json!({"status": {"bucketName": bucket_name, "bucketReady": ready}});
                claims
                    .patch_status(
                        &claim.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(patch),
                    )
                    .await
                    .map_err(ClaimError::Status)?;
            }
            ClaimPlan::Refuse(refusal) => {
                let error = ClaimError::Refused(refusal);
                self.warn(&claim, FAILED_CREATE_BUCKET, &error).await;
                return Err(error);
            }
            ClaimPlan::DeleteBucket(name) => {
                match buckets.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(claim = %key, bucket = %name, "deleting Bucket"),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(source) => {
                        let error = ClaimError::DeleteBucket { name, source };
                        self.warn(&claim, FAILED_DELETE_BUCKET, &error).await;
                        return Err(error);
                    }
                }
            }
            ClaimPlan::RemoveFinalizer => {
                remove_finalizer(&claims, &claim.name_any(), BUCKET_CLAIM_FINALIZER).await?;
            }
        }
        Ok(Synced::Done)
    }

    async fn warn(&self, claim: &BucketClaim, reason: &str, error: &ClaimError) {
        self.events
            .publish(
                &claim.object_ref(&()),
                EventType::Warning,
                reason,
                &error.to_string(),
            )
            .await;
    }
}
