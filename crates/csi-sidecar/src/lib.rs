//! The shared runtime of the CSI sidecars: everything the provisioner, attacher, registrar,
//! livenessprobe and podmon have in common, so no binary carries its own copy.
//!
//! - [`conn`] the CSI driver connection (bounded wait, Probe, discovery, per-call timeouts,
//!   metrics, redacted logging, exit on connection loss);
//! - [`grpc_authority`] gRPC servers on Unix sockets accept the `:authority` real clients send
//!   (a socket path, or nothing);
//! - [`flags`] upstream's standard flags with upstream names and defaults;
//! - [`go_duration`] Go's duration syntax (`1m30s`), parsed and formatted;
//! - [`feature_gates`] `--feature-gates` with component-base semantics;
//! - [`kube`] the Kubernetes client (kubeconfig or in-cluster, optional token bucket, 429
//!   Retry-After);
//! - [`leader`] Lease-based leader election with client-go semantics;
//! - [`informers`] reflector caches with one wake-up signal per controller;
//! - [`cached`] lean cached kinds (a PersistentVolume without the in-tree sources, a claim
//!   with its maps as lists);
//! - [`http`] `/metrics` and `/healthz` on `--http-endpoint`;
//! - [`backoff`] per-object exponential retry delays;
//! - [`events`] core/v1 Event recording;
//! - [`finalizers`] guarded finalizer patches;
//! - [`shutdown`] one cancellation token for every task;
//! - [`startup`] connect and discover, serve metrics and health, run (elected);
//! - [`logging`] tracing from `-v` and `--logging-format`;
//! - [`metrics`] the `csi_sidecar_operations_seconds` histogram and the `process_*` families;
//! - [`mounts`] the node's mount table;
//! - [`names`] Kubernetes DNS-1123 name rules;
//! - [`annotations`] the claim and PV annotations the PV controller and provisioners exchange;
//! - [`quantity`] resource quantities (storage sizes);
//! - [`capability`] Kubernetes access modes and volume modes as CSI volume capabilities;
//! - [`secrets`] StorageClass secret references (reserved keys, templates) and Secret data;
//! - [`vac`] VolumeAttributesClasses (storage.k8s.io/v1): the type and whether it is served;
//! - [`volume_attachment`] the VolumeAttachment node-ID annotation and ControllerUnpublishVolume;
//! - [`slow_set`] the slow retry of objects the driver refused as infeasible;
//! - [`workers`] the reconciler runtime: keyed triggers, bounded lanes, per-key backoff, typed
//!   errors, skip unchanged objects;
//! - [`lock`] a mutex lock that outlives a panicked holder.

/// `kube::Resource` for a type of ours of one fixed group, version, kind and plural: kinds
/// k8s-openapi's v1_33 set lacks, and custom resources. The type has a `metadata: ObjectMeta`.
#[macro_export]
macro_rules! fixed_resource {
    ($type:ty, $scope:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod annotations;
pub mod backoff;
pub mod cached;
pub mod capability;
pub mod conn;
pub mod crd;
pub mod durable;
pub mod events;
pub mod feature_gates;
pub mod finalizers;
pub mod flags;
pub mod go_duration;
pub mod grpc_authority;
pub mod grpc_server;
pub mod http;
pub mod informers;
pub mod kube;
pub mod kubelet_paths;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod mounts;
pub mod names;
pub mod node_selector;
pub mod quantity;
pub mod secrets;
pub mod shutdown;
pub mod slow_set;
pub mod startup;
pub mod superseded;
pub mod vac;
pub mod volume_attachment;
pub mod workers;
pub mod writes;

/// Locks `mutex` even if a holder panicked: the controllers keep plain maps and sets of keys
/// behind their mutexes, which stay usable, and a controller must not stop over them.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
