//! The capacity controller: the provisioner's caches of CSINodes, Nodes, classes and PVs (one
//! store per kind for both, as upstream's shared informers) and its own of our
//! CSIStorageCapacity objects; on every change it recomputes the wanted items and hands the
//! ones that are new, missing, touched by a PV that came or went, asked for by the provisioner
//! (a failed CreateVolume) or due for the poll (`--capacity-poll-interval`, the loop's resync)
//! to the shared keyed workers, with the deletions of obsolete objects (bounded by
//! `--capacity-threads`, per-key backoff).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_kinds::cached::CachedVolume;
use csi_sidecar::informers::Informers;
use csi_sidecar::lock;
use csi_sidecar::workers::{KeyedWorkers, Synced};
use csi_sidecar::workqueue_metrics::QueueMetrics;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    Capacity, CapacityError, DRIVER_NAME_LABEL, Item, MANAGED_BY_LABEL, affected_items,
    capacity_request, items, new_object, reconcile, segments, updated_object,
};

/// How capacity tracking is set up (from `--enable-capacity` and its flags).
#[derive(Clone)]
pub struct CapacitySettings {
    /// The client for capacity objects (its own rate limit: `--kube-api-capacity-*`).
    pub client: Client,
    /// Where the objects live (the provisioner's `NAMESPACE`).
    pub namespace: String,
    pub owner: Option<OwnerReference>,
    pub poll_interval: Duration,
    pub workers: usize,
    pub immediate_binding: bool,
    /// `--default-fstype`, for the capability GetCapacity is asked about.
    pub default_fstype: String,
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub metrics: CapacityMetrics,
    pub refresh: Refresh,
    /// The objects' managed-by label: [`super::MANAGED_BY`], or with `--node-deployment`
    /// [`super::node_managed_by`].
    pub managed_by: String,
    /// client-go's `workqueue_*` for upstream's queue "csistoragecapacity" (none: not
    /// counted).
    pub workqueue: Option<QueueMetrics>,
}

/// What the provisioner tells capacity tracking: a class whose items to refresh (after a
/// failed CreateVolume the published capacity was likely wrong; upstream refreshes the class
/// the same way), the driver's PVs its watch brought, and (on [`Refresh::wake`]) that a cache
/// the two share changed.
#[derive(Clone, Debug, Default)]
pub struct Refresh {
    classes: Arc<std::sync::Mutex<BTreeSet<String>>>,
    volumes: ChangedVolumes,
    wake: Arc<tokio::sync::Notify>,
}

impl Refresh {
    pub fn class(&self, name: &str) {
        lock(&self.classes).insert(name.to_string());
        self.wake.notify_one();
    }

    /// A PV of the driver as the watch brought it (listed, added, modified or deleted); the
    /// cache's own wake-up follows.
    pub fn volume(&self, pv: &CachedVolume) {
        lock(&self.volumes).insert(pv.name_any(), Arc::new(pv.to_volume()));
    }

    /// Capacity tracking's wake-up signal, for the caches it shares.
    pub fn wake(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }

    fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut *lock(&self.classes))
    }
}

impl std::fmt::Debug for CapacitySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacitySettings")
            .field("namespace", &self.namespace)
            .field("owner", &self.owner)
            .field("poll_interval", &self.poll_interval)
            .field("workers", &self.workers)
            .field("immediate_binding", &self.immediate_binding)
            .finish_non_exhaustive()
    }
}

/// `csistoragecapacities_desired_goal`, `_desired_current` and `_obsolete`.
#[derive(Clone, Debug, Default)]
pub struct CapacityMetrics {
    goal: Gauge,
    current: Gauge,
    obsolete: Gauge,
}

impl CapacityMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        csi_grpc::metrics::register_as_upstream(
            registry,
            "csistoragecapacities_desired_goal",
            "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
            metrics.goal.clone(),
        );
        csi_grpc::metrics::register_as_upstream(
            registry,
            "csistoragecapacities_desired_current",
            "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
            metrics.current.clone(),
        );
        csi_grpc::metrics::register_as_upstream(
            registry,
            "csistoragecapacities_obsolete",
            "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.",
            metrics.obsolete.clone(),
        );
        metrics
    }
}

/// Where the segments come from.
#[derive(Debug)]
pub enum Segments {
    /// Every node's CSINode and Node.
    Watched(Store<CSINode>, Store<Node>),
    /// `--node-deployment`: the node's segment (NodeGetInfo) is the only one; Nodes and
    /// CSINodes are not watched, as upstream's fixed node topology.
    Fixed(super::Segment),
}

/// The provisioner's caches capacity tracking reads; their changes wake [`Refresh::wake`].
#[derive(Debug)]
pub struct SharedCaches {
    pub classes: Store<StorageClass>,
    pub volumes: Store<CachedVolume>,
    pub segments: Segments,
}

struct Caches {
    segments: Segments,
    classes: Store<StorageClass>,
    volumes: Store<CachedVolume>,
    objects: Store<CSIStorageCapacity>,
}

/// What the loop remembers between passes.
#[derive(Default)]
struct State {
    wanted: BTreeSet<Item>,
    /// Items to refresh (the workers back off those that failed).
    due: BTreeSet<Item>,
    /// Objects created but not yet seen in the cache (so they are not created twice).
    created: HashMap<Item, String>,
    /// The names of the driver's PVs as of the last pass, to see which came and went.
    volumes: HashSet<String>,
}

/// The keyed work of capacity tracking.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Work {
    /// GetCapacity for an item, and its object created or updated.
    Refresh(Item),
    /// An obsolete object (of no wanted item, or a duplicate) deleted.
    Delete(String),
}

/// Runs capacity tracking for `driver` on the provisioner's `shared` caches until `shutdown`.
pub async fn run(
    settings: CapacitySettings,
    csi: CsiConnection,
    driver: String,
    shared: SharedCaches,
    shutdown: CancellationToken,
) {
    let client = settings.client.clone();
    // The provisioner's refresh requests and every change of these caches (the shared ones'
    // too) wake the loop.
    let mut informers = Informers::new(&client, &shutdown).waking(settings.refresh.wake());
    let selector = format!(
        "{DRIVER_NAME_LABEL}={driver},{MANAGED_BY_LABEL}={}",
        settings.managed_by
    );
    let caches = Caches {
        segments: shared.segments,
        classes: shared.classes,
        volumes: shared.volumes,
        objects: informers.watch(
            Api::namespaced(client.clone(), &settings.namespace),
            watcher::Config::default().labels(&selector),
        ),
    };
    let Some(wake) = informers.synced().await else {
        return;
    };
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    if let Some(queue) = &settings.workqueue {
        workers.report_to(vec![queue.clone()], |_| 0);
    }
    let tracker = Arc::new(Tracker {
        api: Api::namespaced(client, &settings.namespace),
        workers,
        settings,
        csi,
        driver,
        caches,
        state: Mutex::new(State::default()),
    });
    tracing::info!(namespace = %tracker.settings.namespace, "capacity tracking started");
    // The refreshes belong to this loop: they stop with it.
    tracker
        .workers
        .run(
            JoinSet::new(),
            &wake,
            tracker.settings.poll_interval,
            &shutdown,
            |tasks, poll| tracker.pass(tasks, poll),
        )
        .await;
}

/// PV name → the PV as the watch last brought it (deleted ones too), for the driver's PVs
/// changed since the last pass.
type ChangedVolumes = Arc<Mutex<HashMap<String, Arc<PersistentVolume>>>>;

struct Tracker {
    settings: CapacitySettings,
    csi: CsiConnection,
    driver: String,
    caches: Caches,
    api: Api<CSIStorageCapacity>,
    workers: Arc<KeyedWorkers<Work>>,
    state: Mutex<State>,
}

impl Tracker {
    /// One pass: marks what is due (everything on the `poll`) and hands it to the workers,
    /// with the deletions of obsolete objects.
    fn pass(self: &Arc<Self>, tasks: &mut JoinSet<()>, poll: bool) {
        let segments = match &self.caches.segments {
            Segments::Fixed(segment) => BTreeSet::from([segment.clone()]),
            Segments::Watched(csi_nodes, nodes) => {
                let nodes = nodes.state();
                let nodes_by_name = nodes.iter().map(|n| (n.name_any(), &**n)).collect();
                let csi_nodes = csi_nodes.state();
                segments(csi_nodes.iter().map(|c| &**c), &nodes_by_name, &self.driver)
            }
        };
        let classes = self.caches.classes.state();
        let wanted = items(
            &segments,
            classes.iter().map(|c| &**c),
            &self.driver,
            self.settings.immediate_binding,
        );
        let objects = self.caches.objects.state();
        let found = reconcile(&wanted, &objects.iter().map(|o| &**o).collect::<Vec<_>>());
        let (ready, newly_due) = {
            let mut state = lock(&self.state);
            let state = &mut *state;
            state
                .created
                .retain(|_, name| !objects.iter().any(|o| o.name_any() == *name));
            let mut due: BTreeSet<Item> = self
                .workers
                .due()
                .into_iter()
                .filter_map(|work| match work {
                    Work::Refresh(item) => Some(item),
                    Work::Delete(_) => None,
                })
                .collect();
            // New items, and items whose object is missing (never made, or deleted by someone).
            due.extend(
                wanted
                    .iter()
                    .filter(|item| {
                        !state.wanted.contains(*item)
                            || (!found.existing.contains_key(*item)
                                && !state.created.contains_key(*item))
                    })
                    .cloned(),
            );
            let classes = self.settings.refresh.take();
            due.extend(
                wanted
                    .iter()
                    .filter(|i| classes.contains(&i.class))
                    .cloned(),
            );
            for volume in self.volume_changes(&mut state.volumes) {
                due.extend(affected_items(&wanted, &volume));
            }
            if poll {
                due.extend(wanted.iter().cloned());
            }
            state.due.extend(due.iter().cloned());
            state.due.retain(|item| wanted.contains(item));
            state.created.retain(|item, _| wanted.contains(item));
            self.workers.forget_absent(
                wanted
                    .iter()
                    .cloned()
                    .map(Work::Refresh)
                    .chain(found.obsolete.iter().cloned().map(Work::Delete)),
            );
            state.wanted = wanted;
            (state.due.iter().cloned().collect::<Vec<_>>(), due)
        };
        // An item whose refresh runs is offered again only for a reason that came since (its
        // refresh then runs once more when this one ends).
        for item in ready {
            let key = Work::Refresh(item.clone());
            if self.workers.is_running(&key) && !newly_due.contains(&item) {
                continue;
            }
            let existing = found.existing.get(&item).and_then(|name| {
                self.caches
                    .objects
                    .get(&ObjectRef::new(name).within(&self.settings.namespace))
            });
            let this = self.clone();
            self.workers
                .schedule(0, key, None, tasks, move || async move {
                    // Our object for it is not in the cache yet: creating another would duplicate
                    // it, so the refresh waits for the watch to bring it.
                    if existing.is_none() && lock(&this.state).created.contains_key(&item) {
                        return Ok(Synced::Waiting);
                    }
                    let created = this.refresh(&item, existing.as_deref()).await?;
                    let mut state = lock(&this.state);
                    state.due.remove(&item);
                    if let Some(name) = created {
                        state.created.insert(item, name);
                    }
                    Ok::<_, CapacityError>(Synced::Done)
                });
        }
        // At the object's version: deleted once, however many passes see it before the watch
        // brings the deletion.
        for name in &found.obsolete {
            let key = Work::Delete(name.clone());
            let version = self
                .caches
                .objects
                .get(&ObjectRef::new(name).within(&self.settings.namespace))
                .and_then(|object| object.resource_version());
            if self
                .workers
                .changed([(key.clone(), version.clone())])
                .is_empty()
            {
                continue;
            }
            let (this, name) = (self.clone(), name.clone());
            self.workers
                .schedule(0, key, version, tasks, move || async move {
                    this.delete_obsolete(&name).await
                });
        }
        self.report(&lock(&self.state), &found);
    }

    async fn delete_obsolete(&self, name: &str) -> Result<Synced, CapacityError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(object = %name, "deleted obsolete CSIStorageCapacity"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(CapacityError::Delete {
                    name: name.to_string(),
                    source,
                });
            }
        }
        Ok(Synced::Done)
    }

    /// The driver's PVs that appeared or disappeared since the last pass (`known`: the names
    /// as of then, brought up to date).
    fn volume_changes(&self, known: &mut HashSet<String>) -> Vec<Arc<PersistentVolume>> {
        let changed = std::mem::take(&mut *lock(&self.settings.refresh.volumes));
        changed
            .into_iter()
            .filter_map(|(name, pv)| {
                let present = self.caches.volumes.get(&ObjectRef::new(&name)).is_some();
                let came_or_went = if present {
                    known.insert(name)
                } else {
                    known.remove(&name)
                };
                came_or_went.then_some(pv)
            })
            .collect()
    }

    /// GetCapacity for the item, then create or update its object; returns the name of a
    /// created object.
    async fn refresh(
        &self,
        item: &Item,
        existing: Option<&CSIStorageCapacity>,
    ) -> Result<Option<String>, CapacityError> {
        let class = self
            .caches
            .classes
            .get(&ObjectRef::new(&item.class))
            .ok_or_else(|| CapacityError::ClassGone(item.class.clone()))?;
        let request = capacity_request(item, &class, &self.settings.default_fstype)?;
        let response = self
            .csi
            .get_capacity(request, self.settings.timeout)
            .await
            .map_err(CapacityError::GetCapacity)?;
        let capacity = Capacity {
            available: response.available_capacity,
            maximum_volume_size: response.maximum_volume_size,
        };
        let owner = self.settings.owner.as_ref();
        match existing {
            Some(existing) => {
                let Some(updated) = updated_object(existing, capacity, owner) else {
                    return Ok(None);
                };
                self.api
                    .replace(&existing.name_any(), &PostParams::default(), &updated)
                    .await
                    .map_err(|source| CapacityError::Update {
                        name: existing.name_any(),
                        source,
                    })?;
                Ok(None)
            }
            None => {
                let object = new_object(
                    item,
                    &self.settings.namespace,
                    &self.driver,
                    &self.settings.managed_by,
                    capacity,
                    owner,
                );
                let created = self
                    .api
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(CapacityError::Create)?;
                tracing::info!(object = %created.name_any(), class = %item.class, segment = ?item.segment, "created CSIStorageCapacity");
                Ok(Some(created.name_any()))
            }
        }
    }

    fn report(&self, state: &State, found: &super::Reconciliation) {
        let metrics = &self.settings.metrics;
        metrics.goal.set(gauge(state.wanted.len()));
        metrics.current.set(gauge(found.existing.len()));
        metrics.obsolete.set(gauge(found.obsolete.len()));
    }
}

fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_gauges_are_served_with_component_bases_help() {
        let mut registry = Registry::default();
        let metrics = CapacityMetrics::register(&mut registry);
        metrics.obsolete.set(2);
        let text = csi_grpc::metrics::encode(&registry);
        for line in [
            "# HELP csistoragecapacities_desired_goal [ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.\n",
            "# HELP csistoragecapacities_obsolete [ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.\n",
            "csistoragecapacities_obsolete 2\n",
            "csistoragecapacities_desired_current 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
