//! Object storage with kube-apiserver's versioning: one global, monotonically increasing
//! resourceVersion (etcd's revision); every committed change is an event kept in a bounded
//! history (so watches resume from a resourceVersion) and fanned out to live watches in commit
//! order. A watch asking for a version older than the history answers 410 Gone, as after an
//! etcd compaction. Lists read the objects as of an older revision by undoing the newer
//! history, as etcd serves reads at any revision it has not compacted
//! (https://etcd.io/docs/v3.5/learning/data_model/).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;

use serde_json::Value;
use tokio::sync::broadcast;

/// How many events the history keeps for watch resumption.
pub const HISTORY: usize = 50_000;

/// Per-watch buffer: a watcher that falls this many events behind is disconnected
/// (kube-apiserver closes slow watchers instead of blocking writers). Also the store's fan-out
/// buffer.
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
    pub name: String,
    pub kind: EventType,
    /// The object after the change (for deletions, its last state).
    pub object: Arc<Value>,
    /// The object before the change (modifications and deletions): to turn selector moves
    /// into ADDED/DELETED as the watch cache does, and to read older revisions.
    pub previous: Option<Arc<Value>>,
    /// The object's JSON, encoded once for every watcher that sends it.
    encoded: Arc<OnceLock<Bytes>>,
}

impl Event {
    /// The object as JSON bytes.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(serde_json::to_vec(&*self.object).unwrap_or_default()))
            .clone()
    }
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
    /// The keys of the objects that name each owner uid in their ownerReferences: the
    /// garbage collector's dependency graph (pkg/controller/garbagecollector/graph.go), so
    /// that a delete finds its dependents without scanning every object.
    dependents: HashMap<String, BTreeSet<ObjectKey>>,
}

/// The owner uids an object's ownerReferences name.
fn owner_uids(object: &Value) -> impl Iterator<Item = &str> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
}

impl Inner {
    /// Keeps the owner index in step with `key` going from `before` to `after`.
    fn index_owners(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        for uid in before.into_iter().flat_map(owner_uids) {
            if let Some(keys) = self.dependents.get_mut(uid) {
                keys.remove(key);
                if keys.is_empty() {
                    self.dependents.remove(uid);
                }
            }
        }
        for uid in after.into_iter().flat_map(owner_uids) {
            self.dependents
                .entry(uid.to_string())
                .or_default()
                .insert(key.clone());
        }
    }

    /// The objects of one resource (and namespace), in key order: a range of the map, not a
    /// scan of every resource.
    fn range<'a>(
        &'a self,
        storage_key: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        let start = (
            storage_key.to_string(),
            namespace.unwrap_or_default().to_string(),
            String::new(),
        );
        self.objects
            .range(start..)
            .take_while(move |((key, ns, _), _)| {
                key == storage_key && namespace.is_none_or(|n| n == ns)
            })
    }

    fn objects_of(&self, storage_key: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.range(storage_key, namespace)
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// The objects as they were at `revision`: the current ones, with every key changed since
    /// put back to its state before its first later change. `Err(oldest)` when the history no
    /// longer reaches back that far.
    fn objects_at(
        &self,
        storage_key: &str,
        namespace: Option<&str>,
        revision: u64,
    ) -> Result<Vec<Arc<Value>>, u64> {
        if revision < self.compacted {
            return Err(self.compacted + 1);
        }
        let newer = self.history.partition_point(|e| e.revision <= revision);
        let mut before: BTreeMap<(&str, &str), Option<&Arc<Value>>> = BTreeMap::new();
        for event in self.history.range(newer..) {
            if event.storage_key == storage_key && namespace.is_none_or(|n| n == event.namespace) {
                before
                    .entry((event.namespace.as_str(), event.name.as_str()))
                    .or_insert(match event.kind {
                        EventType::Added => None,
                        EventType::Modified | EventType::Deleted => event.previous.as_ref(),
                    });
            }
        }
        if before.is_empty() {
            return Ok(self.objects_of(storage_key, namespace));
        }
        let mut objects: BTreeMap<(&str, &str), &Arc<Value>> = self
            .range(storage_key, namespace)
            .map(|((_, ns, name), object)| ((ns.as_str(), name.as_str()), object))
            .collect();
        for (key, object) in before {
            match object {
                Some(object) => objects.insert(key, object),
                None => objects.remove(&key),
            };
        }
        Ok(objects.into_values().cloned().collect())
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
                dependents: HashMap::new(),
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

    /// Objects of one resource (and namespace) as of `revision` (at most the current one), in
    /// key order. `Err(oldest)` when that revision is compacted.
    pub fn list_at(
        &self,
        storage_key: &str,
        namespace: Option<&str>,
        revision: u64,
    ) -> Result<Vec<Arc<Value>>, u64> {
        self.lock().objects_at(storage_key, namespace, revision)
    }

    /// Waits until the store's revision reaches `revision`, at most `timeout`; false if it
    /// did not (the watch cache's wait for a fresh enough state).
    pub async fn wait_for(&self, revision: u64, timeout: std::time::Duration) -> bool {
        let mut live = self.events.subscribe();
        let reached = async {
            while self.revision() < revision {
                if let Err(broadcast::error::RecvError::Closed) = live.recv().await {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, reached).await.is_ok()
    }

    /// The objects whose ownerReferences name `uid`.
    pub fn dependents(&self, uid: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        let inner = self.lock();
        inner
            .dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|key| Some((key.clone(), inner.objects.get(key)?.clone())))
            .collect()
    }

    /// Every object of every resource.
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
            inner.index_owners(key, Some(&previous), None);
            let revision = Self::bump(&mut inner);
            let mut last = (*previous).clone();
            last["metadata"]["resourceVersion"] = Value::String(revision.to_string());
            let last = Arc::new(last);
            self.record(
                &mut inner,
                key,
                EventType::Deleted,
                last.clone(),
                Some(previous),
                revision,
            );
            return Ok(Some(last));
        };
        // A change that changes nothing is not a write (no new resourceVersion, no event;
        // k8s.io/apiserver/pkg/storage/etcd3/store.go GuaranteedUpdate).
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
        inner.index_owners(key, current.as_deref(), Some(&next));
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
            name: key.2.clone(),
            kind,
            object,
            previous,
            encoded: Arc::default(),
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
    /// longer reaches back that far, answered as 410 Gone
    /// (https://kubernetes.io/docs/reference/using-api/api-concepts/#410-gone-responses).
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
        inner.dependents.clear();
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
    fn older_revisions_are_reconstructed_from_the_history() {
        let store = Store::default();
        put(&store, "a", "1");
        put(&store, "b", "1");
        let at = store.revision();
        put(&store, "a", "2");
        store.commit::<()>(&key("b"), |_| Ok(None)).unwrap();
        put(&store, "c", "1");
        let data = |objects: Vec<Arc<Value>>| -> Vec<(String, String)> {
            objects
                .iter()
                .map(|o| {
                    (
                        o["metadata"]["name"].as_str().unwrap().to_string(),
                        o["data"]["k"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let then = store.list_at("/configmaps", Some("default"), at).unwrap();
        assert_eq!(
            data(then),
            [("a".into(), "1".into()), ("b".into(), "1".into())]
        );
        let now = store
            .list_at("/configmaps", None, store.revision())
            .unwrap();
        assert_eq!(
            data(now),
            [("a".into(), "2".into()), ("c".into(), "1".into())]
        );
        assert!(store.list_at("/configmaps", None, 1).unwrap().is_empty());
        store.compact();
        assert!(store.list_at("/configmaps", None, at).is_err());
    }

    #[test]
    fn dependents_follow_owner_references() {
        let store = Store::default();
        let owned =
            |owner: &str| json!({"metadata": {"name": "d", "ownerReferences": [{"uid": owner}]}});
        store
            .commit::<()>(&key("d"), |_| Ok(Some(owned("u1"))))
            .unwrap();
        assert_eq!(store.dependents("u1").len(), 1);
        store
            .commit::<()>(&key("d"), |_| Ok(Some(owned("u2"))))
            .unwrap();
        assert!(store.dependents("u1").is_empty());
        assert_eq!(store.dependents("u2")[0].0, key("d"));
        store.commit::<()>(&key("d"), |_| Ok(None)).unwrap();
        assert!(store.dependents("u2").is_empty());
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
