//! csi-resizer: the external-resizer sidecar in Rust, a drop-in with upstream's flags, Lease
//! name, conditions, Event reasons and annotations. [`resize`] is the pure core (whether and
//! to what size a claim's volume is expanded, and the status and PV patches that record it);
//! [`controller`] runs it against the caches and the driver; [`run`] is the startup;
//! [`flags`] the command line.

pub mod controller;
pub mod flags;
pub mod modify;
pub mod resize;
pub mod run;
