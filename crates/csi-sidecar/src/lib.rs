//! The shared runtime of the CSI sidecars: everything the provisioner, attacher, registrar,
//! livenessprobe and podmon have in common, so no binary carries its own copy.
//!
//! - [`conn`] the CSI driver connection (bounded wait, Probe, discovery, per-call timeouts,
//!   metrics, redacted logging, exit on connection loss);
//! - [`grpc_authority`] gRPC servers on Unix sockets accept the `:authority` real clients send
//!   (a socket path, or nothing);
//! - [`flags`] upstream's standard flags with upstream names and defaults;
//! - [`feature_gates`] `--feature-gates` with component-base semantics;
//! - [`kube`] the Kubernetes client (kubeconfig or in-cluster, optional token bucket, 429
//!   Retry-After);
//! - [`leader`] Lease-based leader election with client-go semantics;
//! - [`informers`] reflector caches with one wake-up signal per controller;
//! - [`http`] `/metrics` and `/healthz` on `--http-endpoint`;
//! - [`backoff`] per-object exponential retry delays;
//! - [`events`] core/v1 Event recording;
//! - [`finalizers`] guarded finalizer patches;
//! - [`shutdown`] one cancellation token for every task;
//! - [`startup`] connect and discover, serve metrics and health, run (elected);
//! - [`logging`] tracing from `-v` and `--logging-format`;
//! - [`metrics`] the `csi_sidecar_operations_seconds` histogram and the `process_*` families;
//! - [`mounts`] the node's mount table;
//! - [`secrets`] fetching a StorageClass-referenced Secret's data;
//! - [`vac`] whether the API server serves VolumeAttributesClasses (storage.k8s.io/v1);
//! - [`slow_set`] the slow retry of objects the driver refused as infeasible;
//! - [`workers`] the reconciler runtime: keyed triggers, bounded lanes, per-key backoff, typed
//!   errors, skip unchanged objects;
//! - [`lock`] a mutex lock that outlives a panicked holder.

pub mod backoff;
pub mod conn;
pub mod durable;
pub mod events;
pub mod feature_gates;
pub mod finalizers;
pub mod flags;
pub mod grpc_authority;
pub mod grpc_server;
pub mod http;
pub mod informers;
pub mod kube;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod mounts;
pub mod secrets;
pub mod shutdown;
pub mod slow_set;
pub mod startup;
pub mod superseded;
pub mod vac;
pub mod workers;
pub mod writes;

/// Locks `mutex` even if a holder panicked: the controllers keep plain maps and sets of keys
/// behind their mutexes, which stay usable, and a controller must not stop over them.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
