//! The capacity controller: caches of CSINodes, Nodes, classes, PVs and our
//! CSIStorageCapacity objects; on every change it recomputes the wanted items and refreshes the
//! ones that are new, missing, touched by a PV that came or went, or due for the poll.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_sidecar::backoff::Backoff;
use csi_sidecar::conn::CsiConnection;
use csi_sidecar::informers::Informers;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::{
    Capacity, DRIVER_NAME_LABEL, Item, MANAGED_BY_LABEL, affected_items, capacity_request, items,
    new_object, reconcile, segments, updated_object,
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
    /// With `--node-deployment`: the node's segment (NodeGetInfo) is the only one; Nodes and
    /// CSINodes are not watched, as upstream's fixed node topology.
    pub node_segment: Option<super::Segment>,
}

/// Asks capacity tracking to refresh the items of a class: after a failed CreateVolume the
/// published capacity was likely wrong (upstream refreshes the class the same way).
#[derive(Clone, Debug, Default)]
pub struct Refresh {
    classes: Arc<std::sync::Mutex<BTreeSet<String>>>,
    wake: Arc<tokio::sync::Notify>,
}

impl Refresh {
    pub fn class(&self, name: &str) {
        self.lock().insert(name.to_string());
        self.wake.notify_one();
    }

    fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.classes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        registry.register(
            "csistoragecapacities_desired_goal",
            "Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
            metrics.goal.clone(),
        );
        registry.register(
            "csistoragecapacities_desired_current",
            "Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
            metrics.current.clone(),
        );
        registry.register(
            "csistoragecapacities_obsolete",
            "Number of CSIStorageCapacity objects that exist and will be deleted automatically.",
            metrics.obsolete.clone(),
        );
        metrics
    }
}

/// Where the segments come from.
enum Segments {
    /// Every node's CSINode and Node.
    Watched(Store<CSINode>, Store<Node>),
    /// `--node-deployment`: the node's own.
    Fixed(super::Segment),
}

struct Caches {
    segments: Segments,
    classes: Store<StorageClass>,
    volumes: Store<PersistentVolume>,
    objects: Store<CSIStorageCapacity>,
}

/// What the loop remembers between passes.
#[derive(Default)]
struct State {
    wanted: BTreeSet<Item>,
    /// Items to refresh, and not before when (after a failure).
    due: BTreeMap<Item, Instant>,
    /// Objects created but not yet seen in the cache (so they are not created twice).
    created: HashMap<Item, String>,
    /// The driver's PVs at the last pass, to see which came and went.
    volumes: HashMap<String, Arc<PersistentVolume>>,
    next_poll: Option<Instant>,
}

/// Runs capacity tracking for `driver` until `shutdown`.
pub async fn run(
    settings: CapacitySettings,
    csi: CsiConnection,
    driver: String,
    shutdown: CancellationToken,
) {
    let client = settings.client.clone();
    let mut informers = Informers::new(&client, &shutdown);
    let selector = format!(
        "{DRIVER_NAME_LABEL}={driver},{MANAGED_BY_LABEL}={}",
        settings.managed_by
    );
    let caches = Caches {
        segments: match settings.node_segment.clone() {
            Some(segment) => Segments::Fixed(segment),
            None => Segments::Watched(informers.all(), informers.all()),
        },
        classes: informers.all(),
        volumes: informers.all(),
        objects: informers.watch(
            Api::namespaced(client.clone(), &settings.namespace),
            watcher::Config::default().labels(&selector),
        ),
    };
    let Some(wake) = informers.synced().await else {
        return;
    };
    let tracker = Tracker {
        api: Api::namespaced(client, &settings.namespace),
        backoff: Backoff::new(settings.retry_start, settings.retry_max),
        settings,
        csi,
        driver,
        caches,
    };
    let mut state = State::default();
    tracing::info!(namespace = %tracker.settings.namespace, "capacity tracking started");
    let refresh = tracker.settings.refresh.wake.clone();
    loop {
        let next = tracker.pass(&mut state).await;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = wake.notified() => {}
            () = refresh.notified() => {}
            () = tokio::time::sleep(next) => {}
        }
    }
}

struct Tracker {
    settings: CapacitySettings,
    csi: CsiConnection,
    driver: String,
    caches: Caches,
    api: Api<CSIStorageCapacity>,
    backoff: Backoff<Item>,
}

impl Tracker {
    /// One pass: marks what is due, refreshes it, deletes obsolete objects; returns how long
    /// until the next poll or retry.
    async fn pass(&self, state: &mut State) -> Duration {
        let now = Instant::now();
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
        state
            .created
            .retain(|_, name| !objects.iter().any(|o| o.name_any() == *name));

        let mut due: BTreeSet<Item> = BTreeSet::new();
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
        for volume in self.volume_changes(state) {
            due.extend(affected_items(&wanted, &volume));
        }
        if state.next_poll.is_none_or(|at| at <= now) {
            due.extend(wanted.iter().cloned());
            state.next_poll = Some(now + self.settings.poll_interval);
        }
        for item in due {
            state.due.entry(item).or_insert(now);
        }
        state.due.retain(|item, _| wanted.contains(item));
        state.created.retain(|item, _| wanted.contains(item));
        state.wanted = wanted;

        let ready: Vec<Item> = state
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(item, _)| item.clone())
            .collect();
        let results: Vec<(Item, Result<Option<String>, String>)> = futures::stream::iter(ready)
            .map(|item| async {
                let existing = found.existing.get(&item).and_then(|name| {
                    self.caches
                        .objects
                        .get(&ObjectRef::new(name).within(&self.settings.namespace))
                });
                let result = self.refresh(&item, existing.as_deref()).await;
                (item, result)
            })
            .buffer_unordered(self.settings.workers.max(1))
            .collect()
            .await;
        for (item, result) in results {
            match result {
                Ok(created) => {
                    self.backoff.reset(&item);
                    state.due.remove(&item);
                    if let Some(name) = created {
                        state.created.insert(item, name);
                    }
                }
                Err(error) => {
                    let delay = self.backoff.next_delay(&item);
                    tracing::warn!(class = %item.class, segment = ?item.segment, %error, retry_in = ?delay, "capacity update failed");
                    state.due.insert(item, Instant::now() + delay);
                }
            }
        }
        for name in &found.obsolete {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(object = %name, "deleted obsolete CSIStorageCapacity"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(object = %name, %error, "deleting an obsolete CSIStorageCapacity")
                }
            }
        }
        self.report(state, &found);
        let poll = state.next_poll.map_or(self.settings.poll_interval, |at| {
            at.saturating_duration_since(Instant::now())
        });
        let retry = state
            .due
            .values()
            .map(|at| at.saturating_duration_since(Instant::now()))
            .min();
        retry.map_or(poll, |retry| retry.min(poll))
    }

    /// The driver's PVs that appeared or disappeared since the last pass.
    fn volume_changes(&self, state: &mut State) -> Vec<Arc<PersistentVolume>> {
        let current: HashMap<String, Arc<PersistentVolume>> = self
            .caches
            .volumes
            .state()
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == self.driver)
            })
            .map(|pv| (pv.name_any(), pv))
            .collect();
        let previous = std::mem::replace(&mut state.volumes, current);
        let mut changed: Vec<_> = state
            .volumes
            .iter()
            .filter(|(name, _)| !previous.contains_key(*name))
            .map(|(_, pv)| pv.clone())
            .collect();
        changed.extend(
            previous
                .into_iter()
                .filter(|(name, _)| !state.volumes.contains_key(name))
                .map(|(_, pv)| pv),
        );
        changed
    }

    /// GetCapacity for the item, then create or update its object; returns the name of a
    /// created object.
    async fn refresh(
        &self,
        item: &Item,
        existing: Option<&CSIStorageCapacity>,
    ) -> Result<Option<String>, String> {
        let class = self
            .caches
            .classes
            .get(&ObjectRef::new(&item.class))
            .ok_or_else(|| format!("storage class {} is gone", item.class))?;
        let request = capacity_request(item, &class, &self.settings.default_fstype)?;
        let response = self
            .csi
            .get_capacity(request, self.settings.timeout)
            .await
            .map_err(|s| {
                format!(
                    "GetCapacity: rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                )
            })?;
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
                    .map_err(|e| {
                        format!("updating CSIStorageCapacity {}: {e}", existing.name_any())
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
                    .map_err(|e| format!("creating a CSIStorageCapacity: {e}"))?;
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
