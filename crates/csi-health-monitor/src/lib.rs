//! csi-health-monitor: the external-health-monitor-controller sidecar in Rust, a drop-in with
//! upstream's flags, Event reasons and messages, and Lease name, for drivers of both volume-health
//! generations: CSI v1.13's health RPCs and the VolumeCondition of v1.12 and older. [`health`]
//! is the pure core (a check of a volume → the Event on its claim, once per change); [`monitor`]
//! reads the driver's answers and records the Events; [`node`] is the node watcher's plan and
//! [`watcher`] runs it; [`run`] is the startup; [`flags`] the command line.

pub mod flags;
pub mod health;
pub mod monitor;
pub mod node;
pub mod run;
pub mod watcher;
