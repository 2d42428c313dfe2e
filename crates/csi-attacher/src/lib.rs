//! csi-attacher: the external-attacher sidecar in Rust, a drop-in with upstream's flags,
//! finalizer, annotation and Lease names. [`attach`] is the pure core (what to do with a
//! VolumeAttachment, the volume, node ID and ControllerPublish/Unpublish requests, the
//! patches); [`controller`] runs it against the caches and the driver; [`run`] is the
//! startup; [`flags`] the command line.

pub mod attach;
pub mod controller;
pub mod flags;
pub mod run;
