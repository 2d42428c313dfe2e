//! cosi-provisioner, the COSI sidecar next to one driver: Buckets of the driver become buckets
//! (DriverCreateBucket / DriverDeleteBucket), and BucketAccesses of its classes become
//! credentials Secrets (DriverGrantBucketAccess / DriverRevokeBucketAccess). Caches of
//! Buckets, BucketAccesses, BucketClaims and BucketAccessClasses; a change of a claim, of its
//! Bucket or of one of its accesses re-queues that claim's accesses and Bucket (no scan of
//! every cache); each sync acts on one step of [`plan`].

pub mod plan;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_kinds::objectstorage::{
    AuthenticationType, Bucket, BucketAccess, BucketAccessClass, BucketClaim,
};
use csi_proto::cosi::v1alpha1 as proto;
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::finalizers::{FinalizerError, add_finalizer, remove_finalizer};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use plan::{
    ACCESS_BUCKET_FINALIZER, ACCESS_FINALIZER, AccessPlan, BUCKET_FINALIZER, BUCKET_INFO_KEY,
    BucketPlan, CredentialsError, FAILED_CREATE_BUCKET, FAILED_DELETE_BUCKET, FAILED_GRANT_ACCESS,
    FAILED_REVOKE_ACCESS, Grant, SECRET_FINALIZER, WAITING_FOR_BUCKET,
};

#[derive(Clone, Debug)]
pub struct Settings {
    /// The driver's name (DriverGetInfo).
    pub driver: String,
    pub workers: usize,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub resync: Duration,
    /// Per driver call.
    pub timeout: Duration,
    pub cache_sync: Arc<CacheSyncHealth>,
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("{0}")]
    Refused(String),
    #[error("waiting: {0}")]
    Waiting(String),
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("{call}: {}", csi_grpc::conn::GoStatus(.status))]
    Driver {
        call: &'static str,
        status: tonic::Status,
    },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SidecarError {
    let what = what.into();
    move |source| SidecarError::Api { what, source }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Bucket(ObjectRef<Bucket>),
    Access(ObjectRef<BucketAccess>),
    /// Something of a claim changed: stands for its Bucket and its accesses in the next pass
    /// (never synced itself).
    Claim(ObjectRef<BucketClaim>),
}

/// The claim an access or a Bucket belongs to.
fn claim_key(namespace: Option<&str>, name: Option<&str>) -> Option<Key> {
    Some(Key::Claim(ObjectRef::new(name?).within(namespace?)))
}

struct Sidecar {
    client: Client,
    csi: CsiConnection,
    buckets: Store<Bucket>,
    accesses: Store<BucketAccess>,
    claims: Store<BucketClaim>,
    classes: Store<BucketAccessClass>,
    /// Accesses whose grant we wrote: a stale cached copy (not granted yet) must not grant
    /// again, which would replace the key the Secret already carries.
    granted: Superseded<ObjectRef<BucketAccess>>,
    events: EventRecorder,
    settings: Settings,
}

/// Runs the sidecar until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) {
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let work = workers.clone();
    let buckets = informers.all_with(move |b: &Bucket| {
        work.trigger_for(Key::Bucket(ObjectRef::from_obj(b)), b);
        let claim = &b.spec.bucket_claim;
        if let Some(key) = claim_key(claim.namespace.as_deref(), claim.name.as_deref()) {
            work.trigger(key);
        }
    });
    let work = workers.clone();
    let accesses = informers.all_with(move |a: &BucketAccess| {
        work.trigger_for(Key::Access(ObjectRef::from_obj(a)), a);
        if let Some(key) = claim_key(a.namespace().as_deref(), Some(&a.spec.bucket_claim_name)) {
            work.trigger(key);
        }
    });
    let work = workers.clone();
    let claims = informers.all_with(move |c: &BucketClaim| {
        work.trigger_for(Key::Claim(ObjectRef::from_obj(c)), c);
    });
    let classes = informers.all::<BucketAccessClass>();
    let Some(wake) = informers.synced().await else {
        return;
    };
    let sidecar = Arc::new(Sidecar {
        events: EventRecorder::new(client.clone(), format!("cosi-{}", settings.driver), ""),
        client,
        csi,
        buckets,
        accesses,
        claims,
        classes,
        granted: Superseded::default(),
        settings,
    });
    tracing::info!(driver = %sidecar.settings.driver, "cosi-provisioner started");
    workers
        .reconcile(
            &sidecar,
            JoinSet::new(),
            &wake,
            sidecar.settings.resync,
            &shutdown,
        )
        .await;
    sidecar.events.flush().await;
}

impl Reconciler for Sidecar {
    type Key = Key;
    type Error = SidecarError;

    fn keys(&self) -> Vec<Key> {
        let buckets = self.buckets.state();
        let accesses = self.accesses.state();
        buckets
            .iter()
            .map(|b| Key::Bucket(ObjectRef::from_obj(b.as_ref())))
            .chain(
                accesses
                    .iter()
                    .map(|a| Key::Access(ObjectRef::from_obj(a.as_ref()))),
            )
            .collect()
    }

    /// A claim's change concerns its Bucket and its accesses.
    fn concerned(&self, keys: Vec<Key>) -> Vec<Key> {
        self.expand_claims(keys)
    }

    /// What a key's plan reads, as one version: a Bucket's and its accesses' names and
    /// deletion; an access's, its class's, claim's and Bucket's.
    fn offer(&self, key: &Key) -> Offer {
        let version = |v: Option<String>| v.unwrap_or_default();
        match key {
            Key::Bucket(reference) => {
                let Some(bucket) = self.buckets.get(reference) else {
                    return Offer::Gone;
                };
                Offer::at(Some(format!(
                    "{}/{}",
                    version(bucket.resource_version()),
                    self.accesses_of(&bucket)
                        .iter()
                        .map(|a| format!("{}:{}", a.name, a.deleting))
                        .collect::<Vec<_>>()
                        .join(",")
                )))
            }
            // Replaced by the keys it concerns before offers are made.
            Key::Claim(_) => Offer::Idle,
            Key::Access(reference) => {
                let Some(access) = self.accesses.get(reference) else {
                    return Offer::Gone;
                };
                let (class, claim, bucket) = self.inputs(&access);
                Offer::at(Some(format!(
                    "{}/{}/{}/{}",
                    version(access.resource_version()),
                    version(class.and_then(|c| c.resource_version())),
                    version(claim.and_then(|c| c.resource_version())),
                    version(bucket.and_then(|b| b.resource_version())),
                )))
            }
        }
    }

    fn forget(&self, key: &Key) {
        if let Key::Access(reference) = key {
            self.granted.forget(reference);
        }
    }

    /// Each kind's sync in a box of its own size ([`SyncFuture`]).
    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SidecarError> {
        let this = self;
        match key {
            Key::Bucket(reference) => Box::pin(async move {
                match this.buckets.get(&reference) {
                    Some(bucket) => this.sync_bucket(&bucket).await,
                    None => Ok(Synced::Done),
                }
            }),
            Key::Access(reference) => Box::pin(async move {
                match this.accesses.get(&reference) {
                    Some(access)
                        if this
                            .granted
                            .is_stale(&reference, access.resource_version().as_deref()) =>
                    {
                        Ok(Synced::Waiting)
                    }
                    Some(access) => this.sync_access(&reference, &access).await,
                    None => Ok(Synced::Done),
                }
            }),
            Key::Claim(_) => Box::pin(std::future::ready(Ok(Synced::Done))),
        }
    }
}

impl Sidecar {
    /// `keys` with each claim key replaced by its Bucket and its accesses.
    fn expand_claims(&self, keys: Vec<Key>) -> Vec<Key> {
        let (claims, mut keys): (Vec<Key>, Vec<Key>) =
            keys.into_iter().partition(|k| matches!(k, Key::Claim(_)));
        if claims.is_empty() {
            return keys;
        }
        let accesses = self.accesses.state();
        for claim in claims {
            let Key::Claim(claim) = claim else { continue };
            let namespace = claim.namespace.clone().unwrap_or_default();
            keys.extend(
                accesses
                    .iter()
                    .filter(|a| a.namespace().as_deref() == Some(namespace.as_str()))
                    .filter(|a| a.spec.bucket_claim_name == claim.name)
                    .map(|a| Key::Access(ObjectRef::from_obj(a.as_ref()))),
            );
            if let Some(bucket) = self
                .claims
                .get(&claim)
                .and_then(|c| c.status.as_ref()?.bucket_name.clone())
            {
                keys.push(Key::Bucket(ObjectRef::new(&bucket)));
            }
        }
        keys
    }

    /// The BucketAccesses that name a Bucket's claim.
    fn accesses_of(&self, bucket: &Bucket) -> Vec<plan::ClaimAccess> {
        let reference = &bucket.spec.bucket_claim;
        let (Some(claim), Some(namespace)) = (&reference.name, &reference.namespace) else {
            return Vec::new();
        };
        self.accesses
            .state()
            .iter()
            .filter(|a| a.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|a| &a.spec.bucket_claim_name == claim)
            .map(|a| plan::ClaimAccess {
                name: a.name_any(),
                deleting: a.metadata.deletion_timestamp.is_some(),
            })
            .collect()
    }

    #[allow(clippy::type_complexity)]
    fn inputs(
        &self,
        access: &BucketAccess,
    ) -> (
        Option<Arc<BucketAccessClass>>,
        Option<Arc<BucketClaim>>,
        Option<Arc<Bucket>>,
    ) {
        let namespace = access.namespace().unwrap_or_default();
        let class = self
            .classes
            .get(&ObjectRef::new(&access.spec.bucket_access_class_name));
        let claim = self
            .claims
            .get(&ObjectRef::new(&access.spec.bucket_claim_name).within(&namespace));
        let bucket = claim
            .as_ref()
            .and_then(|c| c.status.as_ref()?.bucket_name.clone())
            .and_then(|name| self.buckets.get(&ObjectRef::new(&name)));
        (class, claim, bucket)
    }

    async fn warn(&self, object: &impl Resource<DynamicType = ()>, reason: &str, message: &str) {
        self.events
            .publish(&object.object_ref(&()), EventType::Warning, reason, message)
            .await;
    }

    /// A Warning Event on `object` saying `error`, which the sync then returns.
    async fn failed(
        &self,
        object: &impl Resource<DynamicType = ()>,
        reason: &str,
        error: SidecarError,
    ) -> SidecarError {
        self.warn(object, reason, &error.to_string()).await;
        error
    }

    async fn sync_bucket(&self, bucket: &Bucket) -> Result<Synced, SidecarError> {
        let buckets: Api<Bucket> = Api::all(self.client.clone());
        let name = bucket.name_any();
        let accesses = self.accesses_of(bucket);
        match plan::bucket(bucket, &self.settings.driver, &accesses) {
            BucketPlan::Done => {}
            BucketPlan::AddFinalizer => {
                add_finalizer(&buckets, bucket, BUCKET_FINALIZER).await?;
            }
            BucketPlan::Refuse(why) => {
                return Err(self
                    .failed(bucket, FAILED_CREATE_BUCKET, SidecarError::Refused(why))
                    .await);
            }
            BucketPlan::Adopt { bucket_id } => {
                self.bucket_ready(bucket, &bucket_id).await?;
            }
            BucketPlan::Create { parameters } => {
                let request = proto::DriverCreateBucketRequest {
                    name: name.clone(),
                    parameters: parameters.into_iter().collect(),
                };
                let created = match self
                    .csi
                    .driver_create_bucket(request, self.settings.timeout)
                    .await
                {
                    Ok(created) => created,
                    Err(status) => {
                        let error = SidecarError::Driver {
                            call: "DriverCreateBucket",
                            status,
                        };
                        return Err(self.failed(bucket, FAILED_CREATE_BUCKET, error).await);
                    }
                };
                if created.bucket_id.is_empty() {
                    let why = format!("DriverCreateBucket returned an empty bucket_id for {name}");
                    return Err(self
                        .failed(bucket, FAILED_CREATE_BUCKET, SidecarError::Refused(why))
                        .await);
                }
                tracing::info!(bucket = %name, bucket_id = %created.bucket_id, "created bucket");
                self.bucket_ready(bucket, &created.bucket_id).await?;
            }
            BucketPlan::DeleteAccesses(names) => {
                let namespace = bucket
                    .spec
                    .bucket_claim
                    .namespace
                    .clone()
                    .unwrap_or_default();
                let api: Api<BucketAccess> = Api::namespaced(self.client.clone(), &namespace);
                for access in names {
                    match api.delete(&access, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(source) => {
                            return Err(SidecarError::Api {
                                what: format!("deleting BucketAccess {namespace}/{access}"),
                                source,
                            });
                        }
                    }
                }
                return Ok(Synced::Waiting);
            }
            BucketPlan::WaitForAccesses => return Ok(Synced::Waiting),
            BucketPlan::RemoveAccessFinalizer => {
                remove_finalizer(&buckets, &name, ACCESS_BUCKET_FINALIZER).await?;
            }
            BucketPlan::DeleteAtProvider { bucket_id, context } => {
                let request = proto::DriverDeleteBucketRequest {
                    bucket_id,
                    delete_context: context.into_iter().collect(),
                };
                match self
                    .csi
                    .driver_delete_bucket(request, self.settings.timeout)
                    .await
                {
                    Ok(_) => tracing::info!(bucket = %name, "deleted bucket"),
                    Err(status) if status.code() == tonic::Code::NotFound => {}
                    Err(status) => {
                        let error = SidecarError::Driver {
                            call: "DriverDeleteBucket",
                            status,
                        };
                        return Err(self.failed(bucket, FAILED_DELETE_BUCKET, error).await);
                    }
                }
                remove_finalizer(&buckets, &name, BUCKET_FINALIZER).await?;
            }
            BucketPlan::RemoveFinalizer => {
                remove_finalizer(&buckets, &name, BUCKET_FINALIZER).await?;
            }
        }
        Ok(Synced::Done)
    }

    /// The Bucket's status says ready with its ID, and so does its claim's (upstream's sidecar
    /// sets the claim's, so it works with either controller).
    async fn bucket_ready(&self, bucket: &Bucket, bucket_id: &str) -> Result<(), SidecarError> {
        let name = bucket.name_any();
        let buckets: Api<Bucket> = Api::all(self.client.clone());
        buckets
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"bucketReady": true, "bucketID": bucket_id}})),
            )
            .await
            .map_err(api_error(format!("writing Bucket {name}'s status")))?;
        let reference = &bucket.spec.bucket_claim;
        if let (Some(claim), Some(namespace)) = (&reference.name, &reference.namespace) {
            let claims: Api<BucketClaim> = Api::namespaced(self.client.clone(), namespace);
            let patch = json!({"status": {"bucketReady": true, "bucketName": name}});
            match claims
                .patch_status(claim, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(SidecarError::Api {
                        what: format!("writing BucketClaim {namespace}/{claim}'s status"),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    async fn sync_access(
        &self,
        key: &ObjectRef<BucketAccess>,
        access: &BucketAccess,
    ) -> Result<Synced, SidecarError> {
        let namespace = access.namespace().unwrap_or_default();
        let accesses: Api<BucketAccess> = Api::namespaced(self.client.clone(), &namespace);
        let (class, claim, bucket) = self.inputs(access);
        match plan::access(
            access,
            class.as_deref(),
            claim.as_deref(),
            bucket.as_deref(),
            &self.settings.driver,
        ) {
            AccessPlan::Done => {}
            AccessPlan::AddFinalizer => {
                add_finalizer(&accesses, access, ACCESS_FINALIZER).await?;
            }
            AccessPlan::Wait(why) => {
                self.warn(access, WAITING_FOR_BUCKET, &why).await;
                return Err(SidecarError::Waiting(why));
            }
            AccessPlan::Refuse(why) => {
                return Err(self
                    .failed(access, FAILED_GRANT_ACCESS, SidecarError::Refused(why))
                    .await);
            }
            AccessPlan::Grant(grant) => {
                if let Err(error) = self.grant(access, &grant, bucket.as_deref()).await {
                    return Err(self.failed(access, FAILED_GRANT_ACCESS, error).await);
                }
                self.granted.supersede(key.clone(), access);
            }
            AccessPlan::Revoke {
                bucket_id,
                account_id,
            } => {
                if let Err(error) = self.revoke(access, bucket_id, account_id).await {
                    return Err(self.failed(access, FAILED_REVOKE_ACCESS, error).await);
                }
            }
        }
        Ok(Synced::Done)
    }

    async fn grant(
        &self,
        access: &BucketAccess,
        grant: &Grant,
        bucket: Option<&Bucket>,
    ) -> Result<(), SidecarError> {
        let namespace = access.namespace().unwrap_or_default();
        // The Bucket is held by its accesses before any credentials exist.
        if let Some(bucket) = bucket {
            let buckets: Api<Bucket> = Api::all(self.client.clone());
            add_finalizer(&buckets, bucket, ACCESS_BUCKET_FINALIZER).await?;
        }
        let request = proto::DriverGrantBucketAccessRequest {
            bucket_id: grant.bucket_id.clone(),
            name: grant.account_name.clone(),
            authentication_type: match grant.authentication_type {
                AuthenticationType::Key => proto::AuthenticationType::Key,
                AuthenticationType::Iam => proto::AuthenticationType::Iam,
            } as i32,
            parameters: grant.parameters.clone().into_iter().collect(),
        };
        let granted = self
            .csi
            .driver_grant_bucket_access(request, self.settings.timeout)
            .await
            .map_err(|status| SidecarError::Driver {
                call: "DriverGrantBucketAccess",
                status,
            })?;
        let credentials: HashMap<String, BTreeMap<String, String>> = granted
            .credentials
            .into_iter()
            .map(|(protocol, details)| (protocol, details.secrets.into_iter().collect()))
            .collect();
        let info = plan::bucket_info(access, grant, &granted.account_id, &credentials)?;
        let secret_name = &access.spec.credentials_secret_name;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": secret_name, "namespace": namespace,
                         "finalizers": [SECRET_FINALIZER]},
            "type": "Opaque",
            "stringData": {BUCKET_INFO_KEY: info},
        }))
        .expect("a Secret");
        // A Secret of this name that exists already is left as it is (upstream's rule) — unless
        // it is this access's own from an earlier grant, whose key the driver may just have
        // replaced: that one gets the new credentials.
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = secrets
                    .get_opt(secret_name)
                    .await
                    .map_err(api_error(format!(
                        "reading Secret {namespace}/{secret_name}"
                    )))?;
                if existing
                    .as_ref()
                    .is_some_and(|s| plan::is_own_secret(s, access))
                {
                    secrets
                        .patch(
                            secret_name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"stringData": {BUCKET_INFO_KEY: info}})),
                        )
                        .await
                        .map_err(api_error(format!(
                            "updating Secret {namespace}/{secret_name}"
                        )))?;
                }
            }
            Err(source) => {
                return Err(SidecarError::Api {
                    what: format!("creating Secret {namespace}/{secret_name}"),
                    source,
                });
            }
        }
        let accesses: Api<BucketAccess> = Api::namespaced(self.client.clone(), &namespace);
        accesses
            .patch_status(
                &access.name_any(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"accountID": granted.account_id, "accessGranted": true}}),
                ),
            )
            .await
            .map_err(api_error(format!(
                "writing BucketAccess {namespace}/{}'s status",
                access.name_any()
            )))?;
        tracing::info!(access = %format!("{namespace}/{}", access.name_any()), secret = %secret_name, "granted access");
        Ok(())
    }

    async fn revoke(
        &self,
        access: &BucketAccess,
        bucket_id: Option<String>,
        account_id: Option<String>,
    ) -> Result<(), SidecarError> {
        let namespace = access.namespace().unwrap_or_default();
        if let (Some(bucket_id), Some(account_id)) = (bucket_id, account_id) {
            let request = proto::DriverRevokeBucketAccessRequest {
                bucket_id,
                account_id,
                revoke_access_context: HashMap::new(),
            };
            match self
                .csi
                .driver_revoke_bucket_access(request, self.settings.timeout)
                .await
            {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    return Err(SidecarError::Driver {
                        call: "DriverRevokeBucketAccess",
                        status,
                    });
                }
            }
        }
        let secret_name = &access.spec.credentials_secret_name;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        remove_finalizer(&secrets, secret_name, SECRET_FINALIZER).await?;
        match secrets.delete(secret_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(SidecarError::Api {
                    what: format!("deleting Secret {namespace}/{secret_name}"),
                    source,
                });
            }
        }
        let accesses: Api<BucketAccess> = Api::namespaced(self.client.clone(), &namespace);
        remove_finalizer(&accesses, &access.name_any(), ACCESS_FINALIZER).await?;
        tracing::info!(access = %format!("{namespace}/{}", access.name_any()), "revoked access");
        Ok(())
    }
}
