//! Keyed workers for level-triggered controllers: each pass over the caches offers every
//! object's key with its resourceVersion; a key runs when it changed since it was last synced
//! with nothing left to do, is not already running, and is not backing off after a failure.
//! At most `workers` syncs run at once per lane; one key never runs twice at once, in any
//! lane. This is what client-go's rate-limited workqueue gives the Go sidecars, without a
//! queue to overflow; lanes are separate queues that share the per-key guarantees (so a storm
//! of one kind of work cannot starve another, external-attacher #761).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::backoff::Backoff;

/// How a sync ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// Nothing left to do for this version of the object.
    Done,
    /// Waiting for other objects (or for the caches to show our own write): offered again on
    /// the next pass even if this object stays the same.
    Waiting,
}

#[derive(Debug)]
pub struct KeyedWorkers<K> {
    backoff: Backoff<K>,
    /// Not before this instant (after a failure).
    not_before: Mutex<HashMap<K, Instant>>,
    in_flight: Mutex<HashSet<K>>,
    /// The resourceVersion each key was last synced at with [`Synced::Done`].
    synced: Mutex<HashMap<K, String>>,
    /// One pool of permits per lane.
    lanes: Vec<Semaphore>,
    /// Woken when a sync failed, so its retry is scheduled without waiting for a change.
    retry: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
            backoff: Backoff::new(retry_start, retry_max),
            not_before: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashSet::new()),
            synced: Mutex::new(HashMap::new()),
            lanes: sizes
                .iter()
                .map(|workers| Semaphore::new((*workers).max(1)))
                .collect(),
            retry: Notify::new(),
        })
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
    /// unless the key is running or backing off. A failure backs the key off (exponentially)
    /// and wakes [`KeyedWorkers::retry_due`].
    pub fn schedule<F, Fut>(
        self: &Arc<Self>,
        lane: usize,
        key: K,
        version: Option<String>,
        tasks: &mut JoinSet<()>,
        sync: F,
    ) where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Synced, String>> + Send + 'static,
    {
        {
            let mut not_before = lock(&self.not_before);
            if not_before.get(&key).is_some_and(|at| *at > Instant::now()) {
                return;
            }
            if !lock(&self.in_flight).insert(key.clone()) {
                return;
            }
            // The retry is under way: a deadline left behind would wake the loop for nothing
            // for as long as the sync runs.
            not_before.remove(&key);
        }
        let this = self.clone();
        tasks.spawn(async move {
            let permits = &this.lanes[lane.min(this.lanes.len() - 1)];
            let Ok(_permit) = permits.acquire().await else {
                return;
            };
            let failed = match sync().await {
                Ok(synced) => {
                    this.backoff.reset(&key);
                    match (synced, version) {
                        (Synced::Done, Some(version)) => {
                            lock(&this.synced).insert(key.clone(), version);
                        }
                        _ => {
                            lock(&this.synced).remove(&key);
                        }
                    }
                    false
                }
                Err(error) => {
                    lock(&this.synced).remove(&key);
                    let delay = this.backoff.next_delay(&key);
                    tracing::warn!(?key, %error, retry_in = ?delay, "sync failed");
                    lock(&this.not_before).insert(key.clone(), Instant::now() + delay);
                    true
                }
            };
            lock(&this.in_flight).remove(&key);
            if failed {
                this.retry.notify_one();
            }
        });
    }

    /// Whether a sync of `key` is running (or waiting for a worker).
    pub fn is_running(&self, key: &K) -> bool {
        lock(&self.in_flight).contains(key)
    }

    /// The shortest wait until a backing-off key may run again, counting only deadlines after
    /// `pass_started` (the start of the pass that just ran): that pass already ran the keys
    /// whose deadline had come, and a key it did not offer must not wake the loop again and
    /// again. A deadline reached during the pass gives zero: one more pass runs it.
    pub fn next_retry(&self, pass_started: Instant) -> Option<Duration> {
        let now = Instant::now();
        lock(&self.not_before)
            .values()
            .filter(|at| **at > pass_started)
            .map(|at| at.saturating_duration_since(now))
            .min()
    }

    /// Forgets the failures, retry deadlines and synced versions of every key not `present`
    /// (its object is gone), so they neither wake the loop nor pile up.
    pub fn forget_absent(&self, present: impl IntoIterator<Item = K>) {
        let present: HashSet<K> = present.into_iter().collect();
        lock(&self.not_before).retain(|key, _| present.contains(key));
        lock(&self.synced).retain(|key, _| present.contains(key));
        self.backoff.retain(|key| present.contains(key));
    }

    /// Resolves when a sync failed (its retry needs scheduling).
    pub async fn retry_due(&self) {
        self.retry.notified().await;
    }

    /// The periodic resync: every key runs again on the next pass.
    pub fn resync(&self) {
        lock(&self.synced).clear();
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
                Ok(Synced::Done)
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
                    Ok(Synced::Done)
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
            Ok(Synced::Done)
        });
        started.notified().await;
        assert_eq!(workers.next_retry(before_failures), None);
        release.notify_one();
        while tasks.join_next().await.is_some() {}
        assert_eq!(workers.backoff.failures(&"kept"), 0, "success forgets");
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
                Ok(Synced::Done)
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
            Ok(Synced::Done)
        });
        workers.schedule(0, 1, None, &mut tasks, || async {
            panic!("key 1 is already running")
        });
        let (done, signal) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let (count, wake) = (done.clone(), signal.clone());
        workers.schedule(0, 2, None, &mut tasks, move || async move {
            count.fetch_add(1, Ordering::SeqCst);
            wake.notify_one();
            Ok(Synced::Done)
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
}
