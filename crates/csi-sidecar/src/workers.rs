//! The reconciler runtime every controller of the suite runs on: keyed, level-triggered
//! workers. A controller implements [`Reconciler`] — its keys, what a key needs now (its
//! version and lane: [`Reconciler::offer`]), and its sync — and [`KeyedWorkers::reconcile`]
//! runs the loop. The controller's watches [`KeyedWorkers::trigger`] the keys an object change
//! concerns (a claim's change queues that claim, not a scan of every cache); each pass offers
//! those keys, the keys waiting for other objects and the keys whose retry is due, each at its
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
//! Why not `kube::runtime::Controller` (re-checked against kube-runtime 5.0, the release we
//! pin): three requirements it still cannot meet.
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
//!
//! Controllers whose work is not one sync per object key keep their own pass on the lower
//! level ([`KeyedWorkers::run`], [`KeyedWorkers::due`], [`KeyedWorkers::schedule`]): podmon's
//! cluster-wide plan and the capacity tracker's wanted items.

use std::collections::{HashMap, HashSet};
use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::Resource;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::delay_for;
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

/// What a key needs when a pass offers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Its object is gone: the runtime's and the controller's state of it are forgotten.
    Gone,
    /// Nothing to do now; its state (a backoff, say) is kept.
    Idle,
    /// A sync on `lane` if the object changed since `version` was synced; without a version
    /// it runs whenever offered.
    Run {
        version: Option<String>,
        lane: usize,
    },
}

impl Offer {
    /// A sync on lane 0 at `version`.
    pub fn at(version: Option<String>) -> Self {
        Offer::Run { version, lane: 0 }
    }
}

/// A controller as the runtime runs it.
pub trait Reconciler: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    type Error: Display + Send + 'static;

    /// Every key, for the periodic resync (the runtime forgets the state of all others).
    fn keys(&self) -> Vec<Self::Key>;

    /// What `key` needs now: read from the caches, no I/O.
    fn offer(&self, key: &Self::Key) -> Offer;

    /// The sync of `key`.
    fn sync(self: Arc<Self>, key: Self::Key) -> SyncFuture<Self::Error>;

    /// The keys a pass offers for those the watches triggered or that are due: by default the
    /// same; a controller whose key concerns others (a claim, the snapshots taken of it) adds
    /// them here.
    fn concerned(&self, keys: Vec<Self::Key>) -> Vec<Self::Key> {
        keys
    }

    /// Drops the controller's own state of `key`, whose object is gone.
    fn forget(&self, _key: &Self::Key) {}

    /// Called at the start of every pass (`full`: the periodic resync).
    fn pass_started(&self, _full: bool) {}
}

/// One key's state.
#[derive(Debug, Default)]
struct KeyState {
    /// The resourceVersion the key was last synced at with [`Synced::Done`].
    synced: Option<String>,
    /// Failures in a row: the exponent of the next backoff.
    failures: u32,
    /// The object was seen being deleted with this many finalizers (a deleting object can
    /// only lose finalizers).
    deletion_seen: Option<usize>,
    phase: Phase,
}

impl KeyState {
    /// Nothing worth keeping: the entry can go.
    fn is_blank(&self) -> bool {
        matches!(self.phase, Phase::Idle)
            && self.synced.is_none()
            && self.failures == 0
            && self.deletion_seen.is_none()
    }

    /// Forgets all but a run under way (its end still has to be handled).
    fn reset(&mut self) {
        *self = KeyState {
            phase: match self.phase {
                running @ Phase::Running { .. } => running,
                _ => Phase::Idle,
            },
            ..KeyState::default()
        };
    }

    /// The instant a backing-off or requeued key may run again.
    fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::BackingOff { until } => Some(until),
            Phase::Requeued { at } => Some(at),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Idle,
    /// Scheduled: running, or waiting for a worker of its lane.
    Running {
        /// Offered while running: triggered again when the run ends.
        rerun: bool,
        /// Its backoff was ended ([`KeyedWorkers::trigger_for`]) while it ran: a failure of
        /// this run sets no deadline (the change that ended it runs at once after).
        backoff_ended: bool,
    },
    /// Failed: not run again before `until`.
    BackingOff { until: Instant },
    /// Its last sync ended [`Synced::Waiting`]: offered on every pass.
    Waiting,
    /// Its last sync ended [`Synced::After`]: offered from `at` on.
    Requeued { at: Instant },
}

/// Every key's state behind one lock, with two indexes so that a pass reads only the keys it
/// may offer, never all of them (a burst of thousands of claims wakes the loop thousands of
/// times).
#[derive(Debug)]
struct State<K> {
    keys: HashMap<K, KeyState>,
    /// Keys the watches brought since the last pass.
    triggered: HashSet<K>,
    /// Keys waiting, backing off or requeued.
    pending: HashSet<K>,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn set_phase(&mut self, key: &K, phase: Phase) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.phase = phase;
        match phase {
            Phase::Waiting | Phase::BackingOff { .. } | Phase::Requeued { .. } => {
                self.pending.insert(key.clone());
            }
            Phase::Idle | Phase::Running { .. } => {
                self.pending.remove(key);
            }
        }
        if state.is_blank() {
            self.keys.remove(key);
        }
    }

    fn forget(&mut self, key: &K) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.reset();
        let phase = state.phase;
        self.set_phase(key, phase);
    }
}

#[derive(Debug)]
pub struct KeyedWorkers<K> {
    state: Mutex<State<K>>,
    retry_start: Duration,
    retry_max: Duration,
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

/// How a run ended, for its log line once the lock is released.
enum Ended<E> {
    /// `wake`: requeued, the loop has a new deadline to learn.
    Quietly { wake: bool },
    Failed {
        error: E,
        retry_in: Option<Duration>,
    },
}

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
            state: Mutex::new(State {
                keys: HashMap::new(),
                triggered: HashSet::new(),
                pending: HashSet::new(),
            }),
            retry_start,
            retry_max,
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
        lock(&self.state).triggered.insert(key);
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
            let mut state = lock(&self.state);
            let entry = state.keys.entry(key.clone()).or_default();
            if entry.deletion_seen.replace(finalizers) != Some(finalizers) {
                // Lets the key run on the next pass whatever its backoff; a run under way
                // that fails sets no new deadline.
                match &mut entry.phase {
                    Phase::Running { backoff_ended, .. } => *backoff_ended = true,
                    Phase::BackingOff { .. } => {
                        entry.phase = Phase::Idle;
                        state.pending.remove(&key);
                    }
                    _ => {}
                }
            }
        }
        self.trigger(key);
    }

    /// The keys the next pass offers: those triggered since the last pass (taken), those
    /// waiting for other objects, and those whose retry is due.
    pub fn due(&self) -> Vec<K> {
        let mut state = lock(&self.state);
        let mut keys = std::mem::take(&mut state.triggered);
        let now = Instant::now();
        keys.extend(
            state
                .pending
                .iter()
                .filter(|key| {
                    state.keys.get(*key).is_some_and(|s| {
                        s.phase == Phase::Waiting || s.deadline().is_some_and(|at| at <= now)
                    })
                })
                .cloned(),
        );
        keys.into_iter().collect()
    }

    /// The offered keys that changed since their last complete sync (a key without a version
    /// always counts as changed).
    pub fn changed(
        &self,
        offered: impl IntoIterator<Item = (K, Option<String>)>,
    ) -> Vec<(K, Option<String>)> {
        let state = lock(&self.state);
        offered
            .into_iter()
            .filter(|(key, version)| {
                version.is_none()
                    || state.keys.get(key).and_then(|s| s.synced.as_ref()) != version.as_ref()
            })
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
            let mut state = lock(&self.state);
            let entry = state.keys.entry(key.clone()).or_default();
            match &mut entry.phase {
                Phase::BackingOff { until } if *until > Instant::now() => return,
                Phase::Running { rerun, .. } => {
                    *rerun = true;
                    return;
                }
                _ => {}
            }
            // A deadline of the retry now under way would wake the loop for nothing.
            state.set_phase(
                &key,
                Phase::Running {
                    rerun: false,
                    backoff_ended: false,
                },
            );
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
            // Boxed once it may run: inline, the sync's whole state (kilobytes: requests,
            // objects) would be part of every task, also of the thousands that wait for a
            // worker after a burst (36 MiB of 62 at 2000 claims, measured with heaptrack).
            let outcome = Box::pin(sync()).await;
            if outcome.is_err()
                && let Some(queue) = &queue
            {
                queue.retried();
            }
            let (ended, rerun) = this.ended(&key, version, outcome);
            let wake = !matches!(ended, Ended::Quietly { wake: false });
            match ended {
                Ended::Quietly { .. } => {}
                Ended::Failed {
                    error,
                    retry_in: Some(delay),
                } => tracing::warn!(?key, %error, retry_in = ?delay, "sync failed"),
                Ended::Failed {
                    error,
                    retry_in: None,
                } => {
                    tracing::warn!(?key, %error, "sync failed; retried now: the object's deletion changed meanwhile");
                }
            }
            if rerun {
                this.trigger(key);
            } else if wake {
                // Its retry (or requeue) needs the loop to learn the new deadline.
                this.wake.notify_one();
            }
        });
    }

    /// Records how the run of `key` (synced at `version`) ended; whether it was offered
    /// meanwhile.
    fn ended<E>(
        &self,
        key: &K,
        version: Option<String>,
        outcome: Result<Synced, E>,
    ) -> (Ended<E>, bool) {
        let mut state = lock(&self.state);
        let now = Instant::now();
        let entry = state.keys.entry(key.clone()).or_default();
        let (rerun, backoff_ended) = match entry.phase {
            Phase::Running {
                rerun,
                backoff_ended,
            } => (rerun, backoff_ended),
            _ => (false, false),
        };
        let (phase, ended) = match outcome {
            Ok(synced) => {
                entry.failures = 0;
                entry.synced = match synced {
                    Synced::Done => version,
                    Synced::Waiting | Synced::After(_) => None,
                };
                let phase = match synced {
                    Synced::Done => Phase::Idle,
                    Synced::Waiting => Phase::Waiting,
                    Synced::After(wait) => Phase::Requeued { at: now + wait },
                };
                let wake = matches!(phase, Phase::Requeued { .. });
                (phase, Ended::Quietly { wake })
            }
            Err(error) => {
                entry.synced = None;
                let delay = delay_for(self.retry_start, self.retry_max, entry.failures);
                entry.failures = entry.failures.saturating_add(1);
                if backoff_ended {
                    let ended = Ended::Failed {
                        error,
                        retry_in: None,
                    };
                    (Phase::Idle, ended)
                } else {
                    let ended = Ended::Failed {
                        error,
                        retry_in: Some(delay),
                    };
                    (Phase::BackingOff { until: now + delay }, ended)
                }
            }
        };
        state.set_phase(key, phase);
        (ended, rerun)
    }

    /// Whether a sync of `key` is running (or waiting for a worker).
    pub fn is_running(&self, key: &K) -> bool {
        lock(&self.state)
            .keys
            .get(key)
            .is_some_and(|s| matches!(s.phase, Phase::Running { .. }))
    }

    /// The shortest wait until a backing-off (or requeued) key may run again, counting only
    /// deadlines after `pass_started` (the start of the pass that just ran): that pass already
    /// ran the keys whose deadline had come, and a key it did not offer must not wake the loop
    /// again and again. A deadline reached during the pass gives zero: one more pass runs it.
    pub fn next_retry(&self, pass_started: Instant) -> Option<Duration> {
        let now = Instant::now();
        let state = lock(&self.state);
        state
            .pending
            .iter()
            .filter_map(|key| state.keys.get(key)?.deadline())
            .filter(|at| *at > pass_started)
            .map(|at| at.saturating_duration_since(now))
            .min()
    }

    /// The loop of a controller with its own pass, until `stop`: a pass on every wake-up
    /// (`wake`: a change in the controller's caches; a triggered key; a failed sync), and when
    /// the next retry is due; every `resync` a full pass (`pass(tasks, true)`) after
    /// [`KeyedWorkers::resync`]. `tasks` holds the syncs and whatever else lives as long as
    /// the loop: they are dropped (aborted) with it.
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

    /// Runs `reconciler` until `stop` ([`KeyedWorkers::run`] with the pass every reconciler
    /// has): on the periodic resync every key it has (the state of the others forgotten: their
    /// objects are gone), else the due keys and those they concern; each offered, and synced
    /// on its lane if it changed since its last complete sync.
    pub async fn reconcile<R: Reconciler<Key = K>>(
        self: &Arc<Self>,
        reconciler: &Arc<R>,
        tasks: JoinSet<()>,
        wake: &Notify,
        resync: Duration,
        stop: &CancellationToken,
    ) {
        self.run(tasks, wake, resync, stop, |tasks, full| {
            self.pass(reconciler, tasks, full);
        })
        .await;
    }

    fn pass<R: Reconciler<Key = K>>(
        self: &Arc<Self>,
        reconciler: &Arc<R>,
        tasks: &mut JoinSet<()>,
        full: bool,
    ) {
        reconciler.pass_started(full);
        let keys = if full {
            let keys = reconciler.keys();
            self.forget_absent(keys.iter().cloned());
            keys
        } else {
            reconciler.concerned(self.due())
        };
        let mut lanes = HashMap::new();
        let offered: Vec<(K, Option<String>)> = keys
            .into_iter()
            .filter_map(|key| match reconciler.offer(&key) {
                Offer::Gone => {
                    self.forget(&key);
                    reconciler.forget(&key);
                    None
                }
                Offer::Idle => None,
                Offer::Run { version, lane } => {
                    lanes.insert(key.clone(), lane);
                    Some((key, version))
                }
            })
            .collect();
        tracing::trace!(offered = offered.len(), full, "pass");
        for (key, version) in self.changed(offered) {
            let lane = lanes.get(&key).copied().unwrap_or(0);
            let (reconciler, sync_key) = (reconciler.clone(), key.clone());
            // The sync's future is made once a worker takes the key, not while it waits.
            self.schedule(lane, key, version, tasks, move || reconciler.sync(sync_key));
        }
    }

    /// Forgets the failures, retry deadlines, synced versions and waits of every key not
    /// `present` (its object is gone), so they neither wake the loop nor pile up.
    pub fn forget_absent(&self, present: impl IntoIterator<Item = K>) {
        let present: HashSet<K> = present.into_iter().collect();
        let mut state = lock(&self.state);
        let absent: Vec<K> = state
            .keys
            .keys()
            .filter(|key| !present.contains(*key))
            .cloned()
            .collect();
        for key in absent {
            state.forget(&key);
        }
    }

    /// [`KeyedWorkers::forget_absent`] for one key whose object is gone.
    pub fn forget(&self, key: &K) {
        lock(&self.state).forget(key);
    }

    /// Resolves when a key was triggered or a sync failed (a pass or a retry is due).
    pub async fn wakened(&self) {
        self.wake.notified().await;
    }

    /// The periodic resync: every key offered runs again (the controller offers all of its
    /// keys on that pass).
    pub fn resync(&self) {
        let mut state = lock(&self.state);
        state.keys.retain(|_, s| {
            s.synced = None;
            !s.is_blank()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// How many times in a row `key` failed.
    fn failures(workers: &KeyedWorkers<&'static str>, key: &&'static str) -> u32 {
        lock(&workers.state).keys.get(key).map_or(0, |s| s.failures)
    }

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
        assert_eq!(failures(&workers, &"a"), 2, "and counts as a retry");
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
        let state = lock(&workers.state);
        let seen: Vec<_> = state
            .keys
            .iter()
            .filter(|(_, s)| s.deletion_seen.is_some())
            .map(|(key, _)| *key)
            .collect();
        assert_eq!(seen, ["a"], "only the present key's deletion is remembered");
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
        assert_eq!(failures(&workers, &"gone"), 0);
        assert_eq!(failures(&workers, &"kept"), 1);
        let deadlines: Vec<_> = lock(&workers.state)
            .keys
            .iter()
            .filter(|(_, s)| s.deadline().is_some())
            .map(|(key, _)| *key)
            .collect();
        assert_eq!(
            deadlines,
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
        assert_eq!(failures(&workers, &"kept"), 0, "success forgets");
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

    /// A controller for the runtime's own pass: each key's offer is set by the test, and
    /// what the runtime asked of it is recorded.
    #[derive(Default)]
    struct Recorder {
        offers: Mutex<HashMap<&'static str, Offer>>,
        synced: Mutex<Vec<&'static str>>,
        forgotten: Mutex<Vec<&'static str>>,
        passes: Mutex<Vec<bool>>,
    }

    impl Reconciler for Recorder {
        type Key = &'static str;
        type Error = String;

        fn keys(&self) -> Vec<&'static str> {
            let mut keys: Vec<_> = lock(&self.offers).keys().copied().collect();
            keys.sort_unstable();
            keys
        }

        fn offer(&self, key: &&'static str) -> Offer {
            lock(&self.offers).get(key).cloned().unwrap_or(Offer::Gone)
        }

        fn sync(self: Arc<Self>, key: &'static str) -> SyncFuture<String> {
            Box::pin(async move {
                lock(&self.synced).push(key);
                Ok(Synced::Done)
            })
        }

        /// `parent` concerns `child`.
        fn concerned(&self, mut keys: Vec<&'static str>) -> Vec<&'static str> {
            if keys.contains(&"parent") {
                keys.push("child");
            }
            keys
        }

        fn forget(&self, key: &&'static str) {
            lock(&self.forgotten).push(key);
        }

        fn pass_started(&self, full: bool) {
            lock(&self.passes).push(full);
        }
    }

    impl Recorder {
        fn set(&self, key: &'static str, offer: Offer) {
            lock(&self.offers).insert(key, offer);
        }

        fn take(list: &Mutex<Vec<&'static str>>) -> Vec<&'static str> {
            sorted(std::mem::take(&mut *lock(list)))
        }
    }

    /// The runtime's pass: triggered keys and those they concern are offered; a key runs when
    /// its offer asks and its version changed, a gone key is forgotten on both sides, an idle
    /// one keeps its state; the resync offers every key and forgets the state of the others.
    #[tokio::test]
    async fn the_runtime_runs_a_reconcilers_pass() {
        let workers = KeyedWorkers::<&'static str>::new(2, Duration::ZERO, Duration::ZERO);
        let recorder = Arc::new(Recorder::default());
        let pass = |full: bool| {
            let mut tasks = JoinSet::new();
            workers.pass(&recorder, &mut tasks, full);
            tasks
        };
        recorder.set("parent", Offer::at(Some("1".into())));
        recorder.set("child", Offer::at(Some("7".into())));
        recorder.set("idle", Offer::Idle);
        for key in ["parent", "idle", "gone"] {
            workers.trigger(key);
        }
        let mut tasks = pass(false);
        while tasks.join_next().await.is_some() {}
        assert_eq!(Recorder::take(&recorder.synced), ["child", "parent"]);
        assert_eq!(Recorder::take(&recorder.forgotten), ["gone"]);

        workers.trigger("parent");
        let mut tasks = pass(false);
        while tasks.join_next().await.is_some() {}
        assert!(
            Recorder::take(&recorder.synced).is_empty(),
            "the same versions do not run again"
        );

        recorder.set("child", Offer::at(Some("8".into())));
        workers.trigger("parent");
        let mut tasks = pass(false);
        while tasks.join_next().await.is_some() {}
        assert_eq!(Recorder::take(&recorder.synced), ["child"]);

        // The resync: every key of the reconciler runs again, and the state of keys it no
        // longer has goes.
        lock(&recorder.offers).remove("child");
        workers.resync();
        let mut tasks = pass(true);
        while tasks.join_next().await.is_some() {}
        assert_eq!(Recorder::take(&recorder.synced), ["parent"]);
        assert!(
            workers.changed([("child", Some("8".to_string()))]).len() == 1,
            "the state of a key the resync did not find is forgotten"
        );
        assert_eq!(*lock(&recorder.passes), [false, false, false, true]);
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
        assert_eq!(failures(&workers, &"later"), 0, "no failure");
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
