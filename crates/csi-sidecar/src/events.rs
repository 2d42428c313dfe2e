//! A thin recorder of core/v1 Events, the kind the Go sidecars write (so `kubectl describe`,
//! alerting on reasons, and the upstream RBAC rules all keep working). Like client-go's event
//! correlator, a repeat of the same event on the same object bumps `count` and `lastTimestamp`
//! with one PATCH instead of creating a new Event. Recording never fails the caller: Events are
//! best effort, failures are logged.
//!
//! Recording never waits for the API server either: as client-go's broadcaster, events go to a
//! queue of [`QUEUE_LENGTH`] that one task writes out in order (so a repeat finds the Event it
//! repeats), and an event that finds the queue full is dropped with a warning. A controller's
//! operation is then as long as its own writes, not its writes plus two Events.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use ::kube::Client;
use ::kube::api::{Api, Patch, PatchParams, PostParams};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// The apiserver rejects longer messages in some configurations; upstream truncates too.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Bound of the de-duplication cache (client-go's LRU size).
const CACHE_ENTRIES: usize = 4096;

/// Events waiting to be written (client-go's `maxQueuedEvents`).
pub const QUEUE_LENGTH: usize = 1000;

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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    object_uid: String,
    object_name: String,
    event_type: EventType,
    reason: String,
    message: String,
}

#[derive(Debug, Clone)]
struct Recorded {
    name: String,
    namespace: String,
    count: i32,
}

/// Records Events as one component (`source.component`, e.g. `external-provisioner`).
pub struct EventRecorder {
    queue: mpsc::Sender<Queued>,
    component: String,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

enum Queued {
    Event {
        object: Box<ObjectReference>,
        event_type: EventType,
        reason: String,
        message: String,
    },
    /// Answered once every event queued before it is written.
    Flush(oneshot::Sender<()>),
}

impl EventRecorder {
    /// `host` is the pod's node or host name (`source.host`, `reportingInstance`). Starts the
    /// writing task on the current tokio runtime; it ends when the recorder is dropped, after
    /// writing what is queued.
    pub fn new(client: Client, component: impl Into<String>, host: impl Into<String>) -> Self {
        let component = component.into();
        let (queue, mut queued) = mpsc::channel(QUEUE_LENGTH);
        let mut writer = Writer {
            client,
            component: component.clone(),
            host: host.into(),
            recorded: HashMap::new(),
        };
        tokio::spawn(async move {
            while let Some(item) = queued.recv().await {
                match item {
                    Queued::Event {
                        object,
                        event_type,
                        reason,
                        message,
                    } => writer.write(&object, event_type, &reason, &message).await,
                    Queued::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Self { queue, component }
    }

    /// Records an Event about `object`: queues it and returns. Reasons are the upstream
    /// strings (e.g. `ProvisioningFailed`); messages must already be free of secrets.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let event = Queued::Event {
            object: Box::new(object.clone()),
            event_type,
            reason: reason.to_string(),
            message: message.to_string(),
        };
        if let Err(error) = self.queue.try_send(event) {
            let state = match error {
                mpsc::error::TrySendError::Full(_) => "full",
                mpsc::error::TrySendError::Closed(_) => "closed",
            };
            tracing::warn!(reason, component = %self.component, "event queue {state}: event dropped");
        }
    }

    /// Waits until every event published before has been written (or has failed).
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.queue.send(Queued::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

/// The writing side: the task that owns the de-duplication cache.
struct Writer {
    client: Client,
    component: String,
    host: String,
    recorded: HashMap<EventKey, Recorded>,
}

impl Writer {
    async fn write(
        &mut self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let message = truncate(message, MAX_MESSAGE_BYTES);
        let key = EventKey {
            object_uid: object.uid.clone().unwrap_or_default(),
            object_name: object.name.clone().unwrap_or_default(),
            event_type,
            reason: reason.to_string(),
            message: message.clone(),
        };
        let now = Timestamp::now();
        let previous = self.recorded.get(&key).cloned();
        if let Some(previous) = previous {
            let count = previous.count + 1;
            let api: Api<Event> = Api::namespaced(self.client.clone(), &previous.namespace);
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(now)});
            match api
                .patch(
                    &previous.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    self.remember(key, Recorded { count, ..previous });
                    return;
                }
                // Expired or deleted (Events have a TTL): record a new one below.
                Err(::kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, reason, "failed to update event");
                    return;
                }
            }
        }
        let event = self.new_event(object, event_type, reason, &message, now);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => self.remember(
                key,
                Recorded {
                    name,
                    namespace,
                    count: 1,
                },
            ),
            Err(error) => tracing::warn!(%error, reason, "failed to record event"),
        }
    }

    fn new_event(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) -> Event {
        // Cluster-scoped objects (PVs, Nodes) get their Events in "default", as client-go does.
        let namespace = object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let object_name = object.name.clone().unwrap_or_default();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{object_name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(event_type.as_str().to_string()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
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

    fn remember(&mut self, key: EventKey, recorded: Recorded) {
        if self.recorded.len() >= CACHE_ENTRIES && !self.recorded.contains_key(&key) {
            self.recorded.clear();
        }
        self.recorded.insert(key, recorded);
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
}
