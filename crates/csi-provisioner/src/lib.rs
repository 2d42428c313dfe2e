//! csi-provisioner: the external-provisioner sidecar in Rust. Built up step by step; so far
//! the pure core CreateVolume requests and PVs are built from: [`topology`] (requisite and
//! preferred terms), [`claims`] (which claims, their data source, clone sources) and [`request`] (name, fsType, capabilities, metadata, error outcomes,
//! PV capacity and node affinity) [`deletion`] (the PV finalizer and DeleteVolume plan), [`protection`] (what the provisioning-protection finalizer records), [`snapshots`] (restore checks),
//! [`vac`] (VolumeAttributesClasses: mutable parameters), [`grants`] (ReferenceGrants for
//! cross-namespace data sources) and [`node_deployment`] (which claims and PVs a per-node
//! instance handles, and its delays before owning an Immediate claim).

/// `kube::Resource` for a type of ours of one fixed group, version, kind and plural: kinds
/// k8s-openapi's v1_33 set lacks, and custom resources. The type has a `metadata: ObjectMeta`.
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

pub mod capacity;
pub mod claims;
pub mod controller;
pub mod deletion;
pub mod flags;
pub mod gates;
pub mod grants;
pub mod metrics;
pub mod node_deployment;
pub mod protection;
pub mod provision;
pub mod pv;
pub mod request;
pub mod run;
pub mod snapshots;
pub mod sync_error;
pub mod topology;
pub mod vac;
