//! Kubernetes kinds, names and rules of the CSI suite: pure code (no client, no async runtime)
//! that the controllers, the reference driver and kube-sim share.
//!
//! Always built:
//! - [`annotations`] the claim and PV annotations the PV controller and provisioners exchange;
//! - [`capability`] Kubernetes access modes and volume modes as CSI volume capabilities;
//! - [`go_duration`] Go's duration syntax (`1m30s`), parsed and formatted;
//! - [`kubelet_paths`] where kubelet puts a CSI volume, and VolumeAttachment names;
//! - [`names`] Kubernetes DNS-1123 name rules;
//! - [`quantity`] resource quantities (storage sizes);
//! - [`volume_attachment`] the VolumeAttachment node-ID annotation and ControllerUnpublishVolume.
//!
//! With the `api` feature (k8s-openapi, kube-core and kube-derive, schemars), for the Kubernetes-facing crates:
//! - [`cached`] lean cached kinds (a PersistentVolume without the in-tree sources, a claim
//!   with its maps as lists);
//! - [`cbt`] the cbt.storage.k8s.io SnapshotMetadataService kind (changed block tracking) and
//!   its CRD;
//! - [`crd`] CustomResourceDefinitions generated from Rust types, written and checked as YAML;
//! - [`groupsnapshot`] the groupsnapshot.storage.k8s.io kinds (VolumeGroupSnapshot,
//!   VolumeGroupSnapshotContent, VolumeGroupSnapshotClass), their versions and CRDs;
//! - [`label_selector`] `metav1.LabelSelector` matching;
//! - [`migration`] CSI migration of in-tree volume plugins: StorageClasses and PVs translated
//!   as csi-translation-lib does;
//! - [`node_selector`] `v1.NodeSelector` matching;
//! - [`objectstorage`] the objectstorage.k8s.io/v1alpha1 kinds of COSI (BucketClass,
//!   BucketClaim, Bucket, BucketAccessClass, BucketAccess) and their CRDs;
//! - [`pv`] a PersistentVolume's node affinity from a driver's accessible topology;
//! - [`secrets`] StorageClass secret references (reserved keys, templates) and Secret data;
//! - [`snapshot`] the snapshot.storage.k8s.io/v1 kinds (VolumeSnapshot, VolumeSnapshotContent,
//!   VolumeSnapshotClass), their finalizers, annotations and CRDs;
//! - [`snapshot_secrets`] the secrets a VolumeSnapshotClass or VolumeGroupSnapshotClass names
//!   (snapshotter, list, group secrets) and the class parameters CreateSnapshot gets;
//! - [`vac`] the VolumeAttributesClass (storage.k8s.io/v1) type and its gate;
//! - [`fixed_resource!`] `kube_core::Resource` for a type of one fixed group, version and kind.

/// `kube_core::Resource` (what `kube::Resource` names) for a type of ours of one fixed group,
/// version, kind and plural: kinds k8s-openapi's v1_33 set lacks, and custom resources. The
/// type has a `metadata: ObjectMeta`.
#[cfg(feature = "api")]
#[macro_export]
macro_rules! fixed_resource {
    ($type:ty, $scope:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        impl $crate::macro_support::Resource for $type {
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
            fn meta(&self) -> &$crate::macro_support::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut $crate::macro_support::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// What [`fixed_resource!`] expands to, reachable from any crate that invokes it.
#[cfg(feature = "api")]
#[doc(hidden)]
pub mod macro_support {
    pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    pub use kube_core::Resource;
}

pub mod annotations;
#[cfg(feature = "api")]
pub mod cached;
pub mod capability;
#[cfg(feature = "api")]
pub mod cbt;
#[cfg(feature = "api")]
pub mod crd;
pub mod go_duration;
#[cfg(feature = "api")]
pub mod groupsnapshot;
pub mod kubelet_paths;
#[cfg(feature = "api")]
pub mod label_selector;
#[cfg(feature = "api")]
pub mod migration;
pub mod names;
#[cfg(feature = "api")]
pub mod node_selector;
#[cfg(feature = "api")]
pub mod objectstorage;
#[cfg(feature = "api")]
pub mod pv;
pub mod quantity;
#[cfg(feature = "api")]
pub mod secrets;
#[cfg(feature = "api")]
pub mod snapshot;
#[cfg(feature = "api")]
pub mod snapshot_secrets;
#[cfg(feature = "api")]
pub mod vac;
pub mod volume_attachment;
