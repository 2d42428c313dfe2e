//! csi-snapshotter and snapshot-controller: external-snapshotter in Rust, drop-ins with
//! upstream's flags, Lease names, finalizers, annotations and Event reasons.
//! The snapshot.storage.k8s.io/v1 types and their CRDs are `csi_kinds::snapshot`, the group
//! kinds `csi_kinds::groupsnapshot`. [`content`] is the sidecar's pure core and [`sidecar`] its
//! adapter ([`group_content`] and [`group_sidecar`] for group snapshots); [`snapshot`] is the
//! controller's pure core ([`group`] for groups) and [`common`] its adapter, [`metrics`] its
//! operation metrics; [`secrets`] resolves the classes' secrets; `content_writes` is what
//! csi-snapshotter writes to contents, `group_api` whether the cluster serves the group API;
//! [`run`] is the startup of both binaries; [`flags`] their command lines.

pub mod common;
pub mod content;
mod content_writes;
pub mod distributed;
pub mod flags;
pub mod group;
mod group_api;
pub mod group_content;
pub mod group_sidecar;
pub mod metrics;
pub mod run;
/// The class secrets, shared with csi-snapshot-metadata (which resolves the snapshotter secret too).
pub use csi_kinds::snapshot_secrets as secrets;
pub mod sidecar;
pub mod snapshot;
