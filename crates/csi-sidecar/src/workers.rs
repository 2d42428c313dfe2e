//! The reconciler runtime every controller of the suite runs on: keyed, level-triggered
//! workers. A controller's watches [`KeyedWorkers::trigger`] the keys an object change concerns
//! (a claim's change queues that claim, not a scan of every cache); each pass offers those
//! keys, the keys waiting for other objects and the keys whose retry is due, each with its
//! object's resourceVersion. A key runs when it changed since it was last synced with nothing
//! left to do, is not already running, and is not backing off after a failure. At most
//! `workers` syncs run at once per lane; one key never runs twice at once, in any lane, and a
//! change that comes while its key runs is offered again when the run ends. Failures are the
//! controller's own typed errors; this loop logs them and backs the key off (per key, from
//! `--retry-interval-start` to `--retry-interval-max`, reset on success), and forgets a key's
//! state when its object goes. This is what client-go's rate-limited workqueue gives the Go
//! sidecars, without a queue to overflow; lanes are separate queues that share the per-key
//! guarantees (so a storm of one kind of work cannot starve another, external-attacher #761).
//!
//! Why not `kube::runtime::Controller`: evaluated, and three requirements it cannot meet.
//! - Per-key exponential backoff reset on success: its `error_policy` is not told of successes
//!   (kube-rs #297, #1916 — both open), and a spurious trigger during the backoff runs the key
//!   early (kubernetes #132805); here neither the key's own new version (often our own error
//!   written into its status) nor other events cut a backoff short, with one exception: an
//!   object's deletion, and each finalizer another controller removes from the deleting object
//!   ([`KeyedWorkers::trigger_for`]), so a user's delete of a failing object is acted on at
//!   once, as client-go's `Add` would, not after up to `--retry-interval-max`.
//! - Lanes with their own worker pools (`--worker-threads` and
//!   `--cloning-protection-threads`; attach, detach and PV release): it has one concurrency
//!   limit for all of a controller's work, the starvation external-attacher #761 fixed.
//! - Skipping a version already synced, and waiting for the cache to show our own write (so a
//!   stale cache never repeats a CreateVolume or a ControllerUnpublish, external-attacher
//!   #587): it runs every trigger, and its reconcile cannot tell "done at this version" from
//!   "waiting for another object".

use std::collections::{HashMap, HashSet};
use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::lock;
use crate::workqueue_metrics::{QueueMetrics, Queued};

/// How a sync ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// Nothing left to do for this version of the object.
    Done,
    /// Waiting for other objects (or for the caches to show our own write): offered again on
    /// the next pass even if this object stays the same.
    Waiting,
    /// To be run again after this long even if nothing changes (a controller's own slow
    /// retry, client-go's `AddAfter`); a change of the object before then runs it at once.
    After(Duration),
}

/// One sync, boxed by its controller. A controller with several kinds of keys returns each
/// kind's sync in a box of its own size: one future type for all kinds is as large as the
/// largest, and every running sync would take that much (a claim sync took a PV deletion's
/// 19.8 KB in the provisioner, `-Zprint-type-sizes`).
pub type SyncFuture<E> = Pin<Box<dyn Future<Output = Result<Synced, E>> + Send>>;

#[derive(Debug)]
pub struct KeyedWorkers<K> {
    backoff: Backoff<K>,
    /// Not before this instant (after a failure).
    not_before: Mutex<HashMap<K, Instant>>,
    in_flight: Mutex<HashSet<K>>,
    /// The resourceVersion each key was last synced at with [`Synced::Done`].
    synced: Mutex<HashMap<K, String>>,
    /// Keys the watches brought since the last pass.
    triggered: Mutex<HashSet<K>>,
    /// Keys whose last sync ended [`Synced::Waiting`]: offered on every pass.
    waiting: Mutex<HashSet<K>>,
    /// Keys whose last sync ended [`Synced::After`]: offered from this instant on.
    requeue: Mutex<HashMap<K, Instant>>,
    /// Keys offered while their sync ran: triggered again when it ends.
    rerun: Mutex<HashSet<K>>,
    /// Keys whose object was seen being deleted, with how many finalizers it then had (a
    /// deleting object can only lose finalizers).
    deletion_seen: Mutex<HashMap<K, usize>>,
    /// Keys whose backoff was ended ([`KeyedWorkers::trigger_for`]) while their sync ran: a
    /// failure of that run sets no deadline (the change that ended it runs at once after).
    backoff_ended_while_running: Mutex<HashSet<K>>,
    /// One pool of permits per lane.
    lanes: Vec<Semaphore>,
    /// Woken when a key is triggered or a sync failed, so the next pass (or the retry) is
    /// scheduled without waiting for another change.
    wake: Notify,
    /// The `workqueue_*` queues, and which one a key is counted in (an index), once
    /// [`KeyedWorkers::report_to`].
    queues: OnceLock<NamedQueues<K>>,
}

/// The queues and the index of a key's queue.
type NamedQueues<K> = (Vec<QueueMetrics>, fn(&K) -> usize);

impl<K> KeyedWorkers<K>
where
    K: Clone + Eq + Hash + Debug + Send + Sync + 'static,
{
    pub fn new(workers: usize, retry_start: Duration, retry_max: Duration) -> Arc<Self> {
        Self::with_lanes(1, workers, retry_start, retry_max)
    }

    /// `lanes` pools of `workers` each.
    pub fn with_lanes(
        lanes: usize,
        workers: usize,
        retry_start: Duration,
        retry_max: Duration,
    ) -> Arc<Self> {
        Self::with_lane_sizes(&vec![workers; lanes.max(1)], retry_start, retry_max)
    }

    /// One lane per entry of `sizes`, with that many workers (at least one), so that kinds of
    /// work with their own worker flag (e.g. `--cloning-protection-threads`) get their own pool.
    pub fn with_lane_sizes(
        sizes: &[usize],
        retry_start: Duration,
        retry_max: Duration,
    ) -> Arc<Self> {
        let sizes = if sizes.is_empty() { &[1][..] } else { sizes };
        Arc::new(Self {
            backoff: Backoff::new(retry_start, retry_max),
            not_before: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashSet::new()),
            synced: Mutex::new(HashMap::new()),
            triggered: Mutex::new(HashSet::new()),
            waiting: Mutex::new(HashSet::new()),
            requeue: Mutex::new(HashMap::new()),
            rerun: Mutex::new(HashSet::new()),
            deletion_seen: Mutex::new(HashMap::new()),
            backoff_ended_while_running: Mutex::new(HashSet::new()),
            lanes: sizes
                .iter()
                .map(|workers| Semaphore::new((*workers).max(1)))
                .collect(),
            wake: Notify::new(),
            queues: OnceLock::new(),
        })
    }

    /// Counts the keys in client-go's `workqueue_*` families, each in the queue of `queues`
    /// whose index `queue_of` gives (named as upstream's queues are). Once; later calls
    /// change nothing.
    pub fn report_to(&self, queues: Vec<QueueMetrics>, queue_of: fn(&K) -> usize) {
        let _ = self.queues.set((queues, queue_of));
    }

    /// Queues `key` for the next pass (its object changed) and wakes the loop.
    pub fn trigger(&self, key: K) {
        lock(&self.triggered).insert(key);
        self.wake.notify_one();
    }

    /// [`KeyedWorkers::trigger`] for a change of `object`, the object of `key`: the change
    /// that shows it being deleted, and each later one that leaves it fewer finalizers, also
    /// ends the key's backoff (client-go's `Add` runs a key at once: a `kubectl delete` of an
    /// object whose sync keeps failing takes effect now, not after up to
    /// `--retry-interval-max`; and a write of ours refused because another finalizer went
    /// meanwhile is redone once the cache shows it gone). A deleting object takes no new
    /// finalizers, so this ends a backoff a few times at most. Other changes of it, such as
    /// our own error written into its status, wait for the backoff as any change does.
    pub fn trigger_for(&self, key: K, object: &impl Resource) {
        let meta = object.meta();
        if meta.deletion_timestamp.is_some() {
            let finalizers = meta.finalizers.as_ref().map_or(0, Vec::len);
            let seen = lock(&self.deletion_seen).insert(key.clone(), finalizers);
            if seen != Some(finalizers) {
                self.end_backoff(&key);
            }
        }
        self.trigger(key);
    }

    /// Lets `key` run on the next pass whatever its backoff; a run under way that fails sets
    /// no new deadline.
    fn end_backoff(&self, key: &K) {
        {
            // Marked before the deadline goes, so that a run failing in between finds the mark,
            // and under the running set's lock, so that no run ends between the two.
            let running = lock(&self.in_flight);
            if running.contains(key) {
                lock(&self.backoff_ended_while_running).insert(key.clone());
            }
        }
        lock(&self.not_before).remove(key);
    }

    /// The keys the next pass offers: those triggered since the last pass (taken), those
    /// waiting for other objects, and those whose retry is due.
    pub fn due(&self) -> Vec<K> {
        let mut keys: HashSet<K> = std::mem::take(&mut *lock(&self.triggered));
        keys.extend(lock(&self.waiting).iter().cloned());
        let now = Instant::now();
        for deadlines in [&self.not_before, &self.requeue] {
            keys.extend(
                lock(deadlines)
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(key, _)| key.clone()),
            );
        }
        keys.into_iter().collect()
    }

    /// The offered keys that changed since their last complete sync (a key without a version
    /// always counts as changed).
    pub fn changed(
        &self,
        offered: impl IntoIterator<Item = (K, Option<String>)>,
    ) -> Vec<(K, Option<String>)> {
        let synced = lock(&self.synced);
        offered
            .into_iter()
            .filter(|(key, version)| version.is_none() || synced.get(key) != version.as_ref())
            .collect()
    }

    /// Runs `sync` for `key` on `tasks`, on `lane`'s workers (lanes past the last use the last),
    /// unless the key is backing off, or running (then it is triggered again when that run
    /// ends). A failure backs the key off (exponentially) and wakes [`KeyedWorkers::wakened`].
    /// A scheduled key counts as running ([`KeyedWorkers::is_running`]) and, in its
    /// `workqueue_*` queue, as added and waiting (depth) until a worker takes it.
    pub fn schedule<F, Fut, E>(
        self: &Arc<Self>,
        lane: usize,
        key: K,
        version: Option<String>,
        tasks: &mut JoinSet<()>,
        sync: F,
    ) where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Synced, E>> + Send + 'static,
        E: Display,
    {
        {
            let mut not_before = lock(&self.not_before);
            if not_before.get(&key).is_some_and(|at| *at > Instant::now()) {
                return;
            }
            if !lock(&self.in_flight).insert(key.clone()) {
                lock(&self.rerun).insert(key);
                return;
            }
            // The retry is under way: a deadline left behind would wake the loop for nothing
            // for as long as the sync runs.
            not_before.remove(&key);
        }
        let queue = self
            .queues
            .get()
            .and_then(|(queues, queue_of)| queues.get(queue_of(&key)).cloned());
        let queued = queue.as_ref().map(QueueMetrics::added);
        let this = self.clone();
        tasks.spawn(async move {
            let permits = &this.lanes[lane.min(this.lanes.len() - 1)];
            let Ok(_permit) = permits.acquire().await else {
                return;
            };
            // Ends (and is observed) when the sync does.
            let _work = queued.map(Queued::start);
            let mut wake = false;
            // Boxed once it may run: inline, the sync's whole state (kilobytes: requests,
            // objects) would be part of every task, also of the thousands that wait for a
            // worker after a burst (36 MiB of 62 at 2000 claims, measured with heaptrack).
            match Box::pin(sync()).await {
                Ok(Synced::After(wait)) => {
                    this.backoff.reset(&key);
                    lock(&this.synced).remove(&key);
                    lock(&this.waiting).remove(&key);
                    lock(&this.requeue).insert(key.clone(), Instant::now() + wait);
                    wake = true;
                }
                Ok(synced) => {
                    lock(&this.requeue).remove(&key);
                    this.backoff.reset(&key);
                    match (synced, version) {
                        (Synced::Done, Some(version)) => {
                            lock(&this.synced).insert(key.clone(), version);
                        }
                        _ => {
                            lock(&this.synced).remove(&key);
                        }
                    }
                    if synced == Synced::Waiting {
                        lock(&this.waiting).insert(key.clone());
                    } else {
                        lock(&this.waiting).remove(&key);
                    }
                }
                Err(error) => {
                    if let Some(queue) = &queue {
                        queue.retried();
                    }
                    lock(&this.synced).remove(&key);
                    lock(&this.waiting).remove(&key);
                    lock(&this.requeue).remove(&key);
                    let delay = this.backoff.next_delay(&key);
                    if lock(&this.backoff_ended_while_running).remove(&key) {
                        tracing::warn!(?key, %error, "sync failed; retried now: the object's deletion changed meanwhile");
                    } else {
                        tracing::warn!(?key, %error, retry_in = ?delay, "sync failed");
                        lock(&this.not_before).insert(key.clone(), Instant::now() + delay);
                    }
                    wake = true;
                }
            }
            lock(&this.in_flight).remove(&key);
            lock(&this.backoff_ended_while_running).remove(&key);
            if lock(&this.rerun).remove(&key) {
                this.trigger(key);
            } else if wake {
                // Its retry (or requeue) needs the loop to learn the new deadline.
                this.wake.notify_one();
            }
        });
    }

    /// Whether a sync of `key` is running (or waiting for a worker).
    pub fn is_running(&self, key: &K) -> bool {
        lock(&self.in_flight).contains(key)
    }

    /// The shortest wait until a backing-off (or requeued) key may run again, counting only deadlines after
    /// `pass_started` (the start of the pass that just ran): that pass already ran the keys
    /// whose deadline had come, and a key it did not offer must not wake the loop again and
    /// again. A deadline reached during the pass gives zero: one more pass runs it.
    pub fn next_retry(&self, pass_started: Instant) -> Option<Duration> {
        let now = Instant::now();
        [&self.not_before, &self.requeue]
            .into_iter()
            .filter_map(|deadlines| {
                lock(deadlines)
                    .values()
                    .filter(|at| **at > pass_started)
                    .map(|at| at.saturating_duration_since(now))
                    .min()
            })
            .min()
    }

    /// The loop of a keyed controller, until `stop`: a pass on every wake-up (`wake`: a change
    /// in the controller's caches; a triggered key; a failed sync), and when the next retry is
    /// due; every `resync` a full pass (`pass(tasks, true)`: the controller offers all of its
    /// keys and forgets the state of objects that are gone) after [`KeyedWorkers::resync`].
    /// `tasks` holds the syncs and whatever else lives as long as the loop: they are dropped
    /// (aborted) with it.
    pub async fn run(
        &self,
        mut tasks: JoinSet<()>,
        wake: &Notify,
        resync: Duration,
        stop: &CancellationToken,
        mut pass: impl FnMut(&mut JoinSet<()>, bool),
    ) {
        // Tokio's clock (the same in production): a test can let the hours pass.
        let mut last_resync = tokio::time::Instant::now();
        loop {
            while tasks.try_join_next().is_some() {}
            let full = last_resync.elapsed() >= resync;
            if full {
                self.resync();
                last_resync = tokio::time::Instant::now();
            }
            let pass_started = Instant::now();
            pass(&mut tasks, full);
            let next_resync = resync.saturating_sub(last_resync.elapsed());
            let next = self
                .next_retry(pass_started)
                .map_or(next_resync, |retry| retry.min(next_resync));
            tokio::select! {
                () = stop.cancelled() => return,
                () = wake.notified() => {}
                () = self.wakened() => {}
                () = tokio::time::sleep(next) => {}
            }
        }
    }

    /// The keys of a pass on one lane: on the periodic resync (`full`) every key `all` gives
    /// (and the state of the others forgotten: their objects are gone), else
    /// [`KeyedWorkers::due`].
    pub fn pass_keys(&self, full: bool, all: impl FnOnce() -> Vec<K>) -> Vec<K> {
        if !full {
            return self.due();
        }
        let keys = all();
        self.forget_absent(keys.iter().cloned());
        keys
    }

    /// Offers `keys` at the version `version` gives (`None`: the object is gone, and the key
    /// is forgotten) and runs `sync` on lane 0 for those that changed: a single-lane
    /// controller's pass after [`KeyedWorkers::pass_keys`].
    pub fn offer<S, Fut, E>(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        keys: Vec<K>,
        version: impl Fn(&K) -> Option<String>,
        sync: S,
    ) where
        S: Fn(K) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Synced, E>> + Send + 'static,
        E: Display,
    {
        let offered = keys
            .into_iter()
            .filter_map(|key| match version(&key) {
                Some(version) => Some((key, Some(version), 0)),
                None => {
                    self.forget(&key);
                    None
                }
            })
            .collect();
        self.offer_on_lanes(tasks, offered, sync);
    }

    /// Runs `sync` for each offered `(key, version, lane)` that changed since its last
    /// complete sync ([`KeyedWorkers::changed`]), on its lane: every controller's pass ends
    /// here.
    pub fn offer_on_lanes<S, Fut, E>(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        offered: Vec<(K, Option<String>, usize)>,
        sync: S,
    ) where
        S: Fn(K) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Synced, E>> + Send + 'static,
        E: Display,
    {
        let lanes: HashMap<K, usize> = offered
            .iter()
            .map(|(key, _, lane)| (key.clone(), *lane))
            .collect();
        let pairs = offered.into_iter().map(|(key, version, _)| (key, version));
        for (key, version) in self.changed(pairs) {
            let lane = lanes.get(&key).copied().unwrap_or(0);
            let sync = sync.clone();
            let sync_key = key.clone();
            self.schedule(lane, key, version, tasks, move || sync(sync_key));
        }
    }

    /// Forgets the failures, retry deadlines, synced versions and waits of every key not
    /// `present` (its object is gone), so they neither wake the loop nor pile up.
    pub fn forget_absent(&self, present: impl IntoIterator<Item = K>) {
        let present: HashSet<K> = present.into_iter().collect();
        lock(&self.not_before).retain(|key, _| present.contains(key));
        lock(&self.synced).retain(|key, _| present.contains(key));
        lock(&self.waiting).retain(|key| present.contains(key));
        lock(&self.requeue).retain(|key, _| present.contains(key));
        lock(&self.deletion_seen).retain(|key, _| present.contains(key));
        self.backoff.retain(|key| present.contains(key));
    }

    /// [`KeyedWorkers::forget_absent`] for one key whose object is gone.
    pub fn forget(&self, key: &K) {
        lock(&self.not_before).remove(key);
        lock(&self.synced).remove(key);
        lock(&self.waiting).remove(key);
        lock(&self.requeue).remove(key);
        lock(&self.deletion_seen).remove(key);
        self.backoff.reset(key);
    }

    /// Resolves when a key was triggered or a sync failed (a pass or a retry is due).
    pub async fn wakened(&self) {
        self.wake.notified().await;
    }

    /// The periodic resync: every key offered runs again (the controller offers all of its
    /// keys on that pass).
    pub fn resync(&self) {
        lock(&self.synced).clear();
    }
}

impl<R> KeyedWorkers<ObjectRef<R>>
where
    R: Resource + Clone + 'static,
    R::DynamicType: Default + Clone + Eq + Hash + Debug + Send + Sync,
{
    /// The pass of a controller keyed by the objects of one cache (a claim, say): the due
    /// keys, or on the resync every object of `store`, each offered at the version `version`
    /// gives and synced by `sync` ([`KeyedWorkers::offer`]).
    pub fn pass_over<S, Fut, E>(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        full: bool,
        store: &Store<R>,
        version: impl Fn(&ObjectRef<R>) -> Option<String>,
        sync: S,
    ) where
        S: Fn(ObjectRef<R>) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Synced, E>> + Send + 'static,
        E: Display,
    {
        let keys = self.pass_keys(full, || {
            store
                .state()
                .iter()
                .map(|object| ObjectRef::from_obj(object.as_ref()))
                .collect()
        });
        self.offer(tasks, keys, version, sync);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn unchanged_keys_do_not_run_again_and_failures_back_off() {
        let workers =
            KeyedWorkers::<&'static str>::new(2, Duration::from_secs(60), Duration::from_secs(60));
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let offer = |version: &str| vec![("a", Some(version.to_string()))];

        for (key, version) in workers.changed(offer("1")) {
            let runs = runs.clone();
            workers.schedule(0, key, version, &mut tasks, move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(Synced::Done)
            });
        }
        while tasks.join_next().await.is_some() {}
        assert!(
            workers.changed(offer("1")).is_empty(),
            "synced at version 1"
        );
        assert_eq!(workers.changed(offer("2")).len(), 1, "a new version runs");

        for (key, version) in workers.changed(offer("2")) {
            workers.schedule(0, key, version, &mut tasks, || async {
                Err("broken".to_string())
            });
        }
        while tasks.join_next().await.is_some() {}
        let waiting = workers.next_retry(Instant::now()).expect("backing off");
        assert!(waiting > Duration::from_secs(30), "{waiting:?}");
        // The same version, and a new one (e.g. the sync's own error written into the status):
        // neither cuts the backoff short.
        for version in ["2", "3"] {
            for (key, version) in workers.changed(offer(version)) {
                let runs = runs.clone();
                workers.schedule(0, key, version, &mut tasks, move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Synced::Done)
                });
            }
        }
        while tasks.join_next().await.is_some() {}
        assert_eq!(runs.load(Ordering::SeqCst), 1, "no run while backing off");

        workers.resync();
        assert_eq!(
            workers.changed(offer("1")).len(),
            1,
            "everything runs after a resync"
        );
    }

    async fn fail(workers: &Arc<KeyedWorkers<&'static str>>, key: &'static str) {
        let mut tasks = JoinSet::new();
        workers.schedule(0, key, None, &mut tasks, || async {
            Err("broken".to_string())
        });
        while tasks.join_next().await.is_some() {}
    }

    /// Runs `key` if it may run now (not backing off); whether it ran.
    async fn runs_now(workers: &Arc<KeyedWorkers<&'static str>>, key: &'static str) -> bool {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let counter = ran.clone();
        workers.schedule(0, key, None, &mut tasks, move || async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Err("still broken".to_string())
        });
        while tasks.join_next().await.is_some() {}
        ran.load(Ordering::SeqCst) == 1
    }

    fn object(deleting: bool, finalizers: &[&str]) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
        object.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        object.metadata.deletion_timestamp =
            deleting.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        object
    }

    /// The change that shows a failing key's object being deleted ends its backoff, and so
    /// does each finalizer going from the deleting object; other changes do not.
    #[tokio::test]
    async fn a_deletion_and_its_finalizers_going_end_the_backoff() {
        let workers =
            KeyedWorkers::<&'static str>::new(2, Duration::from_secs(60), Duration::from_secs(60));
        let (ours, theirs) = ("ours", "theirs");
        fail(&workers, "a").await;
        workers.trigger_for("a", &object(false, &[ours, theirs]));
        assert!(
            !runs_now(&workers, "a").await,
            "a change backs off as before"
        );
        workers.trigger_for("a", &object(true, &[ours, theirs]));
        assert!(runs_now(&workers, "a").await, "the deletion runs at once");
        assert_eq!(workers.backoff.failures(&"a"), 2, "and counts as a retry");
        workers.trigger_for("a", &object(true, &[ours, theirs]));
        assert!(
            !runs_now(&workers, "a").await,
            "another change of the deleting object (its status, say) waits for the backoff"
        );
        workers.trigger_for("a", &object(true, &[ours]));
        assert!(
            runs_now(&workers, "a").await,
            "a finalizer gone runs at once"
        );
        workers.trigger_for("a", &object(true, &[ours]));
        assert!(!runs_now(&workers, "a").await);

        // Deleted while its sync runs: that run's failure sets no deadline.
        let release = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let wait = release.clone();
        workers.schedule(0, "b", None, &mut tasks, move || async move {
            wait.notified().await;
            Err("broken".to_string())
        });
        tokio::task::yield_now().await;
        assert!(workers.is_running(&"b"));
        workers.trigger_for("b", &object(true, &[]));
        release.notify_one();
        while tasks.join_next().await.is_some() {}
        assert!(
            runs_now(&workers, "b").await,
            "the deletion runs after the run"
        );
        assert!(!runs_now(&workers, "b").await, "then backs off");

        workers.forget(&"b");
        assert!(lock(&workers.deletion_seen).keys().eq([&"a"]));
    }

    /// A key whose object is gone loses its retry state; and no deadline that a pass has
    /// already seen (or whose retry is running) makes the loop wait zero again.
    #[tokio::test]
    async fn vanished_keys_are_forgotten_and_seen_deadlines_never_spin() {
        // Zero backoff: every deadline is due the moment the sync fails.
        let workers = KeyedWorkers::<&'static str>::new(2, Duration::ZERO, Duration::ZERO);
        let before_failures = Instant::now();
        fail(&workers, "gone").await;
        fail(&workers, "kept").await;
        assert_eq!(
            workers.next_retry(before_failures),
            Some(Duration::ZERO),
            "deadlines the last pass did not see bring one more pass"
        );
        let pass_started = Instant::now();
        assert_eq!(
            workers.next_retry(pass_started),
            None,
            "deadlines a pass saw do not wake the loop again"
        );

        workers.forget_absent(["kept"]);
        assert_eq!(workers.backoff.failures(&"gone"), 0);
        assert_eq!(workers.backoff.failures(&"kept"), 1);
        assert_eq!(
            lock(&workers.not_before)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            ["kept"],
            "only the present key keeps its deadline"
        );

        // While the retry of a due key runs, its old deadline wakes nobody.
        let mut tasks = JoinSet::new();
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (running, blocked) = (started.clone(), release.clone());
        workers.schedule(0, "kept", None, &mut tasks, move || async move {
            running.notify_one();
            blocked.notified().await;
            Ok::<_, String>(Synced::Done)
        });
        started.notified().await;
        assert_eq!(workers.next_retry(before_failures), None);
        release.notify_one();
        while tasks.join_next().await.is_some() {}
        assert_eq!(workers.backoff.failures(&"kept"), 0, "success forgets");
    }

    async fn run(
        workers: &Arc<KeyedWorkers<&'static str>>,
        key: &'static str,
        outcome: Result<Synced, String>,
    ) {
        let mut tasks = JoinSet::new();
        workers.schedule(0, key, Some("1".into()), &mut tasks, move || async move {
            outcome
        });
        while tasks.join_next().await.is_some() {}
    }

    fn sorted(mut keys: Vec<&'static str>) -> Vec<&'static str> {
        keys.sort_unstable();
        keys
    }

    /// A pass offers what the watches triggered (once), what waits for other objects (every
    /// pass, until it is done) and what is due for a retry; never the rest.
    #[tokio::test]
    async fn passes_offer_triggered_waiting_and_due_keys_only() {
        let workers = KeyedWorkers::<&'static str>::new(2, Duration::ZERO, Duration::ZERO);
        assert!(workers.due().is_empty(), "nothing triggered");
        workers.trigger("changed");
        workers.trigger("changed");
        assert_eq!(
            workers.due(),
            ["changed"],
            "a key once, however often triggered"
        );
        assert!(workers.due().is_empty(), "taken by the pass");

        run(&workers, "waits", Ok(Synced::Waiting)).await;
        run(&workers, "fails", Err("broken".into())).await;
        run(&workers, "done", Ok(Synced::Done)).await;
        assert_eq!(sorted(workers.due()), ["fails", "waits"]);
        assert_eq!(
            sorted(workers.due()),
            ["fails", "waits"],
            "again, until done"
        );

        run(&workers, "waits", Ok(Synced::Done)).await;
        run(&workers, "fails", Ok(Synced::Done)).await;
        assert!(workers.due().is_empty());

        run(&workers, "waits", Ok(Synced::Waiting)).await;
        workers.forget(&"waits");
        assert!(workers.due().is_empty(), "a key whose object is gone");
    }

    /// A sync that asks to run again later ([`Synced::After`]) is due then — and at once when
    /// its object changes meanwhile.
    #[tokio::test]
    async fn a_requeued_key_runs_again_after_its_wait() {
        let workers = KeyedWorkers::<&'static str>::new(1, Duration::ZERO, Duration::ZERO);
        let before = Instant::now();
        run(
            &workers,
            "later",
            Ok(Synced::After(Duration::from_secs(60))),
        )
        .await;
        assert!(workers.due().is_empty(), "not due yet");
        assert!(workers.next_retry(before).expect("requeued") > Duration::from_secs(30));
        assert_eq!(workers.backoff.failures(&"later"), 0, "no failure");
        workers.trigger("later");
        assert_eq!(workers.due(), ["later"], "a change is offered");
        run(&workers, "later", Ok(Synced::Done)).await;
        assert_eq!(
            workers.next_retry(before),
            None,
            "ran: the requeue is spent"
        );
        run(&workers, "soon", Ok(Synced::After(Duration::ZERO))).await;
        assert_eq!(workers.due(), ["soon"], "due at once");
        assert!(
            workers.changed([("soon", Some("1".to_string()))]).len() == 1,
            "runs again at the version it was synced at"
        );
        assert_eq!(workers.next_retry(before), Some(Duration::ZERO));
    }

    /// A key triggered while its sync runs is not lost: it is triggered again when the run
    /// ends, so the change the running sync may have missed gets its own.
    #[tokio::test]
    async fn a_change_during_a_run_is_offered_after_it() {
        let workers =
            KeyedWorkers::<&'static str>::new(1, Duration::from_secs(1), Duration::from_secs(1));
        let mut tasks = JoinSet::new();
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (running, blocked) = (started.clone(), release.clone());
        workers.schedule(0, "a", Some("1".into()), &mut tasks, move || async move {
            running.notify_one();
            blocked.notified().await;
            Ok::<_, String>(Synced::Done)
        });
        started.notified().await;
        workers.schedule::<_, _, String>(0, "a", Some("2".into()), &mut tasks, || async {
            panic!("a runs already")
        });
        assert!(workers.due().is_empty(), "not before the run ends");
        release.notify_one();
        while tasks.join_next().await.is_some() {}
        assert_eq!(workers.due(), ["a"]);
        assert_eq!(
            workers.changed([("a", Some("2".to_string()))]).len(),
            1,
            "the newer version runs"
        );
    }

    /// Each lane runs at most its own number of syncs at once.
    #[tokio::test]
    async fn lanes_have_their_own_sizes() {
        let workers = KeyedWorkers::<u32>::with_lane_sizes(
            &[3, 1],
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let mut tasks = JoinSet::new();
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let peak = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let running = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        for key in 0..8u32 {
            let lane = usize::from(key % 2 == 1);
            let (release, peak, running) = (release.clone(), peak.clone(), running.clone());
            workers.schedule(lane, key, None, &mut tasks, move || async move {
                let now = running[lane].fetch_add(1, Ordering::SeqCst) + 1;
                peak[lane].fetch_max(now, Ordering::SeqCst);
                release.acquire().await.expect("open").forget();
                running[lane].fetch_sub(1, Ordering::SeqCst);
                Ok::<_, String>(Synced::Done)
            });
        }
        // Let every task that can get a worker start, then let them all finish.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(running[0].load(Ordering::SeqCst), 3, "lane 0 is full");
        assert_eq!(running[1].load(Ordering::SeqCst), 1, "lane 1 is full");
        release.add_permits(8);
        while tasks.join_next().await.is_some() {}
        assert_eq!(peak[0].load(Ordering::SeqCst), 3);
        assert_eq!(peak[1].load(Ordering::SeqCst), 1);
    }

    /// A lane whose workers are all busy does not hold up another lane, and a key never runs
    /// in two lanes at once.
    #[tokio::test]
    async fn lanes_do_not_starve_each_other() {
        let workers =
            KeyedWorkers::<u32>::with_lanes(2, 1, Duration::from_secs(1), Duration::from_secs(1));
        let mut tasks = JoinSet::new();
        let release = Arc::new(Notify::new());
        let blocked = release.clone();
        workers.schedule(1, 1, None, &mut tasks, move || async move {
            blocked.notified().await;
            Ok::<_, String>(Synced::Done)
        });
        workers.schedule::<_, _, String>(0, 1, None, &mut tasks, || async {
            panic!("key 1 is already running")
        });
        let (done, signal) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let (count, wake) = (done.clone(), signal.clone());
        workers.schedule(0, 2, None, &mut tasks, move || async move {
            count.fetch_add(1, Ordering::SeqCst);
            wake.notify_one();
            Ok::<_, String>(Synced::Done)
        });
        signal.notified().await;
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "lane 0 ran while lane 1 was busy"
        );
        assert!(workers.is_running(&1));
        release.notify_one();
        while tasks.join_next().await.is_some() {}
        assert!(!workers.is_running(&1));
    }

    /// The resync comes every `resync` from the last one, also when changes woke the loop in
    /// between (not a whole period after the last wake-up).
    #[tokio::test(start_paused = true)]
    async fn the_resync_keeps_its_period_across_wake_ups() {
        let workers =
            KeyedWorkers::<&'static str>::new(1, Duration::from_secs(1), Duration::from_secs(1));
        let wake = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let passes = Arc::new(Mutex::new(Vec::new()));
        let start = tokio::time::Instant::now();
        let run = tokio::spawn({
            let (workers, wake, stop, passes) =
                (workers.clone(), wake.clone(), stop.clone(), passes.clone());
            async move {
                workers
                    .run(
                        JoinSet::new(),
                        &wake,
                        Duration::from_secs(60),
                        &stop,
                        |_, full| lock(&passes).push((start.elapsed().as_secs(), full)),
                    )
                    .await;
            }
        });
        tokio::time::sleep(Duration::from_secs(50)).await;
        wake.notify_one();
        tokio::time::sleep(Duration::from_secs(80)).await;
        stop.cancel();
        run.await.expect("the loop ends");
        assert_eq!(
            *lock(&passes),
            vec![(0, false), (50, false), (60, true), (120, true)]
        );
    }
}
