//! csi-provisioner: the external-provisioner sidecar in Rust. Built up issue by issue; so far
//! the pure topology core ([`topology`]) that CreateVolume requests are built from.

pub mod topology;
