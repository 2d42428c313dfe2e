//! csi-snapshot-metadata, a drop-in for the Kubernetes external-snapshot-metadata sidecar
//! (changed block tracking, KEP-3314): it serves the Kubernetes SnapshotMetadata gRPC API
//! (`csi_proto::snapshotmetadata`) over TLS to backup applications and relays their requests
//! to the CSI driver's SnapshotMetadata service.
//!
//! - [`plan`] the pure core: request validation, the authentication and authorization
//!   decisions, snapshot resolution, the snapshotter secret, the CSI requests, with
//!   upstream's status codes and messages;
//! - [`server`] the gRPC service: the Kubernetes and CSI adapters and the bounded relay;
//! - [`health`] `grpc.health.v1.Health` on the gRPC port;
//! - [`metrics`] `snapshot_metadata_controller_operations_seconds`;
//! - [`flags`] upstream's command line;
//! - [`run`] startup, serving and shutdown.

pub mod flags;
pub mod health;
pub mod metrics;
pub mod plan;
pub mod run;
pub mod server;
