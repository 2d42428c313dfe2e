//! The csi-snapshotter sidecar's pure core (external-snapshotter `pkg/sidecar-controller`):
//! what one VolumeSnapshotContent of our driver needs next, and the status a CSI answer turns
//! into. The adapter ([`crate::sidecar`]) only matches the plan and acts.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::secrets::{CONTENT_NAME_KEY, SNAPSHOT_NAME_KEY, SNAPSHOT_NAMESPACE_KEY};
use csi_kinds::snapshot::{
    BEING_CREATED, BEING_DELETED, CONTENT_BOUND_FINALIZER, DeletionPolicy, GROUP_SNAPSHOT_HANDLE,
    SnapshotError, VolumeSnapshotContent, VolumeSnapshotContentStatus,
};

/// What a content needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPlan {
    /// Another driver's content.
    NotOurs,
    /// Nothing to do at this version.
    Nothing,
    /// Its snapshot is being deleted: DeleteSnapshot first when `delete` names the handle
    /// (policy Delete and a cut snapshot), then the bound finalizer goes (`remove_finalizer`).
    Delete {
        delete: Option<String>,
        remove_finalizer: bool,
    },
    /// Cut the snapshot with CreateSnapshot (dynamic; also to learn whether a cut snapshot is
    /// ready yet: the call is idempotent by name).
    Create,
    /// A pre-provisioned snapshot: ListSnapshots tells whether it exists and is ready.
    Refresh { snapshot_handle: String },
    /// Ready: the being-created annotation is left to remove.
    ClearBeingCreated,
}

fn annotations(content: &VolumeSnapshotContent) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    content.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

fn has_finalizer(content: &VolumeSnapshotContent) -> bool {
    content
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CONTENT_BOUND_FINALIZER)
}

pub fn is_ready(content: &VolumeSnapshotContent) -> bool {
    content
        .status
        .as_ref()
        .and_then(|s| s.ready_to_use)
        .unwrap_or(false)
}

/// Upstream `shouldDelete`: the content is being deleted and either it is an unbound
/// pre-provisioned one, or its snapshot is being deleted — but never while CreateSnapshot may
/// still be cutting it (that would leak the snapshot).
pub fn should_delete(content: &VolumeSnapshotContent) -> bool {
    if content.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let unbound = content
        .spec
        .volume_snapshot_ref
        .uid
        .as_deref()
        .unwrap_or("")
        .is_empty();
    if content.spec.source.snapshot_handle.is_some() && unbound {
        return true;
    }
    let annotations = annotations(content);
    !annotations.contains_key(BEING_CREATED) && annotations.contains_key(BEING_DELETED)
}

/// Upstream `syncContent` of the sidecar.
pub fn plan(content: &VolumeSnapshotContent, driver: &str) -> ContentPlan {
    if content.spec.driver != driver {
        return ContentPlan::NotOurs;
    }
    let status = content.status.as_ref();
    if should_delete(content) {
        let delete = match status {
            Some(s)
                if content.spec.deletion_policy == DeletionPolicy::Delete
                    && s.volume_group_snapshot_handle.is_none() =>
            {
                s.snapshot_handle.clone()
            }
            _ => None,
        };
        let remove_finalizer = has_finalizer(content);
        return if delete.is_none() && !remove_finalizer {
            ContentPlan::Nothing
        } else {
            ContentPlan::Delete {
                delete,
                remove_finalizer,
            }
        };
    }
    let group_member = annotations(content).contains_key(GROUP_SNAPSHOT_HANDLE);
    if content.spec.source.volume_handle.is_some() && status.is_none() && !group_member {
        return ContentPlan::Create;
    }
    if is_ready(content) {
        return if annotations(content).contains_key(BEING_CREATED) {
            ContentPlan::ClearBeingCreated
        } else {
            ContentPlan::Nothing
        };
    }
    if let Some(handle) = &content.spec.source.snapshot_handle {
        return ContentPlan::Refresh {
            snapshot_handle: handle.clone(),
        };
    }
    if group_member {
        // A member is cut by its group; the driver tells when its snapshot is ready.
        return match status.and_then(|s| s.snapshot_handle.clone()) {
            Some(snapshot_handle) => ContentPlan::Refresh { snapshot_handle },
            None => ContentPlan::Nothing,
        };
    }
    ContentPlan::Create
}

/// The CSI snapshot name (upstream `makeSnapshotName`): `<prefix>-<snapshot UID>`, or with
/// `uuid_length` ≥ 0 that many characters of the UID without dashes.
pub fn snapshot_name(prefix: &str, snapshot_uid: &str, uuid_length: i64) -> Result<String, String> {
    if snapshot_uid.is_empty() {
        return Err("Corrupted snapshot object, it is missing UID".to_string());
    }
    if uuid_length < 0 {
        return Ok(format!("{prefix}-{snapshot_uid}"));
    }
    let compact: String = snapshot_uid.chars().filter(|c| *c != '-').collect();
    let length = usize::try_from(uuid_length).unwrap_or(usize::MAX);
    match compact.get(..length) {
        Some(part) => Ok(format!("{prefix}-{part}")),
        None => Err(format!(
            "--snapshot-name-uuid-length={uuid_length} is longer than the snapshot UID {snapshot_uid:?} without dashes"
        )),
    }
}

/// The `--extra-create-metadata` parameters.
pub fn add_extra_metadata(
    parameters: &mut HashMap<String, String>,
    content: &VolumeSnapshotContent,
) {
    let reference = &content.spec.volume_snapshot_ref;
    parameters.insert(
        SNAPSHOT_NAME_KEY.into(),
        reference.name.clone().unwrap_or_default(),
    );
    parameters.insert(
        SNAPSHOT_NAMESPACE_KEY.into(),
        reference.namespace.clone().unwrap_or_default(),
    );
    parameters.insert(
        CONTENT_NAME_KEY.into(),
        content.metadata.name.clone().unwrap_or_default(),
    );
}

/// What the driver said of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub snapshot_handle: String,
    pub ready_to_use: bool,
    /// Nanoseconds since the epoch; the caller uses "now" when the driver gave none.
    pub creation_time: i64,
    pub size_bytes: i64,
}

/// The content status after `cut` (upstream `updateSnapshotContentStatus`): set what is unset,
/// follow readiness (a ready snapshot clears the error); `None` when nothing changes.
pub fn status_after(
    status: Option<&VolumeSnapshotContentStatus>,
    cut: &Cut,
) -> Option<VolumeSnapshotContentStatus> {
    let Some(old) = status else {
        return Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some(cut.snapshot_handle.clone()),
            ready_to_use: Some(cut.ready_to_use),
            creation_time: Some(cut.creation_time),
            restore_size: (cut.size_bytes > 0).then_some(cut.size_bytes),
            ..VolumeSnapshotContentStatus::default()
        });
    };
    let mut new = old.clone();
    if new.snapshot_handle.is_none() {
        new.snapshot_handle = Some(cut.snapshot_handle.clone());
    }
    if new.ready_to_use != Some(cut.ready_to_use) {
        new.ready_to_use = Some(cut.ready_to_use);
        if cut.ready_to_use {
            new.error = None;
        }
    }
    if new.creation_time.is_none() {
        new.creation_time = Some(cut.creation_time);
    }
    if new.restore_size.is_none() && cut.size_bytes > 0 {
        new.restore_size = Some(cut.size_bytes);
    }
    (new != *old).then_some(new)
}

/// The status patch recording a failure (upstream `updateContentErrorStatusWithEvent`, and its
/// group twin): not ready, with the error; `None` when `recorded` is already this message (then
/// no Event either).
pub fn error_status_patch(recorded: Option<&str>, message: &str, now: Time) -> Option<Value> {
    if recorded == Some(message) {
        return None;
    }
    let error = SnapshotError {
        time: Some(now),
        message: Some(message.to_string()),
    };
    Some(json!({"status": {"readyToUse": false, "error": error}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_kinds::snapshot::{
        SnapshotReference, VolumeSnapshotContentSource, VolumeSnapshotContentSpec,
    };

    const DRIVER: &str = "hostpath.csi.k8s.io";

    fn dynamic() -> VolumeSnapshotContent {
        let mut content = VolumeSnapshotContent::new(
            "snapcontent-1",
            VolumeSnapshotContentSpec {
                driver: DRIVER.into(),
                volume_snapshot_ref: SnapshotReference {
                    name: Some("snap".into()),
                    namespace: Some("ns".into()),
                    uid: Some("1".into()),
                    ..SnapshotReference::default()
                },
                source: VolumeSnapshotContentSource {
                    volume_handle: Some("vol".into()),
                    snapshot_handle: None,
                },
                ..VolumeSnapshotContentSpec::default()
            },
        );
        content.metadata.finalizers = Some(vec![CONTENT_BOUND_FINALIZER.into()]);
        content
    }

    fn with_status(
        mut content: VolumeSnapshotContent,
        handle: &str,
        ready: bool,
    ) -> VolumeSnapshotContent {
        content.status = Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some(handle.into()),
            ready_to_use: Some(ready),
            ..VolumeSnapshotContentStatus::default()
        });
        content
    }

    fn annotated(mut content: VolumeSnapshotContent, keys: &[&str]) -> VolumeSnapshotContent {
        content.metadata.annotations = Some(
            keys.iter()
                .map(|k| (k.to_string(), "yes".to_string()))
                .collect(),
        );
        content
    }

    fn deleting(mut content: VolumeSnapshotContent) -> VolumeSnapshotContent {
        content.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        content
    }

    fn pre_provisioned(uid: Option<&str>) -> VolumeSnapshotContent {
        let mut content = dynamic();
        content.spec.source = VolumeSnapshotContentSource {
            volume_handle: None,
            snapshot_handle: Some("snap-1".into()),
        };
        content.spec.volume_snapshot_ref.uid = uid.map(str::to_string);
        content
    }

    #[test]
    fn plans_follow_upstream_sync_content() {
        let retained = {
            let mut c = with_status(dynamic(), "h", true);
            c.spec.deletion_policy = DeletionPolicy::Retain;
            deleting(annotated(c, &[BEING_DELETED]))
        };
        let mut other_driver = dynamic();
        other_driver.spec.driver = "other".into();
        let cases: Vec<(&str, VolumeSnapshotContent, ContentPlan)> = vec![
            ("another driver's", other_driver, ContentPlan::NotOurs),
            ("new dynamic", dynamic(), ContentPlan::Create),
            (
                "cut, not ready: ask again",
                with_status(dynamic(), "h", false),
                ContentPlan::Create,
            ),
            (
                "ready",
                with_status(dynamic(), "h", true),
                ContentPlan::Nothing,
            ),
            (
                "ready, annotation left",
                annotated(with_status(dynamic(), "h", true), &[BEING_CREATED]),
                ContentPlan::ClearBeingCreated,
            ),
            (
                "pre-provisioned",
                pre_provisioned(Some("1")),
                ContentPlan::Refresh {
                    snapshot_handle: "snap-1".into(),
                },
            ),
            (
                "snapshot deleted, policy Delete",
                deleting(annotated(
                    with_status(dynamic(), "h", true),
                    &[BEING_DELETED],
                )),
                ContentPlan::Delete {
                    delete: Some("h".into()),
                    remove_finalizer: true,
                },
            ),
            (
                "snapshot deleted, policy Retain",
                retained,
                ContentPlan::Delete {
                    delete: None,
                    remove_finalizer: true,
                },
            ),
            (
                "deleted while CreateSnapshot may still run: wait",
                deleting(annotated(
                    with_status(dynamic(), "h", false),
                    &[BEING_DELETED, BEING_CREATED],
                )),
                ContentPlan::Create,
            ),
            (
                "deleted, but its snapshot is not being deleted: wait",
                deleting(with_status(dynamic(), "h", true)),
                ContentPlan::Nothing,
            ),
            (
                "unbound pre-provisioned deleted",
                deleting(pre_provisioned(None)),
                ContentPlan::Delete {
                    delete: None,
                    remove_finalizer: true,
                },
            ),
        ];
        for (name, content, expected) in cases {
            assert_eq!(plan(&content, DRIVER), expected, "{name}");
        }
    }

    #[test]
    fn snapshot_names_as_upstream() {
        let uid = "8ed7c3a4-3bd1-4b11-9c1a-2f3e0b8a1d7e";
        assert_eq!(
            snapshot_name("snapshot", uid, -1).unwrap(),
            format!("snapshot-{uid}")
        );
        assert_eq!(snapshot_name("snap", uid, 8).unwrap(), "snap-8ed7c3a4");
        assert!(snapshot_name("snapshot", "", -1).is_err());
        assert!(snapshot_name("snapshot", "abc", 10).is_err());
    }

    #[test]
    fn status_after_sets_the_unset_and_follows_readiness() {
        let cut = Cut {
            snapshot_handle: "h".into(),
            ready_to_use: false,
            creation_time: 5,
            size_bytes: 0,
        };
        let first = status_after(None, &cut).unwrap();
        assert_eq!(first.restore_size, None);
        assert_eq!(first.ready_to_use, Some(false));
        assert_eq!(status_after(Some(&first), &cut), None, "nothing new");
        let mut failed = first.clone();
        failed.error = Some(SnapshotError {
            time: None,
            message: Some("boom".into()),
        });
        let ready = Cut {
            ready_to_use: true,
            size_bytes: 10,
            creation_time: 9,
            ..cut
        };
        let now_ready = status_after(Some(&failed), &ready).unwrap();
        assert_eq!(now_ready.ready_to_use, Some(true));
        assert_eq!(now_ready.error, None, "ready clears the error");
        assert_eq!(now_ready.restore_size, Some(10));
        assert_eq!(now_ready.creation_time, Some(5), "the first time stays");
    }

    #[test]
    fn the_same_error_is_recorded_once() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let patch = error_status_patch(None, "boom", now.clone()).unwrap();
        assert_eq!(patch["status"]["readyToUse"], false);
        assert_eq!(patch["status"]["error"]["message"], "boom");
        assert_eq!(error_status_patch(Some("boom"), "boom", now.clone()), None);
        assert!(error_status_patch(Some("boom"), "other", now).is_some());
    }

    #[test]
    fn extra_metadata_names_snapshot_and_content() {
        let mut parameters = HashMap::new();
        add_extra_metadata(&mut parameters, &dynamic());
        assert_eq!(parameters[SNAPSHOT_NAME_KEY], "snap");
        assert_eq!(parameters[SNAPSHOT_NAMESPACE_KEY], "ns");
        assert_eq!(parameters[CONTENT_NAME_KEY], "snapcontent-1");
    }
}
