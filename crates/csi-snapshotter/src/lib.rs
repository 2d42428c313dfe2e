//! csi-snapshotter and snapshot-controller: external-snapshotter in Rust, drop-ins with
//! upstream's flags, Lease names, finalizers, annotations and Event reasons.
//! The snapshot.storage.k8s.io/v1 types and their CRDs are `csi_kinds::snapshot`. [`content`]
//! is the sidecar's pure core and [`sidecar`] its adapter; [`snapshot`] is the controller's pure
//! core and [`common`] its adapter, [`metrics`] its operation metrics; [`secrets`] resolves the
//! classes' secrets; [`run`] is the startup of both binaries; [`flags`] their command lines.

pub mod common;
pub mod content;
pub mod flags;
pub mod group;
pub mod metrics;
pub mod run;
pub mod secrets;
pub mod sidecar;
pub mod snapshot;
