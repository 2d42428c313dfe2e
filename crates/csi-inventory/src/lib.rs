//! csi-inventory: which volumes exist on the storage but not in the cluster (orphaned), which
//! PersistentVolumes lost their volume (missing), where the two disagree (mismatched), and
//! which volumes the driver reports unhealthy (abnormal); snapshots likewise; and import of an
//! existing volume as a PersistentVolume.
//!
//! `report` (pure core), `objects` (both sides reduced to what the report reads), `import`
//! (the PV for an existing volume), `render` (tables and JSON); `listing` pages through the
//! driver, `run` connects and acts.
//!
//! Also the client of a driver's changed block tracking, `snapshot-metadata-lister`
//! ([`snapshot_metadata`]): which blocks of a VolumeSnapshot a backup must read.

pub mod flags;
pub mod import;
pub mod metrics;
pub mod objects;
pub mod render;
pub mod report;
pub mod run;
pub mod snapshot_metadata;
