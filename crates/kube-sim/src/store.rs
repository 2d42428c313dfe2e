//! Object storage with kube-apiserver's versioning: one global, monotonically increasing
//! resourceVersion (etcd's revision); every committed change is an event kept in a bounded
//! history (so watches resume from a resourceVersion) and fanned out to live watches in commit
//! order. A watch asking for a version older than the history answers 410 Gone, as after an
//! etcd compaction.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::broadcast;

/// How many events the history keeps for watch resumption.
pub const HISTORY: usize = 50_000;

/// Per-watch buffer; a watcher that falls this far behind is disconnected (kube-apiserver
/// closes slow watchers instead of blocking writers).
pub const WATCH_BUFFER: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone)]
pub struct Event {
    pub revision: u64,
    pub storage_key: String,
    pub namespace: String,
    pub kind: EventType,
    /// The object after the change (for deletions, its last state).
    pub object: Arc<Value>,
    /// The object before the change (modifications), to turn selector moves into
    /// ADDED/DELETED as the watch cache does.
    pub previous: Option<Arc<Value>>,
}

/// (storage key, namespace, name).
pub type ObjectKey = (String, String, String);

#[derive(Debug)]
struct Inner {
    revision: u64,
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    history: VecDeque<Event>,
    /// Revision of the newest event dropped from the history.
    compacted: u64,
}

impl Inner {
    fn objects_of(&self, storage_key: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|((key, ns, _), _)| key == storage_key && namespace.is_none_or(|n| n == ns))
            .map(|(_, object)| object.clone())
            .collect()
    }
}

#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Event>,
}

impl Default for Store {
    fn default() -> Self {
        let (events, _) = broadcast::channel(WATCH_BUFFER);
        Self {
            inner: Mutex::new(Inner {
                revision: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
            }),
            events,
        }
    }
}

/// A watch's start: the events to replay, then the live channel.
#[derive(Debug)]
pub struct WatchStart {
    pub replay: Vec<Event>,
    pub live: broadcast::Receiver<Event>,
    pub revision: u64,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.lock().objects.get(key).cloned()
    }

    /// Objects of one resource (and namespace, if given), in key order, with the revision.
    pub fn list(&self, storage_key: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let objects = inner.objects_of(storage_key, namespace);
        (objects, inner.revision)
    }

    /// Every object of every resource, for garbage collection.
    pub fn all(&self) -> Vec<(ObjectKey, Arc<Value>)> {
        self.lock()
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Commits a change decided by `change` from the current object (None: absent). `change`
    /// returns the new object (None: delete) or an error; it runs under the store lock, so
    /// read-check-write is atomic. The committed object gets the new resourceVersion.
    pub fn commit<E>(
        &self,
        key: &ObjectKey,
        change: impl FnOnce(Option<&Value>) -> Result<Option<Value>, E>,
    ) -> Result<Option<Arc<Value>>, E> {
        let mut inner = self.lock();
        let current = inner.objects.get(key).cloned();
        let Some(mut next) = change(current.as_deref())? else {
            let Some(previous) = current else {
                return Ok(None);
            };
            inner.objects.remove(key);
            let revision = Self::bump(&mut inner);
            let mut last = (*previous).clone();
            last["metadata"]["resourceVersion"] = Value::String(revision.to_string());
            let last = Arc::new(last);
            self.record(
                &mut inner,
                key,
                EventType::Deleted,
                last.clone(),
                None,
                revision,
            );
            return Ok(Some(last));
        };
        // A change that changes nothing is not a write (no new resourceVersion, no event).
        if let Some(current) = &current {
            let mut unchanged = next.clone();
            unchanged["metadata"]["resourceVersion"] =
                current["metadata"]["resourceVersion"].clone();
            if unchanged == **current {
                return Ok(Some(current.clone()));
            }
        }
        let revision = Self::bump(&mut inner);
        next["metadata"]["resourceVersion"] = Value::String(revision.to_string());
        let next = Arc::new(next);
        inner.objects.insert(key.clone(), next.clone());
        let kind = if current.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(&mut inner, key, kind, next.clone(), current, revision);
        Ok(Some(next))
    }

    fn bump(inner: &mut Inner) -> u64 {
        inner.revision += 1;
        inner.revision
    }

    fn record(
        &self,
        inner: &mut Inner,
        key: &ObjectKey,
        kind: EventType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
        revision: u64,
    ) {
        let event = Event {
            revision,
            storage_key: key.0.clone(),
            namespace: key.1.clone(),
            kind,
            object,
            previous,
        };
        if inner.history.len() >= HISTORY
            && let Some(dropped) = inner.history.pop_front()
        {
            inner.compacted = dropped.revision;
        }
        inner.history.push_back(event.clone());
        // No receivers is fine: nobody watches.
        let _ = self.events.send(event);
    }

    /// Starts a watch after `revision` (None: from now). `Err(oldest)` when the history no
    /// longer reaches back that far.
    pub fn watch_from(&self, revision: Option<u64>) -> Result<WatchStart, u64> {
        let inner = self.lock();
        // Subscribing under the lock: no event falls between the replay and the live feed.
        let live = self.events.subscribe();
        let replay = match revision {
            None => Vec::new(),
            Some(from) if from < inner.compacted => return Err(inner.compacted + 1),
            Some(from) => inner
                .history
                .iter()
                .filter(|e| e.revision > from)
                .cloned()
                .collect(),
        };
        Ok(WatchStart {
            replay,
            live,
            revision: inner.revision,
        })
    }

    /// The current objects of a resource and a live feed starting right after them, taken
    /// atomically (a watch without a resourceVersion starts with ADDED for each object).
    pub fn snapshot_and_watch(
        &self,
        storage_key: &str,
        namespace: Option<&str>,
    ) -> (Vec<Arc<Value>>, WatchStart) {
        let inner = self.lock();
        let live = self.events.subscribe();
        let objects = inner.objects_of(storage_key, namespace);
        (
            objects,
            WatchStart {
                replay: Vec::new(),
                live,
                revision: inner.revision,
            },
        )
    }

    /// Forgets every object and the history (an API server whose etcd was wiped). The revision
    /// keeps increasing, so clients never see a version go backwards.
    pub fn wipe(&self) {
        let mut inner = self.lock();
        inner.objects.clear();
        inner.history.clear();
        inner.compacted = inner.revision;
    }

    /// Forgets the history (a restart of the server that keeps its objects, or a compaction):
    /// every resumed watch older than now gets 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.revision;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> ObjectKey {
        ("/configmaps".into(), "default".into(), name.into())
    }

    fn put(store: &Store, name: &str, data: &str) -> Arc<Value> {
        store
            .commit::<()>(&key(name), |_| {
                Ok(Some(
                    json!({"metadata": {"name": name}, "data": {"k": data}}),
                ))
            })
            .unwrap()
            .unwrap()
    }

    #[test]
    fn revisions_increase_and_no_op_writes_are_skipped() {
        let store = Store::default();
        let first = put(&store, "a", "1");
        let rv1: u64 = first["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let same = put(&store, "a", "1");
        assert_eq!(
            same["metadata"]["resourceVersion"],
            first["metadata"]["resourceVersion"]
        );
        let changed = put(&store, "a", "2");
        let rv2: u64 = changed["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv2 > rv1);
        assert_eq!(store.revision(), rv2);
    }

    #[test]
    fn watches_replay_in_commit_order_then_go_live() {
        let store = Store::default();
        let start = store.revision();
        put(&store, "a", "1");
        put(&store, "b", "1");
        store.commit::<()>(&key("a"), |_| Ok(None)).unwrap();
        let watch = store.watch_from(Some(start)).unwrap();
        let kinds: Vec<(EventType, String)> = watch
            .replay
            .iter()
            .map(|e| {
                (
                    e.kind,
                    e.object["metadata"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (EventType::Added, "a".into()),
                (EventType::Added, "b".into()),
                (EventType::Deleted, "a".into())
            ]
        );
        let mut live = watch.live;
        put(&store, "c", "1");
        assert_eq!(live.try_recv().unwrap().object["metadata"]["name"], "c");
    }

    #[test]
    fn compacted_history_answers_gone() {
        let store = Store::default();
        put(&store, "a", "1");
        store.compact();
        assert!(store.watch_from(Some(1)).is_err());
        assert!(store.watch_from(Some(store.revision())).is_ok());
        assert!(store.watch_from(None).is_ok());
    }
}
