//! csi-provisioner: the external-provisioner sidecar in Rust. Built up step by step; so far
//! the pure core CreateVolume requests and PVs are built from: [`topology`] (requisite and
//! preferred terms), [`claims`] (which claims, their data source, clone sources) and [`request`] (name, fsType, capabilities, metadata, error outcomes,
//! PV capacity and node affinity) [`deletion`] (the PV finalizer and DeleteVolume plan), [`protection`] (what the provisioning-protection finalizer records), [`snapshots`] (restore checks),
//! [`step`] (a claim's next step, the claim sync's one decision), [`vac`] (VolumeAttributesClasses: mutable parameters), [`grants`] (ReferenceGrants for
//! cross-namespace data sources) and [`node_deployment`] (which claims and PVs a per-node
//! instance handles, and its delays before owning an Immediate claim).

pub mod capacity;
pub mod claims;
pub mod controller;
pub mod deletion;
pub mod flags;
pub mod gates;
pub mod grants;
pub mod metrics;
pub mod node_deployment;
pub mod protection;
pub mod provision;
pub mod pv;
pub mod request;
pub mod run;
pub mod snapshots;
pub mod step;
pub mod sync_error;
pub mod topology;
pub mod vac;
