//! csi-node-driver-registrar and livenessprobe, drop-ins for the upstream sidecars of the same
//! names: [`registrar`] serves kubelet's plugin registration for the driver, [`probe`] answers
//! kubelet's liveness probes of the driver; [`flags`] has both command lines.

pub mod flags;
pub mod probe;
pub mod registrar;
