//! The annotations Kubernetes' PV controller and external provisioners exchange on claims and
//! PVs (k8s.io/component-helpers `storage/volume`): read and written by the provisioner, and
//! by kube-sim's pv-binder and scheduler roles, which play kube-controller-manager and
//! kube-scheduler.

/// The provisioner the PV controller expects to provision a claim (set by it).
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The same under its older name: Kubernetes before v1.23 sets only this one, later versions
/// both; the provisioner reads either.
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The node the scheduler chose for a WaitForFirstConsumer claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The provisioner that created a PV (its deleter acts on the PVs it names).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The annotation `kubectl apply` keeps a whole copy of the object in (the caches drop it).
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
