//! kube-sim: an in-process Kubernetes API server that behaves like kube-apiserver for every
//! verb and resource the CSI suite uses, so the suite's controllers are tested against real
//! API semantics on one machine. A `kube::Client` talks to it over HTTP on 127.0.0.1 exactly as
//! to a cluster.

pub mod apiserver;
pub mod cli;
pub mod conversion;
pub mod errors;
pub mod faults;
pub mod names;
pub mod protobuf;
pub mod proxy;
pub mod quantity;
pub mod rbac;
pub mod resources;
pub mod roles;
pub mod selectors;
pub mod store;
pub mod strategic;

pub use apiserver::ApiServer;

/// A `kube::Client` for a kube-sim (or any plain-HTTP API server) at `addr`, with the default
/// namespace `default`.
pub fn client(addr: std::net::SocketAddr) -> kube::Client {
    let uri: http::Uri = format!("http://{addr}")
        .parse()
        .expect("a socket address is a valid authority");
    let config = kube::Config::new(uri);
    kube::Client::try_from(config).expect("a plain-HTTP kube client needs no TLS setup")
}
