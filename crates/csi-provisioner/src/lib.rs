//! csi-provisioner: the external-provisioner sidecar in Rust.
//!
//! Pure cores, each table-tested: [`step`] (a claim's next step: the claim sync's one
//! decision), [`claims`] (which claims are ours, their data source, clone sources),
//! [`provision`] (the plan of one provisioning), [`topology`] (requisite and preferred terms),
//! [`request`] (the CreateVolume request: name, fsType, capabilities, metadata, error
//! outcomes), [`pv`] (the PV of a created volume), [`deletion`] (the PV finalizer and the
//! DeleteVolume plan), [`inflight`] (the record of provisionings in flight, which keeps a
//! volume being created from leaking), [`protection`] (what the provisioning-protection
//! finalizer records where that record cannot be written),
//! [`snapshots`] (restore checks), [`vac`] (VolumeAttributesClasses: mutable parameters),
//! [`grants`] (ReferenceGrants for cross-namespace data sources) and [`node_deployment`]
//! (which claims and PVs a per-node instance handles, and its delays before owning an
//! Immediate claim).
//!
//! Adapters: [`controller`] (the caches and the claim and PV syncs), [`capacity`]
//! (CSIStorageCapacity objects), [`metrics`], [`flags`], [`gates`] and [`run`] (what `main`
//! starts).

pub mod capacity;
pub mod claims;
pub mod controller;
pub mod deletion;
pub mod flags;
pub mod gates;
pub mod grants;
pub mod inflight;
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
