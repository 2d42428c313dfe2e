//! A thin recorder of core/v1 Events, the kind the Go sidecars write (so `kubectl describe`,
//! alerting on reasons, and the upstream RBAC rules all keep working). Like client-go's event
//! correlator, a repeat of the same event on the same object (same type, reason and message)
//! bumps `count` and `lastTimestamp` with one PATCH instead of creating a new Event. Recording
//! never fails the caller: Events are best effort, write failures are logged.
//!
//! Recording does not wait for the API server either: [`EventRecorder::publish`] stamps the
//! event with the time it happened and puts it in a queue of [`QUEUE_LENGTH`] (client-go's
//! `maxQueuedEvents`), and one task writes the queue out, up to `WRITES_IN_FLIGHT` Events at
//! once. Writing one at a time could not keep up: a 1000-claim burst of csi-provisioner (about
//! 2000 Events in a few seconds) filled the queue, and over half of the Events were dropped,
//! each write costing a round trip. Writes for different objects overlap; the events of one
//! object are written in order, so a repeat finds the Event its first occurrence created.
//! Repeats that wait behind a write on their object are folded into one write, with the count
//! bumped by how many they are.
//!
//! When the queue is full all the same (the API server takes Events slower than they come):
//! - a Warning waits for room: it reports a failure someone must see, so it is never dropped;
//! - a Normal waits for room up to `FULL_QUEUE_WAIT`. A burst never needs that long, since
//!   room frees up every few milliseconds while the server answers; a queue that stays full
//!   means the writes are stuck, and the controller must not stall behind them. The Normal is
//!   then dropped, and so is every Normal after it, at once, until one finds room again.
//!   Drops are counted ([`EventRecorder::dropped`]) and logged, the first and every
//!   `DROP_LOG_EVERY`th.
//!
//! Memory stays bounded: the queue, the writes in flight, up to `PARKED_LENGTH` events waiting
//! behind a write on their object, and a de-duplication cache of `CACHE_ENTRIES`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc::error::{SendTimeoutError, TrySendError};
use tokio::sync::{mpsc, oneshot};

use ::kube::Client;
use ::kube::api::{Patch, PatchParams, PostParams};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// The apiserver rejects longer messages in some configurations; upstream truncates too.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Bound of the de-duplication cache (client-go's LRU size).
const CACHE_ENTRIES: usize = 4096;

/// Events waiting to be written (client-go's `maxQueuedEvents`).
pub const QUEUE_LENGTH: usize = 1000;

/// Events written at once, each about a different object. Draining 2000 Events into kube-sim
/// with 5 ms of latency per request took 15.4 s one at a time, 2.1 s with 8 in flight, 1.2 s
/// with 16, 0.85 s with 32 and 0.8 s with 64 (2 cores, debug build: 32 reaches the CPU bound;
/// 64 only helps from about 20 ms of latency). Over TLS they share the client's one HTTP/2
/// connection; under a client-side limit (`--kube-api-qps`), they can hold this many tokens
/// ahead of the controller's own requests.
const WRITES_IN_FLIGHT: usize = 32;

/// Events held back behind a write on their object (beyond that, the queue waits).
const PARKED_LENGTH: usize = QUEUE_LENGTH;

/// How long a Normal event waits for room in a full queue before it is dropped.
const FULL_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Dropped events are logged once per this many.
const DROP_LOG_EVERY: u64 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// The object an Event is about; its events are written in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    kind: String,
    namespace: String,
    name: String,
    uid: String,
}

impl ObjectKey {
    fn of(object: &ObjectReference) -> Self {
        Self {
            kind: object.kind.clone().unwrap_or_default(),
            namespace: object.namespace.clone().unwrap_or_default(),
            name: object.name.clone().unwrap_or_default(),
            uid: object.uid.clone().unwrap_or_default(),
        }
    }
}

/// What makes two events repeats of each other (client-go's correlator key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    object: ObjectKey,
    event_type: EventType,
    reason: String,
    message: String,
}

/// The Event written for a key, for its repeats to patch.
#[derive(Debug, Clone, PartialEq)]
struct Recorded {
    name: String,
    namespace: String,
    count: i32,
}

/// A published event, or several repeats of it folded together.
#[derive(Debug)]
struct Pending {
    key: EventKey,
    object: ObjectReference,
    occurrences: i32,
    first: Timestamp,
    last: Timestamp,
}

enum Queued {
    Event(Box<Pending>),
    /// Answered once every event queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// Records Events as one component (`source.component`, e.g. `external-provisioner`).
pub struct EventRecorder {
    queue: mpsc::Sender<Queued>,
    component: String,
    dropped: AtomicU64,
    /// A Normal found the queue full for `FULL_QUEUE_WAIT`: the next ones do not wait.
    stalled: AtomicBool,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// `host` is the pod's node or host name (`source.host`, `reportingInstance`). Starts the
    /// writing task on the current tokio runtime; it ends when the recorder is dropped, after
    /// writing what is queued.
    pub fn new(client: Client, component: impl Into<String>, host: impl Into<String>) -> Self {
        let component = component.into();
        let (queue, queued) = mpsc::channel(QUEUE_LENGTH);
        let sink = Arc::new(Sink {
            client,
            component: component.clone(),
            host: host.into(),
        });
        tokio::spawn(drain(queued, sink));
        Self {
            queue,
            component,
            dropped: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
        }
    }

    /// Records an Event about `object`: queues it and returns (see the module doc for a full
    /// queue). Reasons are the upstream strings (e.g. `ProvisioningFailed`); messages must
    /// already be free of secrets.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let now = Timestamp::now();
        let event = Queued::Event(Box::new(Pending {
            key: EventKey {
                object: ObjectKey::of(object),
                event_type,
                reason: reason.to_string(),
                message: truncate(message, MAX_MESSAGE_BYTES),
            },
            object: object.clone(),
            occurrences: 1,
            first: now,
            last: now,
        }));
        let queued = match event_type {
            EventType::Warning => self.queue.send(event).await.map_err(|_| "closed"),
            EventType::Normal => self.queue_normal(event).await,
        };
        if let Err(state) = queued {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if (dropped - 1).is_multiple_of(DROP_LOG_EVERY) {
                tracing::warn!(
                    reason,
                    component = %self.component,
                    dropped,
                    "event queue {state}: event dropped"
                );
            }
        }
    }

    /// Queues a Normal event: waits for room up to `FULL_QUEUE_WAIT`, not at all while the
    /// queue is stalled.
    async fn queue_normal(&self, event: Queued) -> Result<(), &'static str> {
        let event = match self.queue.try_send(event) {
            Ok(()) => {
                if self.stalled.load(Ordering::Relaxed) {
                    self.stalled.store(false, Ordering::Relaxed);
                }
                return Ok(());
            }
            Err(TrySendError::Closed(_)) => return Err("closed"),
            Err(TrySendError::Full(_)) if self.stalled.load(Ordering::Relaxed) => {
                return Err("full");
            }
            Err(TrySendError::Full(event)) => event,
        };
        match self.queue.send_timeout(event, FULL_QUEUE_WAIT).await {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Timeout(_)) => {
                self.stalled.store(true, Ordering::Relaxed);
                Err("full")
            }
            Err(SendTimeoutError::Closed(_)) => Err("closed"),
        }
    }

    /// Waits until every event published before has been written (or has failed).
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.queue.send(Queued::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }

    /// How many events were dropped so far (Normals that found the queue full, or events
    /// published after the writing task ended).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The writing task: takes events from the queue while [`Drain`] has room, and writes them.
async fn drain(mut queued: mpsc::Receiver<Queued>, sink: Arc<Sink>) {
    let mut state = Drain::default();
    let mut writes = FuturesUnordered::new();
    let mut open = true;
    loop {
        let next = tokio::select! {
            item = queued.recv(), if open && state.has_room() => match item {
                Some(Queued::Event(event)) => state.receive(event),
                Some(Queued::Flush(done)) => {
                    state.flush(done);
                    None
                }
                None => {
                    open = false;
                    None
                }
            },
            Some(written) = writes.next() => state.written(written),
            else => break,
        };
        if let Some(write) = next {
            writes.push(sink.clone().write(write));
        }
    }
}

/// A write to start: the event, and the Event it repeats if one was written.
#[derive(Debug)]
struct Write {
    seq: u64,
    event: Box<Pending>,
    previous: Option<Recorded>,
}

/// A write that ended, and what to remember of it (`None`: leave the cache as it is).
#[derive(Debug)]
struct Written {
    seq: u64,
    key: EventKey,
    recorded: Option<Recorded>,
}

/// What the writing task knows, without its I/O: which objects have a write in flight and
/// what waits behind them, which events are unwritten (for flushes), the de-duplication cache.
#[derive(Debug, Default)]
struct Drain {
    /// One entry per write in flight: its object and the events waiting behind it, in order.
    busy: HashMap<ObjectKey, VecDeque<(u64, Box<Pending>)>>,
    parked: usize,
    /// Sequence numbers of the events received and not yet written.
    unwritten: BTreeSet<u64>,
    received: u64,
    /// Flushes, with how many events were received before each.
    flushes: VecDeque<(u64, oneshot::Sender<()>)>,
    recorded: HashMap<EventKey, Recorded>,
}

impl Drain {
    fn has_room(&self) -> bool {
        self.busy.len() < WRITES_IN_FLIGHT && self.parked < PARKED_LENGTH
    }

    /// Takes an event from the queue: the write to start now, unless its object is busy.
    fn receive(&mut self, event: Box<Pending>) -> Option<Write> {
        let seq = self.received;
        self.received += 1;
        let Some(waiting) = self.busy.get_mut(&event.key.object) else {
            self.busy.insert(event.key.object.clone(), VecDeque::new());
            self.unwritten.insert(seq);
            return Some(self.start(seq, event));
        };
        // A repeat of an event still waiting: one write carries both.
        if let Some((_, same)) = waiting.iter_mut().find(|(_, w)| w.key == event.key) {
            same.occurrences = same.occurrences.saturating_add(event.occurrences);
            same.last = event.last;
            return None;
        }
        waiting.push_back((seq, event));
        self.parked += 1;
        self.unwritten.insert(seq);
        None
    }

    fn flush(&mut self, done: oneshot::Sender<()>) {
        self.flushes.push_back((self.received, done));
        self.answer_flushes();
    }

    /// Takes the end of a write: the next write for its object, if one waits.
    fn written(&mut self, written: Written) -> Option<Write> {
        let Written { seq, key, recorded } = written;
        self.unwritten.remove(&seq);
        let next = self.busy.get_mut(&key.object).and_then(VecDeque::pop_front);
        if next.is_none() {
            self.busy.remove(&key.object);
        }
        // Before the next write starts: it may repeat this one.
        if let Some(recorded) = recorded {
            self.remember(key, recorded);
        }
        self.answer_flushes();
        next.map(|(seq, event)| {
            self.parked -= 1;
            self.start(seq, event)
        })
    }

    fn start(&self, seq: u64, event: Box<Pending>) -> Write {
        let previous = self.recorded.get(&event.key).cloned();
        Write {
            seq,
            event,
            previous,
        }
    }

    fn answer_flushes(&mut self) {
        let oldest = self.unwritten.first().copied().unwrap_or(u64::MAX);
        while self
            .flushes
            .front()
            .is_some_and(|(received, _)| *received <= oldest)
            && let Some((_, done)) = self.flushes.pop_front()
        {
            let _ = done.send(());
        }
    }

    fn remember(&mut self, key: EventKey, recorded: Recorded) {
        if self.recorded.len() >= CACHE_ENTRIES && !self.recorded.contains_key(&key) {
            self.recorded.clear();
        }
        self.recorded.insert(key, recorded);
    }
}

/// Where Events are written, and as whom.
struct Sink {
    client: Client,
    component: String,
    host: String,
}

impl Sink {
    async fn write(self: Arc<Self>, write: Write) -> Written {
        let recorded = self.record(&write.event, write.previous).await;
        Written {
            seq: write.seq,
            key: write.event.key,
            recorded,
        }
    }

    /// Patches the Event `previous` names, or creates one when there is none (or it expired).
    async fn record(&self, event: &Pending, previous: Option<Recorded>) -> Option<Recorded> {
        let reason = event.key.reason.as_str();
        if let Some(previous) = previous {
            let count = previous.count.saturating_add(event.occurrences);
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(event.last)});
            let request = events_request(&previous.namespace)
                .patch(
                    &previous.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .map_err(::kube::Error::BuildRequest)
                .map(|request| (request, "patch"));
            match self.send(request).await {
                Ok(_) => return Some(Recorded { count, ..previous }),
                // Expired or deleted (Events have a TTL): record a new one below.
                Err(::kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, reason, "failed to update event");
                    return None;
                }
            }
        }
        let created = self.new_event(event);
        let namespace = created.metadata.namespace.clone().unwrap_or_default();
        let name = created.metadata.name.clone().unwrap_or_default();
        let request = serde_json::to_vec(&created)
            .map_err(::kube::Error::SerdeError)
            .and_then(|body| {
                events_request(&namespace)
                    .create(&PostParams::default(), body)
                    .map_err(::kube::Error::BuildRequest)
            })
            .map(|request| (request, "create"));
        match self.send(request).await {
            Ok(_) => Some(Recorded {
                name,
                namespace,
                count: event.occurrences,
            }),
            Err(error) => {
                tracing::warn!(%error, reason, "failed to record event");
                None
            }
        }
    }

    /// Sends an Event write; the Event the server answers with is not parsed (nothing reads
    /// it, and a burst writes thousands).
    async fn send(
        &self,
        request: Result<(http::Request<Vec<u8>>, &'static str), ::kube::Error>,
    ) -> Result<(), ::kube::Error> {
        let (mut request, verb) = request?;
        request.extensions_mut().insert(verb);
        self.client.request::<Unread>(request).await.map(|_| ())
    }

    fn new_event(&self, event: &Pending) -> Event {
        let object = &event.object;
        // Cluster-scoped objects (PVs, Nodes) get their Events in "default", as client-go does.
        let namespace = object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let object_name = object.name.clone().unwrap_or_default();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{object_name}.{:x}", event.first.as_nanosecond())),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(event.key.reason.clone()),
            message: Some(event.key.message.clone()),
            type_: Some(event.key.event_type.as_str().to_string()),
            count: Some(event.occurrences),
            first_timestamp: Some(Time(event.first)),
            last_timestamp: Some(Time(event.last)),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()).filter(|h| !h.is_empty()),
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()).filter(|h| !h.is_empty()),
            ..Event::default()
        }
    }
}

/// Cuts `message` to at most `limit` bytes on a character boundary, marking the cut.
pub fn truncate(message: &str, limit: usize) -> String {
    if message.len() <= limit {
        return message.to_string();
    }
    const MARK: &str = "...";
    let mut end = limit.saturating_sub(MARK.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}

/// Requests on the core/v1 Events of `namespace`.
fn events_request(namespace: &str) -> ::kube::core::Request {
    ::kube::core::Request::new(<Event as ::kube::Resource>::url_path(&(), Some(namespace)))
}

/// An answer skipped unparsed: serde reads past its fields without building them.
#[derive(serde::Deserialize)]
struct Unread {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_limit_and_char_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        let long = "é".repeat(600);
        let cut = truncate(&long, MAX_MESSAGE_BYTES);
        assert!(cut.len() <= MAX_MESSAGE_BYTES);
        assert!(cut.ends_with("..."));
        assert!(cut.trim_end_matches("...").chars().all(|c| c == 'é'));
    }

    /// A Normal event about claim `object`, published at `second`.
    fn event(object: &str, reason: &str, second: i64) -> Box<Pending> {
        let object = ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("apps".into()),
            name: Some(object.into()),
            uid: Some(format!("uid-{object}")),
            ..ObjectReference::default()
        };
        let at = Timestamp::from_second(second).unwrap();
        Box::new(Pending {
            key: EventKey {
                object: ObjectKey::of(&object),
                event_type: EventType::Normal,
                reason: reason.into(),
                message: "message".into(),
            },
            object,
            occurrences: 1,
            first: at,
            last: at,
        })
    }

    fn ended(write: &Write, recorded: Option<Recorded>) -> Written {
        Written {
            seq: write.seq,
            key: write.event.key.clone(),
            recorded,
        }
    }

    fn recorded(name: &str, count: i32) -> Recorded {
        Recorded {
            name: name.into(),
            namespace: "apps".into(),
            count,
        }
    }

    #[test]
    fn objects_are_written_at_once_and_each_object_in_order() {
        let mut drain = Drain::default();
        let a1 = drain.receive(event("a", "Provisioning", 1)).unwrap();
        assert!(drain.receive(event("a", "Provisioned", 2)).is_none());
        let b1 = drain.receive(event("b", "Provisioning", 3)).unwrap();
        assert!(drain.receive(event("b", "Provisioned", 4)).is_none());

        let b2 = drain.written(ended(&b1, None)).unwrap();
        assert_eq!(b2.event.key.object.name, "b");
        assert_eq!(b2.event.key.reason, "Provisioned");
        let a2 = drain.written(ended(&a1, None)).unwrap();
        assert_eq!(a2.event.key.reason, "Provisioned");
        assert!(drain.written(ended(&a2, None)).is_none());
        assert!(drain.written(ended(&b2, None)).is_none());
        assert!(drain.busy.is_empty() && drain.unwritten.is_empty());
        assert_eq!(drain.parked, 0);
    }

    #[test]
    fn a_repeat_patches_the_event_its_first_occurrence_created() {
        let mut drain = Drain::default();
        let first = drain.receive(event("a", "ProvisioningFailed", 1)).unwrap();
        assert_eq!(first.previous, None);
        // Two repeats wait behind the first write, folded into one.
        assert!(drain.receive(event("a", "ProvisioningFailed", 2)).is_none());
        assert!(drain.receive(event("a", "ProvisioningFailed", 3)).is_none());
        assert_eq!(drain.parked, 1);

        let repeat = drain
            .written(ended(&first, Some(recorded("a.1", 1))))
            .unwrap();
        assert_eq!(repeat.previous, Some(recorded("a.1", 1)));
        assert_eq!(repeat.event.occurrences, 2);
        assert_eq!(repeat.event.first, Timestamp::from_second(2).unwrap());
        assert_eq!(repeat.event.last, Timestamp::from_second(3).unwrap());
        assert!(
            drain
                .written(ended(&repeat, Some(recorded("a.1", 3))))
                .is_none()
        );

        // A later repeat patches the same Event again.
        let later = drain.receive(event("a", "ProvisioningFailed", 4)).unwrap();
        assert_eq!(later.previous, Some(recorded("a.1", 3)));
    }

    #[test]
    fn a_failed_write_leaves_the_cache_as_it_was() {
        let mut drain = Drain::default();
        let first = drain.receive(event("a", "Attached", 1)).unwrap();
        drain.written(ended(&first, Some(recorded("a.1", 1))));
        let failed = drain.receive(event("a", "Attached", 2)).unwrap();
        drain.written(ended(&failed, None));
        let next = drain.receive(event("a", "Attached", 3)).unwrap();
        assert_eq!(next.previous, Some(recorded("a.1", 1)));
    }

    #[test]
    fn a_flush_waits_for_the_events_before_it_only() {
        let mut drain = Drain::default();
        let (done, mut idle) = oneshot::channel();
        drain.flush(done);
        assert_eq!(idle.try_recv(), Ok(()), "nothing to wait for");

        let a = drain.receive(event("a", "Provisioning", 1)).unwrap();
        assert!(drain.receive(event("a", "Provisioned", 2)).is_none());
        let b = drain.receive(event("b", "Provisioning", 3)).unwrap();
        let (done, mut flushed) = oneshot::channel();
        drain.flush(done);
        let c = drain.receive(event("c", "Provisioning", 4)).unwrap();

        let a2 = drain.written(ended(&a, None)).unwrap();
        drain.written(ended(&b, None));
        assert!(flushed.try_recv().is_err(), "a's second event is unwritten");
        drain.written(ended(&a2, None));
        assert_eq!(flushed.try_recv(), Ok(()), "c came after the flush");
        drain.written(ended(&c, None));
    }

    #[test]
    fn writes_in_flight_are_bounded() {
        let mut drain = Drain::default();
        let writes: Vec<Write> = (0..WRITES_IN_FLIGHT)
            .map(|i| drain.receive(event(&format!("c{i}"), "Provisioning", 1)))
            .collect::<Option<_>>()
            .unwrap();
        assert!(!drain.has_room());
        drain.written(ended(&writes[0], None));
        assert!(drain.has_room());
    }
}
