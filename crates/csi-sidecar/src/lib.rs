//! The controller runtime of the suite: the Kubernetes client, caches, keyed workers, leader
//! election and the writes, events and flags of the controllers. Its users are the
//! controllers: csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter (and the
//! snapshot-controller), podmon, COSI's controller and provisioner sidecar, csi-inventory, and
//! kube-sim's simulated cluster roles. CSI transport and the process basics are csi-grpc's,
//! Kubernetes kinds and rules csi-kinds'.
//!
//! - [`flags`] the Kubernetes flags (client, leader election, workers, feature gates) and
//!   [`flags::SidecarArgs`], the controllers' standard set;
//! - [`feature_gates`] `--feature-gates` with component-base semantics;
//! - [`kube`] the Kubernetes client (kubeconfig or in-cluster, optional token bucket, 429
//!   Retry-After);
//! - [`api_errors`] Kubernetes API errors as client-go prints them;
//! - [`leader`] Lease-based leader election with client-go semantics;
//! - [`informers`] reflector caches with one wake-up signal per controller;
//! - [`workers`] the reconciler runtime: a controller implements its `Reconciler` trait (keys,
//!   offer, sync) and the runtime runs the loop — keyed triggers, bounded lanes, per-key
//!   backoff, typed errors, skip unchanged objects;
//! - [`workqueue_metrics`] client-go's `workqueue_*` metrics for the workers;
//! - [`backoff`] exponential retry delays;
//! - [`slow_set`] the slow retry of objects the driver refused as infeasible;
//! - [`superseded`] our writes a cache does not show yet (syncs wait for them);
//! - [`events`] core/v1 Event recording;
//! - [`finalizers`] guarded finalizer patches;
//! - [`writes`] patches that fall back to GET + update under upstream's RBAC;
//! - [`startup`] connect and discover, serve metrics and health, run (elected);
//! - [`secrets`] fetching a StorageClass-referenced Secret's data;
//! - [`vac`] whether the API server serves VolumeAttributesClasses (storage.k8s.io/v1);
//! - [`lock`] a mutex lock that outlives a panicked holder.

pub mod api_errors;
pub mod backoff;
pub mod events;
pub mod feature_gates;
pub mod finalizers;
pub mod flags;
pub mod informers;
pub mod kube;
pub mod leader;
pub mod secrets;
pub mod slow_set;
pub mod startup;
pub mod superseded;
pub mod vac;
pub mod workers;
pub mod workqueue_metrics;
pub mod writes;

/// Locks `mutex` even if a holder panicked: the controllers keep plain maps and sets of keys
/// behind their mutexes, which stay usable, and a controller must not stop over them.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
