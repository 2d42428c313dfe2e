//! Watch: initial ADDED events (no resourceVersion, or "0"), resumption from a resourceVersion
//! (ERROR 410 when the history no longer reaches it), selector moves turned into
//! ADDED/DELETED as the watch cache does, bookmarks, timeoutSeconds, and disconnection of a
//! watcher that falls behind (k8s.io/apiserver/pkg/storage/cacher).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
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

/// kube-apiserver's default watch timeout is randomized around --min-request-timeout (1800 s;
/// k8s.io/apiserver/pkg/endpoints/handlers/get.go ListResource).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How often bookmarks are sent to watchers that allow them by default (kube-apiserver: about
/// a minute; shorter here so short-lived clients see them;
/// https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// Lines handed to the HTTP body ahead of the client; the watcher's own buffer is the bound.
const CHANNEL: usize = 16;

struct Watcher {
    storage_key: String,
    namespace: Option<String>,
    filters: Filters,
    rt: ResourceType,
}

impl Watcher {
    /// The watch event line for a committed change, if this watcher sees it: a change that
    /// moves an object into or out of the selectors is ADDED or DELETED
    /// (k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go convertToWatchEvent).
    fn line_for(&self, event: &Event) -> Option<Bytes> {
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
        // Every watcher of the stored version shares one encoding of the object.
        let object = match conversion::to_served(&self.rt, &event.object) {
            Cow::Borrowed(_) => event.encoded(),
            Cow::Owned(converted) => encode(&converted),
        };
        Some(event_line(kind, &object))
    }

    fn bookmark(&self, revision: u64) -> Bytes {
        let object = json!({
            "kind": self.rt.kind, "apiVersion": self.rt.api_version(),
            "metadata": {"resourceVersion": revision.to_string()}
        });
        event_line("BOOKMARK", &encode(&object))
    }
}

/// The answer to a watch that resumes from a version older than the server's history: one
/// ERROR event carrying a 410 Status, then the end; the client lists again
/// (https://kubernetes.io/docs/reference/using-api/api-concepts/#410-gone-responses).
pub(crate) fn too_old(from: u64, oldest: u64) -> Response {
    let status = ApiError::gone(format!("too old resource version: {from} ({oldest})")).status();
    stream_body(futures::stream::iter([Ok(event_line(
        "ERROR",
        &encode(&status),
    ))]))
}

fn encode(value: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

/// `{"type":…,"object":…}` and a newline: one watch event of the JSON stream.
fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

pub(super) fn serve(
    server: Arc<Server>,
    rt: ResourceType,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let param = |name: &str| {
        query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    super::list::validate(
        param("resourceVersion"),
        param("resourceVersionMatch"),
        param("sendInitialEvents"),
        param("continue").is_some(),
        true,
    )?;
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
    // No resourceVersion (or "0"): the current state as ADDED events, then changes; else the
    // changes after that version
    // (https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-watch).
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
                Err(oldest) => return Ok(too_old(from, oldest)),
            }
        }
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(CHANNEL);
    let cancelled = server.watch_token();
    let bookmark_interval = server.bookmark_interval();
    let buffer = server.watch_buffer();
    tokio::spawn(async move {
        let mut revision = start.revision;
        // The initial state and the replayed history go out first, as the cacher's watcher
        // sends its init events before the buffered ones.
        let mut pending: VecDeque<Bytes> = initial
            .iter()
            .filter(|o| watcher.filters.matches(o))
            .map(|o| event_line("ADDED", &encode(&conversion::to_served(&watcher.rt, o))))
            .collect();
        for event in &start.replay {
            revision = event.revision;
            pending.extend(watcher.line_for(event));
        }
        // Live events wait here until the client takes them. The buffer is bounded: a
        // watcher that falls `buffer` events behind is terminated, so writers never wait for
        // a slow reader (k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go add(), which
        // stops a watcher whose input buffer stays full).
        let mut queued: VecDeque<Bytes> = VecDeque::new();
        let mut live = start.live;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_interval);
        ticker.tick().await;
        loop {
            let has_output = !pending.is_empty() || !queued.is_empty();
            tokio::select! {
                () = cancelled.cancelled() => return,
                () = &mut deadline => return,
                permit = sender.reserve(), if has_output => {
                    let Ok(permit) = permit else { return };
                    if let Some(line) = pending.pop_front().or_else(|| queued.pop_front()) {
                        permit.send(line);
                    }
                }
                _ = ticker.tick() => {
                    if bookmarks && !has_output {
                        queued.push_back(watcher.bookmark(revision));
                    }
                }
                received = live.recv() => match received {
                    Ok(event) => {
                        revision = event.revision;
                        if let Some(line) = watcher.line_for(&event) {
                            if queued.len() >= buffer {
                                tracing::debug!(buffer, "terminating a watcher that fell behind");
                                return;
                            }
                            queued.push_back(line);
                        }
                    }
                    // Starved of CPU past the store's fan-out buffer: the same as overflowing.
                    Err(
                        broadcast::error::RecvError::Lagged(_)
                        | broadcast::error::RecvError::Closed,
                    ) => return,
                },
            }
        }
    });
    Ok(stream_body(ReceiverStream::new(receiver).map(Ok)))
}
