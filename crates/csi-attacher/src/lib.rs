//! csi-attacher: the external-attacher sidecar in Rust. Built up step by step; so far its
//! command line ([`flags`]) and the pure core every VolumeAttachment decision comes from
//! ([`attach`]: finalizer names, what to do with a VolumeAttachment, and the
//! ControllerPublishVolume / ControllerUnpublishVolume requests).

pub mod attach;
pub mod flags;
