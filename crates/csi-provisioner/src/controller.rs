//! The provisioner's adapters: caches of claims, volumes, classes, CSINodes, Nodes and
//! VolumeAttachments; a pass over them on every change decides per claim and per PV (pure
//! cores in [`crate::claims`], [`crate::deletion`], [`crate::request`], [`crate::topology`]),
//! and bounded workers carry out CSI calls and API writes with per-object backoff.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_proto::csi::v1 as csi;
use csi_sidecar::cached::{CachedAttachment, CachedClaim, CachedVolume};
use csi_sidecar::conn::{CsiConnection, DriverInfo, GoStatus};
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::finalizers::{
    FinalizerError, remove_finalizer, remove_finalizer_from, set_finalizers,
    set_finalizers_and_annotations, without,
};
use csi_sidecar::informers::{CacheSyncHealth, Informers, keep_node_labels};
use csi_sidecar::lock;
use csi_sidecar::secrets::{self, DeletionSecret, SecretRef, SecretRefs, TemplateInputs};
use csi_sidecar::slow_set::SlowSet;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, SyncFuture, Synced};
use csi_sidecar::writes::patch_or_update;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::capacity::controller::{Refresh, Segments, SharedCaches};
use crate::claims::{self, CLONING_PROTECTION, DataSource, SELECTED_NODE};
use crate::grants::ReferenceGrant;
use crate::snapshots::{self, SOURCE_PROTECTION, VolumeSnapshot, VolumeSnapshotContent};
use crate::vac::{self, VacError, VolumeAttributesClass};

use crate::deletion::{self, PV_FINALIZER, VolumePlan};
use crate::node_deployment::{NodeDeployment, OwnerBackoff};
use crate::protection::{self, PROVISIONING_CLASS, PROVISIONING_PROTECTION};
use crate::provision::{self, PlannedSource, Policy, ProvisionPlan, Refusal};
use crate::pv::{PvInputs, persistent_volume};
use crate::request::{self, Outcome, SaveFailure};
use crate::step::{self, ClaimLookups, ClaimStep, Observed, Provisioning, Volume};
use crate::sync_error::{SnapshotSourceCause, SnapshotSourceError, SyncError};
use crate::topology::{PinnedTopology, SelectedNode, TopologyError};

/// How the provisioner is set up (from its flags and the driver's discovery).
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: DriverInfo,
    pub volume_name_prefix: String,
    pub volume_name_uuid_length: i64,
    pub default_fstype: String,
    pub extra_create_metadata: bool,
    pub strict_topology: bool,
    pub immediate_topology: bool,
    pub controller_publish_readonly: bool,
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub workers: usize,
    /// Workers releasing deleted clone sources (`--cloning-protection-threads`): a pool of
    /// their own, as upstream's CloningProtectionController has, so a storm of provisioning
    /// cannot hold up the release of sources (nor the other way round).
    pub cloning_protection_workers: usize,
    /// The Topology gate: off, the driver's topology support is not used (upstream's
    /// `SupportsTopology` is the driver's capability and the gate).
    pub topology: bool,
    pub metrics: crate::metrics::ProvisionerMetrics,
    /// Where the caches report whether they got their initial lists (`/healthz`).
    pub cache_sync: Arc<CacheSyncHealth>,
    /// Periodic pass on top of change-triggered ones (upstream resyncs claims every 15 min).
    pub resync: Duration,
    /// Refuse restores that change the volume mode without the content's permission.
    pub prevent_volume_mode_conversion: bool,
    /// How often snapshots left with the source-protection finalizer are swept.
    pub snapshot_orphan_sweep_interval: Duration,
    /// Capacity tracking, when `--enable-capacity` (runs with the controller, so only on the
    /// leader).
    pub capacity: Option<crate::capacity::controller::CapacitySettings>,
    /// Claims' VolumeAttributesClasses: the gate after discovery (see [`vac::discover`]).
    pub volume_attributes_classes: vac::Support,
    /// The CrossNamespaceVolumeDataSource gate: `dataSourceRef.namespace` honoured when a
    /// ReferenceGrant allows it.
    pub cross_namespace_data_sources: bool,
    /// `--node-deployment`: this instance serves one node only.
    pub node_deployment: Option<NodeDeployment>,
}

struct Caches {
    claims: Store<CachedClaim>,
    volumes: Store<CachedVolume>,
    classes: Store<StorageClass>,
    topology: NodeTopology,
    attachments: Store<CachedAttachment>,
    /// With [`vac::Support::Served`] only.
    attribute_classes: Option<Store<VolumeAttributesClass>>,
    /// With the CrossNamespaceVolumeDataSource gate only.
    reference_grants: Option<Store<ReferenceGrant>>,
}

/// The node of a `--node-deployment` instance, and the delays before it tries to own
/// Immediate claims.
struct OwnNode {
    deployment: NodeDeployment,
    backoff: OwnerBackoff,
}

/// Where the topology of nodes comes from.
enum NodeTopology {
    /// Every CSINode and Node.
    Watched {
        csi_nodes: Store<CSINode>,
        nodes: Store<Node>,
    },
    /// `--node-deployment`, as upstream: this node as its driver's NodeGetInfo describes it
    /// is all the topology code needs (only claims selecting it are provisioned), and Nodes,
    /// which change often, are not watched.
    Own(SelectedNode),
}

/// The work item of one claim or one PV.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Claim(ObjectRef<CachedClaim>),
    Volume(String),
    /// A deleted claim whose cloning-protection finalizer waits for its clones.
    CloneSource(ObjectRef<CachedClaim>),
}

impl Key {
    /// The worker pool the key runs in: provisioning and deletion share `--worker-threads`;
    /// clone sources have `--cloning-protection-threads`.
    fn lane(&self) -> usize {
        match self {
            Key::Claim(_) | Key::Volume(_) => 0,
            Key::CloneSource(_) => 1,
        }
    }
}

/// The work a claim brings: its provisioning, and while it is being deleted with the
/// cloning-protection finalizer, the release of that finalizer.
fn claim_keys<K: Resource<DynamicType = ()>>(claim: &K) -> impl Iterator<Item = Key> + use<K> {
    let reference = claim_ref(claim);
    let clone_source = (claim.meta().deletion_timestamp.is_some()
        && claim.finalizers().iter().any(|f| f == CLONING_PROTECTION))
    .then(|| Key::CloneSource(reference.clone()));
    std::iter::once(Key::Claim(reference)).chain(clone_source)
}

/// The cache's reference to a claim, cached or not.
fn claim_ref<K: Resource<DynamicType = ()>>(claim: &K) -> ObjectRef<CachedClaim> {
    ObjectRef::from_obj(claim).into_kind_unchecked(())
}

struct Provisioner {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    identity: String,
    caches: Caches,
    /// sig-storage-lib's recorder: every Event but one comes from the library.
    events: EventRecorder,
    /// csi-provisioner's own recorder ("external-provisioner"): the external-populator note.
    csi_events: EventRecorder,
    /// Topology inputs pinned per claim UID, so retries send the same request.
    pinned: Mutex<HashMap<String, PinnedTopology>>,
    /// Claim UIDs whose CreateVolume was refused as infeasible, tagged with their class's UID:
    /// retried after `--retry-interval-max` (sig-storage-lib's slow set).
    infeasible: SlowSet<String, String>,
    workers: Arc<KeyedWorkers<Key>>,
    /// Our writes to claims the cache does not show yet: a sync that read the older claim
    /// would redo them (a second CreateVolume, PV create, finalizer patch and Events).
    claim_writes: Arc<Superseded<ObjectRef<CachedClaim>>>,
    /// PVs we created or deleted that the cache does not show so yet.
    volume_writes: Superseded<String>,
    /// Claim UID → how often the API server refused its PV (see [`request::save_failure`]).
    save_refusals: Mutex<HashMap<String, u32>>,
    /// With `--node-deployment`: the node served.
    node: Option<OwnNode>,
    /// An error that ends the provisioner (set once; `stop` is then cancelled).
    fatal: std::sync::OnceLock<request::RequestError>,
    stop: CancellationToken,
}

/// A data source that carries a protection finalizer while the driver copies from it.
enum ProtectedSource {
    Claim(Arc<PersistentVolumeClaim>),
    Snapshot(Box<VolumeSnapshot>),
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// No claim can be given a volume name (upstream panics on the first claim it provisions).
    #[error(transparent)]
    VolumeName(request::RequestError),
}

/// Runs the provisioner until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), ProvisionerError> {
    let workers = KeyedWorkers::with_lane_sizes(
        &[settings.workers, settings.cloning_protection_workers],
        settings.retry_start,
        settings.retry_max,
    );
    // Upstream's queues: sig-storage-lib's "claims" and "volumes"; its cloning-protection
    // controller's queue is named "claims" too.
    let queues = &settings.metrics.workqueues;
    workers.report_to(
        vec![queues.queue("claims"), queues.queue("volumes")],
        |key| match key {
            Key::Claim(_) | Key::CloneSource(_) => 0,
            Key::Volume(_) => 1,
        },
    );
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    // Upstream GETs a claim's class when it provisions and its sample RBAC grants no access
    // to classes: the cache of them must neither hold up provisioning nor fail /healthz when
    // it cannot list (its warnings name the cause, and claims naming a class say it is not
    // synced).
    let mut optional = Informers::new(&client, &shutdown);
    let (claim_work, volume_work) = (workers.clone(), workers.clone());
    let claim_writes = Arc::new(Superseded::default());
    let observed = claim_writes.clone();
    let claims = informers.all_observing(move |how, claim: &CachedClaim| {
        let version = claim.resource_version();
        observed.observed(&ObjectRef::from_obj(claim), version.as_deref(), how);
        claim_keys(claim).for_each(|key| claim_work.trigger_for(key, claim));
    });
    let attachments = informers.all();
    let attribute_classes =
        (settings.volume_attributes_classes == vac::Support::Served).then(|| optional.all());
    // As upstream, the gate makes the provisioner wait for this cache too.
    let reference_grants = settings
        .cross_namespace_data_sources
        .then(|| informers.all());
    // Capacity tracking reads the caches made from here on (one store per kind for both):
    // their changes wake it too, and it hears of the driver's PVs.
    let capacity = settings.capacity.as_ref().map(|c| c.refresh.clone());
    informers.also_waking(capacity.as_ref().map(Refresh::wake));
    let driver = settings.driver.name.clone();
    let caches = Caches {
        claims,
        volumes: informers.all_with(move |volume: &CachedVolume| {
            volume_work.trigger_for(Key::Volume(volume.name_any()), volume);
            let driver_of = volume.spec.as_ref().and_then(|s| s.csi.as_ref());
            if let Some(capacity) = &capacity
                && driver_of.is_some_and(|csi| csi.driver == driver)
            {
                capacity.volume(volume);
            }
        }),
        classes: informers.all(),
        topology: match &settings.node_deployment {
            Some(nd) => NodeTopology::Own(nd.selected_node()),
            None => NodeTopology::Watched {
                csi_nodes: informers.all(),
                // Only their labels are read (topology).
                nodes: informers.all_lean(keep_node_labels),
            },
        },
        attachments,
        attribute_classes,
        reference_grants,
    };
    drop(optional);
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut identity = format!("{started}-{}-{}", rand_suffix(), settings.driver.name);
    // As upstream: the identity PVs record in their volume attributes names the node.
    if let Some(nd) = &settings.node_deployment {
        identity = format!("{identity}-{}", nd.node_name);
    }
    let provisioner = Arc::new(Provisioner {
        events: EventRecorder::new(
            client.clone(),
            library_event_component(
                &settings.driver.name,
                &csi_sidecar::leader::hostname(),
                uuid::Uuid::new_v4(),
            ),
            "",
        ),
        csi_events: EventRecorder::new(client.clone(), "external-provisioner", ""),
        workers,
        client,
        csi,
        identity,
        caches,
        pinned: Mutex::new(HashMap::new()),
        infeasible: SlowSet::new(settings.retry_max),
        claim_writes,
        volume_writes: Superseded::default(),
        save_refusals: Mutex::new(HashMap::new()),
        node: settings.node_deployment.clone().map(|deployment| OwnNode {
            backoff: OwnerBackoff::new(deployment.base_delay, deployment.max_delay),
            deployment,
        }),
        fatal: std::sync::OnceLock::new(),
        stop: shutdown.child_token(),
        settings,
    });
    tracing::info!(driver = %provisioner.settings.driver.name, identity = %provisioner.identity, "provisioner started");
    // The sweeper and capacity tracking belong to the loop: they stop with it (shutdown, lost
    // leadership, a fatal error, or the task dropped).
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(provisioner.clone().sweep_snapshots(shutdown.clone()));
    if let Some(capacity) = provisioner.settings.capacity.clone() {
        tasks.spawn(crate::capacity::controller::run(
            capacity,
            provisioner.csi.clone(),
            provisioner.settings.driver.name.clone(),
            provisioner.shared_with_capacity(),
            shutdown.clone(),
        ));
    }
    provisioner
        .workers
        .run(
            tasks,
            &wake,
            provisioner.settings.resync,
            &provisioner.stop,
            |tasks, full| provisioner.pass(tasks, full),
        )
        .await;
    let error = provisioner
        .fatal
        .get()
        .cloned()
        .map(ProvisionerError::VolumeName);
    error.map_or(Ok(()), Err)
}

/// A number in [0, 1) that differs between instances and calls (`RandomState` is seeded
/// randomly), for the jitter that keeps node instances from trying to own a claim at once.
fn random_fraction(uid: &str) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one(uid);
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// A few random digits, as upstream's identity carries (`rand.Intn(10000)`).
/// The source component of sig-storage-lib's Events: `<provisioner>_<host>_<uuid>`, the UUID
/// keeping two processes on one host apart.
pub fn library_event_component(driver: &str, host: &str, instance: uuid::Uuid) -> String {
    format!("{driver}_{host}_{instance}")
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id()) % 10_000
}

impl Provisioner {
    /// The caches capacity tracking reads: the same stores as the provisioner's.
    fn shared_with_capacity(&self) -> SharedCaches {
        let caches = &self.caches;
        let segments = match &caches.topology {
            NodeTopology::Watched { csi_nodes, nodes } => {
                Segments::Watched(csi_nodes.clone(), nodes.clone())
            }
            // Its labels are the node's segment (NodeGetInfo).
            NodeTopology::Own(node) => Segments::Fixed(node.labels.clone()),
        };
        SharedCaches {
            classes: caches.classes.clone(),
            volumes: caches.volumes.clone(),
            segments,
        }
    }

    /// Offers the keys the watches brought, those waiting and those due for a retry — or,
    /// when `full` (the periodic resync), every claim and PV.
    fn pass(self: &Arc<Self>, tasks: &mut tokio::task::JoinSet<()>, full: bool) {
        self.forget_seen_writes();
        let offered: Vec<(Key, Option<String>, usize)> = if full {
            self.forget_gone_claims();
            let claims = self.caches.claims.state().into_iter().flat_map(|c| {
                let version = c.resource_version();
                claim_keys(&*c).map(move |key| (key, version.clone()))
            });
            let volumes = self
                .caches
                .volumes
                .state()
                .into_iter()
                .map(|v| (Key::Volume(v.name_any()), v.resource_version()));
            let offered: Vec<_> = claims
                .chain(volumes)
                .map(|(key, version)| {
                    let lane = key.lane();
                    (key, version, lane)
                })
                .collect();
            self.workers
                .forget_absent(offered.iter().map(|(key, _, _)| key.clone()));
            offered
        } else {
            self.workers
                .due()
                .into_iter()
                .filter_map(|key| match self.version(&key) {
                    Some(version) => {
                        let lane = key.lane();
                        Some((key, version, lane))
                    }
                    None => {
                        self.workers.forget(&key);
                        None
                    }
                })
                .collect()
        };
        tracing::trace!(offered = offered.len(), full, "pass");
        let this = self.clone();
        self.workers.offer_on_lanes(tasks, offered, move |key| {
            let this = this.clone();
            let sync: SyncFuture<SyncError> = match key {
                Key::Claim(reference) => Box::pin(async move { this.sync_claim(&reference).await }),
                Key::Volume(name) => Box::pin(async move { this.sync_volume(&name).await }),
                Key::CloneSource(reference) => {
                    Box::pin(async move { this.sync_clone_source(&reference).await })
                }
            };
            sync
        });
    }

    /// The resourceVersion of `key`'s object as cached; `None` when the object (or, for a
    /// clone source, its release) is gone.
    fn version(&self, key: &Key) -> Option<Option<String>> {
        match key {
            Key::Claim(reference) => self
                .caches
                .claims
                .get(reference)
                .map(|c| c.resource_version()),
            Key::CloneSource(reference) => self
                .caches
                .claims
                .get(reference)
                .filter(|c| claim_keys(&**c).any(|k| matches!(k, Key::CloneSource(_))))
                .map(|c| c.resource_version()),
            Key::Volume(name) => self
                .caches
                .volumes
                .get(&ObjectRef::new(name))
                .map(|v| v.resource_version()),
        }
    }

    /// Drops the per-claim state of claims that are gone (on the periodic resync).
    fn forget_gone_claims(&self) {
        let uids: HashSet<String> = self
            .caches
            .claims
            .state()
            .iter()
            .filter_map(|c| c.uid())
            .collect();
        lock(&self.pinned).retain(|uid, _| uids.contains(uid));
        lock(&self.save_refusals).retain(|uid, _| uids.contains(uid));
        self.infeasible.retain(|uid| uids.contains(uid));
        if let Some(node) = &self.node {
            node.backoff.retain(&uids);
        }
    }

    /// Forgets our writes the caches have caught up with.
    fn forget_seen_writes(&self) {
        let claims = &self.caches.claims;
        self.claim_writes
            .forget_caught_up(|reference| claims.get(reference).map(|c| c.resource_version()));
        let volumes = &self.caches.volumes;
        self.volume_writes.forget_caught_up(|name| {
            volumes
                .get(&ObjectRef::new(name))
                .map(|v| v.resource_version())
        });
    }

    /// The cached claim, unless the cache does not show our last write to it yet (`Err`:
    /// the sync waits for it).
    fn current_claim(
        &self,
        reference: &ObjectRef<CachedClaim>,
    ) -> Result<Option<Arc<PersistentVolumeClaim>>, Synced> {
        let Some(claim) = self.caches.claims.get(reference) else {
            return Ok(None);
        };
        if self
            .claim_writes
            .lags(reference, true, claim.resource_version().as_deref())
        {
            return Err(Synced::Waiting);
        }
        Ok(Some(Arc::new(claim.to_claim())))
    }

    /// A claim's sync: the claim as cached, what the caches hold for it, and
    /// [`step::next_step`] decides what is done.
    async fn sync_claim(&self, reference: &ObjectRef<CachedClaim>) -> Result<Synced, SyncError> {
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
            fallback_hash: rand_suffix(),
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

    async fn sync_clone_source(
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

    /// A warning Event with `reason` on `object`; the sync fails with `message`.
    async fn warn<T>(
        &self,
        object: &ObjectReference,
        reason: &'static str,
        message: String,
    ) -> Result<T, SyncError> {
        self.events
            .publish(object, EventType::Warning, reason, &message)
            .await;
        Err(SyncError::Reported { reason, message })
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

    async fn failed<T>(
        &self,
        claim: &PersistentVolumeClaim,
        message: String,
    ) -> Result<T, SyncError> {
        self.warn(&claim.object_ref(&()), "ProvisioningFailed", message)
            .await
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

    /// A Normal Event on the claim.
    async fn note(&self, claim: &PersistentVolumeClaim, reason: &str, message: &str) {
        self.events
            .publish(&claim.object_ref(&()), EventType::Normal, reason, message)
            .await;
    }

    /// CreateVolume's content source and the object to protect while the driver copies from
    /// it; a snapshot is read (and checked) now. A failure is reported.
    async fn content_source(
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

    /// The provisioner secret's data (none without one); a failure is reported.
    async fn provisioner_secrets(
        &self,
        claim: &PersistentVolumeClaim,
        refs: &SecretRefs,
    ) -> Result<HashMap<String, String>, SyncError> {
        let Some(reference) = &refs.provisioner else {
            return Ok(HashMap::new());
        };
        match secrets::fetch_secret_data(self.client.clone(), reference).await {
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

    /// The flags and driver facts plans depend on.
    fn policy(&self) -> Policy<'_> {
        let settings = &self.settings;
        Policy {
            driver: &settings.driver,
            default_fstype: &settings.default_fstype,
            extra_create_metadata: settings.extra_create_metadata,
            topology: settings.topology,
            strict_topology: settings.strict_topology,
            immediate_topology: settings.immediate_topology,
            cross_namespace_data_sources: settings.cross_namespace_data_sources,
            volume_attributes_classes: settings.volume_attributes_classes,
        }
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
    async fn protect_source(&self, source: &ProtectedSource) -> Result<(), SyncError> {
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
    async fn release_snapshot(&self, snapshot: &VolumeSnapshot, except: Option<&str>) {
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

    /// `SnapshotFinalizerController`: every sweep interval, snapshots whose restores are all
    /// done lose the source-protection finalizer. Without permission to list snapshots it
    /// stops quietly, as upstream.
    async fn sweep_snapshots(self: Arc<Self>, shutdown: CancellationToken) {
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

    /// Adds the provisioning-protection finalizer before the first CreateVolume, so neither a
    /// crash nor a deleted claim can lose track of a volume being created; the class is
    /// recorded in the same patch (also on a claim protected before records existed).
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

    /// Removes the provisioning-protection finalizer and its record (the PV exists, or
    /// nothing was created).
    async fn release(&self, claim: &PersistentVolumeClaim) -> Result<(), SyncError> {
        let finalizers = without(claim.finalizers(), PROVISIONING_PROTECTION);
        let annotations = BTreeMap::from([(PROVISIONING_CLASS, None)]);
        self.patch_claim(claim, finalizers, &annotations)
            .await
            .map(drop)
    }

    async fn set_claim_finalizers(
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
        if claim.metadata.deletion_timestamp.is_some() {
            self.release(claim).await?;
        }
        Ok(())
    }

    /// Upstream's `becomeOwner`: waits this claim's delay (watching the cache for another
    /// node taking it meanwhile), checks that the node has room for it, then sets
    /// selected-node to this node. The write carries the resourceVersion read, so of
    /// instances writing at once only one succeeds; the others see the winner in their cache.
    async fn become_owner(
        &self,
        node: &OwnNode,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<Synced, SyncError> {
        let (nd, backoff) = (&node.deployment, &node.backoff);
        let uid = claim.uid().unwrap_or_default();
        let delay = backoff.next(&uid, random_fraction(&uid));
        tracing::debug!(claim = %claim.name_any(), ?delay, "will try to become owner of the claim");
        // A high base delay means checking less often; many instances waiting at once make it
        // likely that one wins early, so not much less often either.
        let poll = (nd.base_delay / 100).max(Duration::from_millis(10));
        let reference = claim_ref(claim);
        let deadline = tokio::time::Instant::now() + delay;
        let current = loop {
            let current = self.caches.claims.get(&reference);
            let Some(current) = current.filter(|c| c.uid().as_deref() == Some(uid.as_str())) else {
                backoff.forget(&uid);
                return Ok(Synced::Done);
            };
            let owned = current
                .annotations()
                .get(SELECTED_NODE)
                .is_some_and(|n| !n.is_empty());
            if owned {
                // Another instance was faster (or, upstream's sanity check, this one already
                // owns it): its update brings the claim back. A reschedule later starts from
                // the base delay.
                backoff.forget(&uid);
                return Ok(Synced::Done);
            }
            if tokio::time::Instant::now() >= deadline {
                break current.to_claim();
            }
            tokio::time::sleep(poll.min(deadline - tokio::time::Instant::now())).await;
        };
        // As upstream, a failed check does not keep the claim from being owned: provisioning
        // then fails the same way and says so in an event.
        match self.enough_capacity(nd, &current, class).await {
            Ok(false) => {
                tracing::debug!(claim = %claim.name_any(), "not enough capacity on this node");
                return Ok(Synced::Done);
            }
            Ok(true) => {}
            Err(error) => {
                tracing::info!(claim = %claim.name_any(), %error, "becoming owner although the capacity check failed");
            }
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(
            self.client.clone(),
            &current.namespace().unwrap_or_default(),
        );
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "annotations": {SELECTED_NODE: nd.node_name},
        }});
        let read_version = current.resource_version();
        let edit = |fresh: &mut ObjectMeta| {
            fresh.resource_version == read_version && {
                fresh
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(SELECTED_NODE.to_string(), nd.node_name.clone());
                true
            }
        };
        let namespace = current.namespace();
        let name = current.name_any();
        let patch = Patch::Merge(&patch);
        let write = self.claim_writes.writing(claim_ref(&current), &current);
        match patch_or_update(&api, namespace.as_deref(), &name, &patch, edit).await {
            Ok(None) => Ok(Synced::Done),
            Ok(Some(updated)) => {
                backoff.forget(&uid);
                write.answered(Some(&updated));
                tracing::info!(claim = %claim.name_any(), node = %nd.node_name, "became owner of the claim");
                Ok(Synced::Done)
            }
            // Lost the race (or another change came first): the newer claim in the cache is
            // offered again and tried with the next, longer delay unless someone owns it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Synced::Waiting),
            Err(source) => Err(SyncError::Api {
                what: format!("selecting node {:?} for the claim", nd.node_name),
                source,
            }),
        }
    }

    /// Upstream's `checkCapacity`: GetCapacity for this node's topology with the parameters
    /// and capabilities CreateVolume would get; a driver without GET_CAPACITY always has room.
    async fn enough_capacity(
        &self,
        nd: &NodeDeployment,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<bool, SyncError> {
        let requested = claims::requested_size(claim)?;
        if requested == 0
            || !self
                .settings
                .driver
                .has_controller(ControllerCapability::GetCapacity)
        {
            return Ok(true);
        }
        let spec = claim.spec.clone().unwrap_or_default();
        let shape = crate::capacity::VolumeShape {
            access_modes: spec.access_modes.as_deref().unwrap_or_default(),
            volume_mode: spec.volume_mode.as_deref(),
            single_node_multi_writer: self
                .settings
                .driver
                .has_controller(ControllerCapability::SingleNodeMultiWriter),
        };
        let request = crate::capacity::get_capacity_request(
            class,
            &self.settings.default_fstype,
            &shape,
            &nd.segments,
        )?;
        let response = self
            .csi
            .get_capacity(request, self.settings.timeout)
            .await
            .map_err(crate::capacity::CapacityError::GetCapacity)?;
        Ok(requested <= response.available_capacity)
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

    fn keys_of(&self, csi_node: &CSINode) -> Option<Vec<String>> {
        csi_node
            .spec
            .drivers
            .iter()
            .find(|d| d.name == self.settings.driver.name)
            .map(|d| d.topology_keys.clone().unwrap_or_default())
    }

    fn gather_topology(&self, selected_node: Option<&str>) -> PinnedTopology {
        let (csi_nodes, nodes) = match &self.caches.topology {
            NodeTopology::Watched { csi_nodes, nodes } => (csi_nodes, nodes),
            NodeTopology::Own(node) => {
                return PinnedTopology {
                    selected: selected_node.map(|_| node.clone()),
                    immediate_keys: node.keys.clone().unwrap_or_default(),
                    node_labels: vec![node.labels.clone()],
                };
            }
        };
        // A CSINode without this driver has no keys (upstream: "no topology key found", a
        // retry); only a missing CSINode sends the claim back to the scheduler.
        let selected = selected_node.map(|name| SelectedNode {
            name: name.to_string(),
            keys: csi_nodes
                .get(&ObjectRef::new(name))
                .map(|c| self.keys_of(&c).unwrap_or_default()),
            labels: nodes
                .get(&ObjectRef::new(name))
                .map(|n| n.labels().clone())
                .unwrap_or_default(),
        });
        // Upstream takes a random CSINode; any one with keys for this driver will do.
        let immediate_keys = csi_nodes
            .state()
            .iter()
            .filter_map(|c| self.keys_of(c))
            .find(|keys| !keys.is_empty())
            .unwrap_or_default();
        let node_labels = nodes.state().iter().map(|n| n.labels().clone()).collect();
        PinnedTopology {
            selected,
            immediate_keys,
            node_labels,
        }
    }

    async fn sync_volume(&self, name: &str) -> Result<Synced, SyncError> {
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
                let mut finalizers = volume.finalizers().to_vec();
                finalizers.push(PV_FINALIZER.to_string());
                set_finalizers(&api, &volume, finalizers).await?;
                Ok(())
            }
            VolumePlan::RemoveFinalizer => {
                remove_finalizer_from(&api, &volume, PV_FINALIZER).await?;
                Ok(())
            }
            // Upstream's words for a PV of ours without a CSI source.
            VolumePlan::NotCsi => {
                self.delete_failed(&volume, "invalid CSI PV".to_string())
                    .await
            }
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
                    remove_finalizer_from(&api, &current, PV_FINALIZER).await?;
                }
                self.volume_writes.deleted(name.to_string());
                self.settings.metrics.deleted(&class, started.elapsed());
                tracing::info!(volume = %name, "volume deleted");
                Ok(())
            }
        }
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
        match secrets::fetch_secret_data(self.client.clone(), &reference).await {
            Ok(data) => Ok(data.into_inner()),
            Err(error) => {
                tracing::warn!(volume = %volume.name_any(), %error, "deleting without secrets");
                Ok(HashMap::new())
            }
        }
    }
}

impl ClaimLookups for Provisioner {
    fn infeasible(&self, uid: &str, class_uid: &str) -> Option<Duration> {
        self.infeasible
            .remaining(uid, &class_uid.to_string(), Instant::now())
    }
}

impl provision::Lookups for Provisioner {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let cached = self
            .caches
            .claims
            .get(&ObjectRef::new(name).within(namespace))?;
        Some(Arc::new(cached.to_claim()))
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        let cached = self.caches.volumes.get(&ObjectRef::new(name))?;
        Some(Arc::new(cached.to_volume()))
    }

    fn reference_grants(&self) -> Option<Vec<Arc<ReferenceGrant>>> {
        self.caches.reference_grants.as_ref().map(Store::state)
    }

    fn attributes_class(&self, name: &str) -> Result<Option<Arc<VolumeAttributesClass>>, VacError> {
        let Some(classes) = &self.caches.attribute_classes else {
            return Err(VacError::NotServed(name.to_string()));
        };
        if classes.wait_until_ready().now_or_never().is_none() {
            return Err(VacError::NotSynced(name.to_string()));
        }
        Ok(classes.get(&ObjectRef::new(name)))
    }

    fn node_topology(&self, uid: &str, selected_node: Option<&str>) -> PinnedTopology {
        let mut pinned = lock(&self.pinned);
        if let Some(topology) = pinned.get(uid) {
            return topology.clone();
        }
        let fresh = self.gather_topology(selected_node);
        pinned.insert(uid.to_string(), fresh.clone());
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deleted clone source brings a second key, run by the cloning-protection pool.
    #[test]
    fn clone_sources_run_in_their_own_lane() {
        let claim = |deleting: bool, finalizers: &[&str]| -> CachedClaim {
            serde_json::from_value(json!({"metadata": {
                "name": "src", "namespace": "apps", "finalizers": finalizers,
                "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
            }}))
            .unwrap()
        };
        let table = [
            (claim(false, &[CLONING_PROTECTION]), vec![0]),
            (claim(true, &[]), vec![0]),
            (claim(true, &["other"]), vec![0]),
            (claim(true, &[CLONING_PROTECTION]), vec![0, 1]),
        ];
        for (claim, lanes) in table {
            let keys: Vec<usize> = claim_keys(&claim).map(|k| k.lane()).collect();
            assert_eq!(keys, lanes, "{:?}", claim.metadata);
        }
    }
}
