//! Watch: initial ADDED events (no resourceVersion, or "0"), resumption from a resourceVersion
//! (ERROR 410 when the history no longer reaches it), selector moves turned into
//! ADDED/DELETED as the watch cache does, bookmarks, timeoutSeconds, and disconnection of a
//! watcher that falls behind (k8s.io/apiserver/pkg/storage/cacher).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::{Filters, Server, stream_body};
use crate::conversion;
use crate::errors::ApiError;
use crate::resources::ResourceType;
use crate::store::{Event, EventType};

/// kube-apiserver's default watch timeout is randomized around --min-request-timeout (1800 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How often bookmarks are sent to watchers that allow them by default (kube-apiserver: about
/// a minute; shorter here so short-lived clients see them).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

struct Watcher {
    storage_key: String,
    namespace: Option<String>,
    filters: Filters,
    rt: ResourceType,
}

impl Watcher {
    fn wants(&self, event: &Event) -> Option<(&'static str, Arc<Value>)> {
        if event.storage_key != self.storage_key
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != event.namespace)
        {
            return None;
        }
        let now = self.filters.matches(&event.object);
        let kind = match event.kind {
            EventType::Added => now.then_some("ADDED"),
            EventType::Deleted => now.then_some("DELETED"),
            EventType::Modified => {
                let before = event
                    .previous
                    .as_ref()
                    .is_some_and(|p| self.filters.matches(p));
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        }?;
        let object = match conversion::to_served(&self.rt, &event.object) {
            Cow::Borrowed(_) => event.object.clone(),
            Cow::Owned(converted) => Arc::new(converted),
        };
        Some((kind, object))
    }

    fn bookmark(&self, revision: u64) -> Value {
        json!({"type": "BOOKMARK", "object": {
            "kind": self.rt.kind, "apiVersion": self.rt.api_version(),
            "metadata": {"resourceVersion": revision.to_string()}
        }})
    }
}

fn line(value: &Value) -> Bytes {
    let mut text = serde_json::to_vec(value).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

pub(super) fn serve(
    server: Arc<Server>,
    rt: ResourceType,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let watcher = Watcher {
        storage_key: rt.storage_key(),
        namespace,
        filters: Filters::parse(&rt, query)?,
        rt,
    };
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true" || v == "1");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    let requested = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0");
    let (initial, start) = match requested {
        None => {
            let (objects, start) = server
                .store
                .snapshot_and_watch(&watcher.storage_key, watcher.namespace.as_deref());
            (objects, start)
        }
        Some(version) => {
            let from: u64 = version.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {version:?}"))
            })?;
            match server.store.watch_from(Some(from)) {
                Ok(start) => (Vec::new(), start),
                Err(oldest) => {
                    // Too old: one ERROR event carrying a 410 Status, then the end.
                    let status =
                        ApiError::gone(format!("too old resource version: {from} ({oldest})"))
                            .status();
                    let body = futures::stream::iter([Ok(line(
                        &json!({"type": "ERROR", "object": status}),
                    ))]);
                    return Ok(stream_body(body));
                }
            }
        }
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let cancelled = server.watch_token();
    let bookmark_interval = server.bookmark_interval();
    tokio::spawn(async move {
        let mut revision = start.revision;
        for object in initial.iter().filter(|o| watcher.filters.matches(o)) {
            let object = conversion::to_served(&watcher.rt, object);
            if sender
                .send(line(&json!({"type": "ADDED", "object": &*object})))
                .await
                .is_err()
            {
                return;
            }
        }
        for event in &start.replay {
            revision = event.revision;
            if let Some((kind, object)) = watcher.wants(event)
                && sender
                    .send(line(&json!({"type": kind, "object": &*object})))
                    .await
                    .is_err()
            {
                return;
            }
        }
        let mut live = start.live;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_interval);
        ticker.tick().await;
        loop {
            let message = tokio::select! {
                () = cancelled.cancelled() => return,
                () = &mut deadline => return,
                _ = ticker.tick() => {
                    if bookmarks && sender.send(line(&watcher.bookmark(revision))).await.is_err() {
                        return;
                    }
                    continue;
                }
                received = live.recv() => received,
            };
            match message {
                Ok(event) => {
                    revision = event.revision;
                    if let Some((kind, object)) = watcher.wants(&event)
                        && sender
                            .send(line(&json!({"type": kind, "object": &*object})))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                // Fell behind: disconnect; the client resumes from its last resourceVersion.
                Err(
                    broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed,
                ) => return,
            }
        }
    });
    Ok(stream_body(ReceiverStream::new(receiver).map(Ok)))
}
