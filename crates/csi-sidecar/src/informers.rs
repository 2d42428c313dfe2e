//! Shared caches (kube-runtime reflectors) for controllers: one wake-up signal for all of a
//! controller's caches, and one wait for their initial lists. The sidecars and kube-sim's
//! cluster roles use it alike.
//!
//! A cache whose list or watch fails (a 403 from a missing RBAC verb, say) retries forever;
//! so that this is no silent hang, the failures are logged as warnings naming the resource and
//! what the API said (at most once per [`WARN_INTERVAL`] per cache), and a
//! [`CacheSyncHealth`] makes `/healthz` fail while a cache has no initial list after a grace
//! period.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use csi_kinds::annotations::LAST_APPLIED;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long caches may take for their initial lists before `/healthz` reports them
/// (controller-runtime's default `CacheSyncTimeout`).
pub const SYNC_GRACE_PERIOD: Duration = Duration::from_secs(120);

/// The shortest time between two warnings about one cache's failing list or watch; the ones
/// in between are logged at debug level.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);

/// Which caches still wait for their initial list, for `/healthz`: unhealthy, naming them,
/// once one has waited longer than the grace period. Caches register when they start and
/// drop out when they stop (shutdown, or leadership ended).
#[derive(Debug)]
pub struct CacheSyncHealth {
    grace: Duration,
    caches: Mutex<Vec<Weak<CacheState>>>,
}

#[derive(Debug)]
struct CacheState {
    resource: String,
    started: Instant,
    synced: AtomicBool,
}

impl CacheSyncHealth {
    pub fn new(grace: Duration) -> Arc<Self> {
        Arc::new(Self {
            grace,
            caches: Mutex::new(Vec::new()),
        })
    }

    /// The health check: `Err` names the caches not synced within the grace period.
    pub fn check(&self) -> Result<(), String> {
        let now = Instant::now();
        let mut late: Vec<String> = self
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|cache| !cache.synced.load(Ordering::Acquire))
            .filter(|cache| now.duration_since(cache.started) > self.grace)
            .map(|cache| cache.resource.clone())
            .collect();
        if late.is_empty() {
            return Ok(());
        }
        late.sort();
        late.dedup();
        Err(format!(
            "caches not synced after {}: {} (see the warnings about their list/watch)",
            csi_kinds::go_duration::format_go_duration(self.grace),
            late.join(", ")
        ))
    }

    fn register(&self, resource: String) -> Arc<CacheState> {
        let state = Arc::new(CacheState {
            resource,
            started: Instant::now(),
            synced: AtomicBool::new(false),
        });
        let mut caches = self.lock();
        caches.retain(|cache| cache.strong_count() > 0);
        caches.push(Arc::downgrade(&state));
        state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<CacheState>>> {
        self.caches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How the watch brought an object to a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// In a list: the first, or a relist after the watch could not resume.
    Listed,
    /// Added or modified, in the order of the object's versions.
    Changed,
    Deleted,
}

/// Reflector-backed caches of one controller: every change in any of them wakes the
/// controller, and [`Informers::synced`] waits for all of their initial lists.
pub struct Informers {
    client: Client,
    wake: Arc<Notify>,
    /// A second controller's signal the caches made from now on wake as well.
    also: Option<Arc<Notify>>,
    shutdown: CancellationToken,
    synced: Vec<futures::future::BoxFuture<'static, bool>>,
    health: Option<Arc<CacheSyncHealth>>,
}

impl Informers {
    pub fn new(client: &Client, shutdown: &CancellationToken) -> Self {
        Self {
            client: client.clone(),
            wake: Arc::new(Notify::new()),
            also: None,
            shutdown: shutdown.clone(),
            synced: Vec::new(),
            health: None,
        }
    }

    /// The caches made from now on wake `wake` instead of a signal of their own: for a
    /// controller with another source of work on the same signal (capacity tracking's refresh
    /// requests from the provisioner).
    pub fn waking(mut self, wake: Arc<Notify>) -> Self {
        self.wake = wake;
        self
    }

    /// The caches made from now on also wake `wake`, when given: for a second controller that
    /// reads them (capacity tracking reads the provisioner's classes, PVs and nodes: one store
    /// per kind for both, as upstream's shared informers).
    pub fn also_waking(&mut self, wake: Option<Arc<Notify>>) {
        self.also = wake;
    }

    /// Reports the caches made from now on to `health` (the sidecar's `/healthz`).
    pub fn reporting_to(mut self, health: &Arc<CacheSyncHealth>) -> Self {
        self.health = Some(health.clone());
        self
    }

    /// A cache of every object of a cluster-wide or all-namespaces kind.
    pub fn all<K>(&mut self) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.watch(Api::all(self.client.clone()), watcher::Config::default())
    }

    /// A cache of every object of a kind, calling `on_change` with each object the watch
    /// brings (listed, added, modified or deleted), after the cache holds the change: so a
    /// controller queues the keys that object concerns instead of scanning every cache.
    pub fn all_with<K>(&mut self, on_change: impl Fn(&K) + Send + 'static) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.all_observing(move |_, object: &K| on_change(object))
    }

    /// [`Informers::all_with`], saying with each object how the watch brought it: what
    /// [`crate::superseded::Superseded::observed`] needs to know when a cache shows our writes.
    pub fn all_observing<K>(&mut self, on_event: impl Fn(Observed, &K) + Send + 'static) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.cache(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            |_| {},
            on_event,
        )
    }

    /// A cache of what `api` and `config` select.
    pub fn watch<K>(&mut self, api: Api<K>, config: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.watch_with(api, config, |_| {})
    }

    /// [`Informers::watch`] with [`Informers::all_with`]'s `on_change`.
    pub fn watch_with<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        on_change: impl Fn(&K) + Send + 'static,
    ) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.cache(api, config, |_| {}, move |_, object: &K| on_change(object))
    }

    /// [`Informers::all`], keeping of each object only what `keep` leaves of it: a controller
    /// that reads a Node's labels or a Pod's volumes need not hold their status (on a real
    /// cluster, a Node's image list alone is kilobytes). The cached objects are then partial:
    /// never write one back whole.
    pub fn all_lean<K>(&mut self, keep: fn(&mut K)) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.cache(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            keep,
            |_, _: &K| {},
        )
    }

    fn cache<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        keep: fn(&mut K),
        on_event: impl Fn(Observed, &K) + Send + 'static,
    ) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        let (reader, writer) = reflector::store();
        let watch = watcher(api, config)
            .default_backoff()
            .modify(move |object: &mut K| {
                drop_unread_metadata(object);
                keep(object);
            });
        let stream = reflector::reflector(writer, watch);
        let (wake, also) = (self.wake.clone(), self.also.clone());
        let shutdown = self.shutdown.clone();
        let resource = resource_name::<K>();
        // Held by the task: the cache drops out of the health check when it stops.
        let state = self
            .health
            .as_ref()
            .map(|health| health.register(resource.clone()));
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut warnings = WarnLimiter::default();
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    event = stream.next() => match event {
                        Some(Ok(event)) => {
                            match &event {
                                watcher::Event::Apply(object) => {
                                    on_event(Observed::Changed, object);
                                }
                                watcher::Event::InitApply(object) => {
                                    on_event(Observed::Listed, object);
                                }
                                watcher::Event::Delete(object) => {
                                    on_event(Observed::Deleted, object);
                                }
                                watcher::Event::InitDone => {
                                    if let Some(state) = &state {
                                        state.synced.store(true, Ordering::Release);
                                    }
                                }
                                watcher::Event::Init => {}
                            }
                            wake.notify_one();
                            if let Some(also) = &also {
                                also.notify_one();
                            }
                        }
                        Some(Err(error)) => {
                            let message = api_message(&error);
                            if warnings.allow(Instant::now()) {
                                tracing::warn!(%resource, error = %message, "failed to list or watch; retrying");
                            } else {
                                tracing::debug!(%resource, error = %message, "failed to list or watch; retrying");
                            }
                        }
                        None => return,
                    },
                }
            }
        });
        let ready = reader.clone();
        self.synced.push(Box::pin(
            async move { ready.wait_until_ready().await.is_ok() },
        ));
        reader
    }

    /// The wake-up signal of these caches, for a controller that does not wait for
    /// [`Informers::synced`] (one that must act on persisted state while the API is away).
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Waits until every cache has its initial list (or shutdown); returns the role's wake-up
    /// signal, or `None` on shutdown.
    pub async fn synced(self) -> Option<Arc<Notify>> {
        let all = futures::future::join_all(self.synced);
        tokio::select! {
            () = self.shutdown.cancelled() => None,
            results = all => results.into_iter().all(|ok| ok).then_some(self.wake),
        }
    }
}

/// Metadata no controller reads and every cache would otherwise hold: managedFields (on a real
/// API server often the larger part of an object) and kubectl's copy of the applied object.
fn drop_unread_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    // The map stays even when it empties: JSON patches built from a cached object add a whole
    // `/metadata/annotations` only when it has none, which would drop the one left out here.
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

/// What [`Informers::all_lean`] keeps of a Node for a controller that reads only its name and
/// labels (the provisioner's topology).
pub fn keep_node_labels(node: &mut Node) {
    node.spec = None;
    node.status = None;
}

/// What [`Informers::all_lean`] keeps of a Pod for a controller that asks which pods that
/// have not ended use a claim (the resizer): its volumes, node and phase.
pub fn keep_pod_volumes(pod: &mut Pod) {
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        volumes: spec.volumes,
        node_name: spec.node_name,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        ..PodStatus::default()
    });
}

/// Lets one warning through per [`WARN_INTERVAL`]: a cache retrying with backoff would
/// otherwise warn every few seconds for as long as the cause lasts.
#[derive(Debug, Default)]
struct WarnLimiter {
    last: Option<Instant>,
}

impl WarnLimiter {
    fn allow(&mut self, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|at| now.duration_since(at) < WARN_INTERVAL)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// A kind's resource as RBAC rules and kubectl name it: `persistentvolumeclaims`,
/// `volumeattachments.storage.k8s.io`.
fn resource_name<K>() -> String
where
    K: Resource,
    K::DynamicType: Default,
{
    let kind = K::DynamicType::default();
    let (plural, group) = (K::plural(&kind), K::group(&kind));
    if group.is_empty() {
        plural.into_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// What the API answered (code, reason and message, e.g. a 403's "... cannot list resource
/// ..."), else the error itself.
fn api_message(error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        other => return other.to_string(),
    };
    format!("{} {}: {}", status.code, status.reason, status.message)
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers")
            .field("caches", &self.synced.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_keep_what_controllers_read() {
        let mut claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": "c",
                "annotations": {LAST_APPLIED: "{...}", "volume.kubernetes.io/selected-node": "n"},
                "managedFields": [{"manager": "kubectl"}]}}))
            .unwrap();
        drop_unread_metadata(&mut claim);
        assert_eq!(claim.metadata.managed_fields, None);
        assert_eq!(
            claim
                .metadata
                .annotations
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            ["volume.kubernetes.io/selected-node"]
        );
        let mut applied_only: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": "c", "annotations": {LAST_APPLIED: "{...}"}}}))
            .unwrap();
        drop_unread_metadata(&mut applied_only);
        assert_eq!(
            applied_only.metadata.annotations,
            Some(Default::default()),
            "an emptied map is kept: the object has annotations on the server"
        );

        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"zone": "a"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"images": [{"names": ["busybox"], "sizeBytes": 1}]}}))
        .unwrap();
        keep_node_labels(&mut node);
        assert_eq!(
            serde_json::to_value(&node).unwrap(),
            serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n", "labels": {"zone": "a"}}})
        );

        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n", "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                "containerStatuses": [{"name": "app", "image": "busybox", "imageID": "",
                    "ready": true, "restartCount": 0}]}}))
        .unwrap();
        keep_pod_volumes(&mut pod);
        assert_eq!(
            serde_json::to_value(&pod).unwrap(),
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": "n", "containers": [],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]},
                "status": {"phase": "Running"}})
        );
    }

    #[tokio::test(start_paused = true)]
    async fn caches_not_synced_after_the_grace_period_are_named() {
        let health = CacheSyncHealth::new(Duration::from_secs(60));
        let claims = health.register("persistentvolumeclaims".into());
        let nodes = health.register("csinodes.storage.k8s.io".into());
        assert_eq!(health.check(), Ok(()), "within the grace period");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            health.check(),
            Err("caches not synced after 1m0s: csinodes.storage.k8s.io, persistentvolumeclaims (see the warnings about their list/watch)".into())
        );
        claims.synced.store(true, Ordering::Release);
        let error = health.check().unwrap_err();
        assert!(
            error.contains("csinodes") && !error.contains("persistentvolumeclaims"),
            "{error}"
        );
        drop(nodes);
        assert_eq!(
            health.check(),
            Ok(()),
            "a stopped cache (leadership ended) is not checked"
        );
        let late = health.register("persistentvolumes".into());
        assert_eq!(
            health.check(),
            Ok(()),
            "a new cache gets its own grace period"
        );
        drop(late);
    }

    #[test]
    fn one_warning_per_interval() {
        let start = Instant::now();
        let mut warnings = WarnLimiter::default();
        let at = |seconds| start + Duration::from_secs(seconds);
        let allowed: Vec<u64> = [0, 1, 2, 29, 30, 31, 59, 60, 95]
            .into_iter()
            .filter(|seconds| warnings.allow(at(*seconds)))
            .collect();
        assert_eq!(allowed, [0, 30, 60, 95]);
    }
}
