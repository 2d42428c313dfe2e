//! The scenario suite in one test binary: whole storage stories on kube-sim (or on the real
//! cluster of `KUBECONFIG`), one module per subject. One binary rather than one per file: each
//! links the whole suite (every component, kube-sim, the reference driver), so two dozen of them
//! cost CI gigabytes of disk and two dozen links; one runs the same tests, named
//! `module::scenario`. The secrets scenario is a binary of its own (`tests/secrets.rs`): it
//! installs the process's global log subscriber, to see every log line of every thread.

mod attach;
mod capacity;
mod chart;
mod cosi;
mod cosi_s3;
mod cross_namespace;
mod data_sources;
mod distributed_snapshots;
mod failures;
mod group_snapshots;
mod health_monitor;
mod idle;
mod image;
mod informer_health;
mod inventory;
mod leader_failover;
mod migration;
mod node_deployment;
mod nodes;
mod podmon;
mod provisioning;
mod registration;
mod resize;
mod snapshot_metadata;
mod snapshots;
mod static_pv;
mod topology;
mod volume_attributes;
