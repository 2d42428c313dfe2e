//! CSI transport and the process basics every CSI binary of the suite shares: the controllers,
//! the node-driver-registrar and livenessprobe, podmon, COSI, and the drivers (csi-hostpath,
//! cosi-s3). No Kubernetes client: the binaries that need none (the driver, the registrar and
//! livenessprobe) build without kube and k8s-openapi.
//!
//! ARCHITECTURE.md places flags, http and shutdown in csi-sidecar; they are here because the
//! registrar, livenessprobe and the driver need them and must not depend on kube. The
//! controllers' Kubernetes flags build on [`flags`] in `csi_sidecar::flags`.
//!
//! - [`conn`] the CSI driver connection (bounded wait, Probe, discovery, per-call timeouts,
//!   metrics, redacted logging, exit on connection loss);
//! - [`listing`] paging through the driver's lists, starting over when a token goes stale;
//! - [`grpc_authority`] gRPC servers on Unix sockets accept the `:authority` real clients send
//!   (a socket path, or nothing);
//! - [`grpc_server`] the gRPC server of every Unix socket (keepalive, admitted connections);
//! - [`metrics`] the `csi_sidecar_operations_seconds` histogram, the `process_*` families and
//!   Go-compatible metrics text;
//! - [`flags`] the common flags (logging, `--csi-address`, `--timeout`, HTTP) with upstream names
//!   and defaults, and the parsing entry points;
//! - [`logging`] tracing from `-v` and `--logging-format`;
//! - [`shutdown`] one cancellation token for every task;
//! - [`http`] `/metrics` and `/healthz` on `--http-endpoint`;
//! - [`tls`] gRPC over TLS on TCP: a server whose certificate follows its files, upstream's
//!   `--tls-*` flags, and a client that trusts a CA bundle;
//! - [`mounts`] the node's mount table;
//! - [`durable`] replacing a small file atomically and durably.

pub mod conn;
pub mod durable;
pub mod flags;
pub mod grpc_authority;
pub mod grpc_server;
pub mod http;
pub mod listing;
pub mod logging;
pub mod metrics;
pub mod mounts;
pub mod shutdown;
pub mod tls;
