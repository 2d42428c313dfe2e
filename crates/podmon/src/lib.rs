//! podmon: resiliency for stateful pods on failed nodes, for any CSI driver — Dell CSM
//! Resiliency's design and flags. [`plan`] is the pure core (taints, the trigger, the
//! driver's connectivity verdict, the circuit breaker); [`controller`] fences and fails pods
//! over; [`node`] cleans the zombies' leftovers and removes the taint; [`config`] is the
//! live-reloaded driver ConfigMap; [`run`] the startup; [`flags`] the command line.

pub mod config;
pub mod controller;
pub mod flags;
pub mod metrics;
pub mod node;
pub mod plan;
pub mod run;
pub mod taints;
