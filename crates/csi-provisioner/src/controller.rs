//! The provisioner's adapters: caches of claims, volumes, classes, CSINodes, Nodes and
//! VolumeAttachments; a pass over them on every change decides per claim and per PV (pure
//! cores in [`crate::step`], [`crate::claims`], [`crate::deletion`], [`crate::request`],
//! [`crate::topology`]), and bounded workers carry out CSI calls and API writes with
//! per-object backoff. This file wires the caches, workers and shared state; each workflow has
//! a file of its own in `controller/`: `claim` (provisioning, and the provisionings in flight
//! whose claim is gone), `volume` (PV deletion), `sources` (data sources' protection), `node`
//! (node ownership with `--node-deployment`) and `inflight` (the writer of the record of
//! provisionings in flight).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_grpc::conn::{CsiConnection, DriverInfo};
use csi_kinds::cached::{CachedAttachment, CachedClaim, CachedVolume};
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::informers::{CacheSyncHealth, Informers, keep_node_labels};
use csi_sidecar::lock;
use csi_sidecar::slow_set::SlowSet;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::capacity::controller::{Refresh, Segments, SharedCaches};
use crate::claims::CLONING_PROTECTION;
use crate::grants::ReferenceGrant;
use crate::node_deployment::{NodeDeployment, OwnerBackoff};
use crate::provision::{self, Policy};
use crate::request;
use crate::sync_error::SyncError;
use crate::topology::{PinnedTopology, SelectedNode};
use crate::vac::VacError;
use csi_kinds::vac::{Support, VolumeAttributesClass};

mod claim;
mod inflight;
mod node;
mod sources;
mod volume;

use inflight::InflightRecord;
pub use inflight::RecordWriteError;
use node::OwnNode;

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
    /// Claims' VolumeAttributesClasses: the gate after discovery (see [`csi_sidecar::vac::discover`]).
    pub volume_attributes_classes: Support,
    /// The CrossNamespaceVolumeDataSource gate: `dataSourceRef.namespace` honoured when a
    /// ReferenceGrant allows it.
    pub cross_namespace_data_sources: bool,
    /// `--node-deployment`: this instance serves one node only.
    pub node_deployment: Option<NodeDeployment>,
    /// Where the Lease of the in-flight record lives (the leader election namespace).
    pub inflight_namespace: String,
}

struct Caches {
    claims: Store<CachedClaim>,
    volumes: Store<CachedVolume>,
    classes: Store<StorageClass>,
    topology: NodeTopology,
    attachments: Store<CachedAttachment>,
    /// With [`Support::Served`] only.
    attribute_classes: Option<Store<VolumeAttributesClass>>,
    /// With the CrossNamespaceVolumeDataSource gate only.
    reference_grants: Option<Store<ReferenceGrant>>,
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
    /// A provisioning in flight whose claim is gone, by the claim's UID: finished from its
    /// entry in the in-flight record.
    InFlight(String),
}

impl Key {
    /// The worker pool the key runs in: provisioning and deletion share `--worker-threads`;
    /// clone sources have `--cloning-protection-threads`.
    fn lane(&self) -> usize {
        match self {
            Key::Claim(_) | Key::Volume(_) | Key::InFlight(_) => 0,
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
    /// Our writes to claims the cache does not show yet: a sync that read the older claim
    /// would redo them (a second CreateVolume, PV create, finalizer patch and Events).
    claim_writes: Arc<Superseded<ObjectRef<CachedClaim>>>,
    /// PVs we created or deleted that the cache does not show so yet.
    volume_writes: Superseded<String>,
    /// Claim UID → how often the API server refused its PV (see [`request::save_failure`]).
    save_refusals: Mutex<HashMap<String, u32>>,
    /// With `--node-deployment`: the node served.
    node: Option<OwnNode>,
    /// The provisionings in flight ([`crate::inflight`]).
    record: Arc<InflightRecord>,
    /// An error that ends the provisioner (set once; `stop` is then cancelled).
    fatal: std::sync::OnceLock<request::RequestError>,
    stop: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// No claim can be given a volume name (upstream panics on the first claim it provisions).
    #[error(transparent)]
    VolumeName(request::RequestError),
    #[error(transparent)]
    Record(#[from] RecordWriteError),
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
            Key::Claim(_) | Key::CloneSource(_) | Key::InFlight(_) => 0,
            Key::Volume(_) => 1,
        },
    );
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    // Upstream GETs a claim's class when it provisions and its sample RBAC grants no access
    // to classes: the cache of them must neither hold up provisioning nor fail /healthz when
    // it cannot list (its warnings name the cause, and claims naming a class say it is not
    // synced).
    let mut optional = Informers::new(&client, &shutdown);
    let record_name = crate::inflight::lease_name(
        &settings.driver.name,
        settings
            .node_deployment
            .as_ref()
            .map(|nd| nd.node_name.as_str()),
    );
    let record = Arc::new(
        InflightRecord::start(
            client.clone(),
            &settings.inflight_namespace,
            &record_name,
            shutdown.clone(),
        )
        .await?,
    );
    let (claim_work, volume_work) = (workers.clone(), workers.clone());
    let claim_writes = Arc::new(Superseded::default());
    let observed = claim_writes.clone();
    let in_flight = record.clone();
    let claims = informers.all_observing(move |how, claim: &CachedClaim| {
        let version = claim.resource_version();
        observed.observed(&ObjectRef::from_obj(claim), version.as_deref(), how);
        claim_keys(claim).for_each(|key| claim_work.trigger_for(key, claim));
        // A claim gone mid-provisioning leaves its entry to finish.
        if how == csi_sidecar::informers::Observed::Deleted
            && let Some(uid) = claim.uid().filter(|uid| in_flight.entry(uid).is_some())
        {
            claim_work.trigger(Key::InFlight(uid));
        }
    });
    let attachments = informers.all();
    let attribute_classes =
        (settings.volume_attributes_classes == Support::Served).then(|| optional.all());
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
        record,
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
    workers
        .reconcile(
            &provisioner,
            tasks,
            &wake,
            provisioner.settings.resync,
            &provisioner.stop,
        )
        .await;
    let error = provisioner
        .fatal
        .get()
        .cloned()
        .map(ProvisionerError::VolumeName);
    error.map_or(Ok(()), Err)
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

impl Reconciler for Provisioner {
    type Key = Key;
    type Error = SyncError;

    /// Every claim's keys, every PV, and the provisionings in flight whose claim is gone.
    fn keys(&self) -> Vec<Key> {
        let claims = self.caches.claims.state();
        let volumes = self.caches.volumes.state();
        let orphans = self.record.uids().into_iter().filter(|uid| {
            self.record
                .entry(uid)
                .is_some_and(|entry| self.cached_claim_of(&entry).is_none())
        });
        claims
            .iter()
            .flat_map(|c| claim_keys(&**c))
            .chain(volumes.iter().map(|v| Key::Volume(v.name_any())))
            .chain(orphans.map(Key::InFlight))
            .collect()
    }

    /// At the resourceVersion of the key's object as cached; gone with the object (or, for a
    /// clone source, with its release).
    fn offer(&self, key: &Key) -> Offer {
        let version = match key {
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
            // Its entry does not change: once per trigger and retry.
            Key::InFlight(uid) => self
                .record
                .entry(uid)
                .filter(|entry| self.cached_claim_of(entry).is_none())
                .map(|_| None),
        };
        match version {
            Some(version) => Offer::Run {
                version,
                lane: key.lane(),
            },
            None => Offer::Gone,
        }
    }

    /// Each kind's sync in a box of its own size ([`SyncFuture`]).
    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SyncError> {
        match key {
            Key::Claim(reference) => Box::pin(async move { self.sync_claim(&reference).await }),
            Key::Volume(name) => Box::pin(async move { self.sync_volume(&name).await }),
            Key::CloneSource(reference) => {
                Box::pin(async move { self.sync_clone_source(&reference).await })
            }
            Key::InFlight(uid) => Box::pin(async move { self.sync_in_flight(&uid).await }),
        }
    }

    fn pass_started(&self, full: bool) {
        self.forget_seen_writes();
        if full {
            self.forget_gone_claims();
        }
    }
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
    /// The cached claim an in-flight entry was made for (same name and UID), if any.
    fn cached_claim_of(&self, entry: &crate::inflight::Entry) -> Option<Arc<CachedClaim>> {
        let reference = ObjectRef::new(&entry.claim.name_any())
            .within(&entry.claim.namespace().unwrap_or_default());
        self.caches
            .claims
            .get(&reference)
            .filter(|cached| cached.uid() == entry.claim.uid())
    }

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

    async fn failed<T>(
        &self,
        claim: &PersistentVolumeClaim,
        message: String,
    ) -> Result<T, SyncError> {
        self.warn(&claim.object_ref(&()), "ProvisioningFailed", message)
            .await
    }

    /// A Normal Event on the claim.
    async fn note(&self, claim: &PersistentVolumeClaim, reason: &str, message: &str) {
        self.events
            .publish(&claim.object_ref(&()), EventType::Normal, reason, message)
            .await;
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
    use serde_json::json;

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
