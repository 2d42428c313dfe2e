//! What csi-snapshotter writes to the contents it serves, VolumeSnapshotContents
//! ([`crate::sidecar`]) and VolumeGroupSnapshotContents ([`crate::group_sidecar`]) alike: the
//! being-created annotation, status patches, a failure recorded once in the status with its
//! Warning Event, and the polls of contents whose snapshot is not ready yet. Every write is
//! remembered as superseding the cached version, so a sync that still reads that version waits
//! for the watch to bring the write (a stale cache does not cut a snapshot twice).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::lock;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::Synced;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::sidecar::{SyncError, now};

/// A kind of content the sidecar serves.
pub(crate) trait Content:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Its being-created annotation.
    const BEING_CREATED: &'static str;

    /// The failure its status records.
    fn recorded_error(&self) -> Option<&str>;
}

pub(crate) struct ContentWrites<K: Content> {
    client: Client,
    events: EventRecorder,
    /// Content → the resourceVersion our last write replaced.
    superseded: Superseded<ObjectRef<K>>,
    /// Contents not ready yet → the wait before asking the driver again (doubling, as
    /// upstream's rate-limited requeue).
    polls: Mutex<HashMap<ObjectRef<K>, Duration>>,
    retry_start: Duration,
    retry_max: Duration,
}

impl<K: Content> ContentWrites<K> {
    pub fn new(client: Client, driver: &str, retry_start: Duration, retry_max: Duration) -> Self {
        Self {
            events: EventRecorder::new(client.clone(), format!("csi-snapshotter {driver}"), ""),
            client,
            superseded: Superseded::default(),
            polls: Mutex::default(),
            retry_start,
            retry_max,
        }
    }

    fn api(&self) -> Api<K> {
        Api::all(self.client.clone())
    }

    /// Whether the cache still shows a version one of our writes replaced.
    pub fn is_stale(&self, key: &ObjectRef<K>, content: &K) -> bool {
        self.superseded
            .is_stale(key, content.resource_version().as_deref())
    }

    /// The content is gone.
    pub fn forget(&self, key: &ObjectRef<K>) {
        self.superseded.forget(key);
        lock(&self.polls).remove(key);
    }

    /// Done when ready; otherwise asked again after a doubling wait.
    pub fn poll(&self, key: &ObjectRef<K>, ready: bool) -> Synced {
        let mut polls = lock(&self.polls);
        if ready {
            polls.remove(key);
            return Synced::Done;
        }
        let wait = polls
            .get(key)
            .map_or(self.retry_start, |w| (*w * 2).min(self.retry_max));
        polls.insert(key.clone(), wait);
        Synced::After(wait)
    }

    fn superseded_by(&self, old: &K, new: &K) {
        self.superseded.wrote(ObjectRef::from_obj(old), old, new);
    }

    fn update_error(content: &K) -> impl FnOnce(kube::Error) -> SyncError + '_ {
        move |source| SyncError::Update {
            content: content.name_any(),
            source,
        }
    }

    /// Adds (or removes) the being-created annotation; the content as written.
    pub async fn set_being_created(&self, content: &K, on: bool) -> Result<K, SyncError> {
        if content.annotations().contains_key(K::BEING_CREATED) == on {
            return Ok(content.clone());
        }
        let value = if on { json!("yes") } else { Value::Null };
        let patch = json!({"metadata": {"annotations": {K::BEING_CREATED: value}}});
        let updated = self
            .api()
            .patch(
                &content.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(Self::update_error(content))?;
        self.superseded_by(content, &updated);
        Ok(updated)
    }

    pub async fn patch_status(&self, content: &K, patch: &Value) -> Result<K, SyncError> {
        let updated = self
            .api()
            .patch_status(
                &content.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map_err(Self::update_error(content))?;
        self.superseded_by(content, &updated);
        Ok(updated)
    }

    /// Records a failure in the content's status with a Warning Event (once per message:
    /// the same failure again writes nothing and sends no Event).
    pub async fn record_error(&self, content: &K, reason: &str, message: String) -> SyncError {
        let Some(patch) =
            crate::content::error_status_patch(content.recorded_error(), &message, now())
        else {
            return SyncError::Snapshot(message);
        };
        if let Err(error) = self.patch_status(content, &patch).await {
            tracing::warn!(content = %content.name_any(), %error, "failed to record the error in the content's status");
        }
        self.warn(content, reason, &message).await;
        SyncError::Snapshot(message)
    }

    pub async fn warn(&self, content: &K, reason: &str, message: &str) {
        self.events
            .publish(
                &content.object_ref(&()),
                EventType::Warning,
                reason,
                message,
            )
            .await;
    }
}

impl Content for csi_kinds::snapshot::VolumeSnapshotContent {
    const BEING_CREATED: &'static str = csi_kinds::snapshot::BEING_CREATED;

    fn recorded_error(&self) -> Option<&str> {
        self.status.as_ref()?.error.as_ref()?.message.as_deref()
    }
}

impl Content for csi_kinds::groupsnapshot::VolumeGroupSnapshotContent {
    const BEING_CREATED: &'static str = csi_kinds::groupsnapshot::BEING_CREATED;

    fn recorded_error(&self) -> Option<&str> {
        self.status.as_ref()?.error.as_ref()?.message.as_deref()
    }
}
