//! COSI, the Container Object Storage Interface, at the line every shipping driver speaks:
//! v1alpha1 (COSI v0.2.2). The gRPC side is `csi_proto::cosi::v1alpha1`; this crate holds the
//! Kubernetes side: the `objectstorage.k8s.io/v1alpha1` kinds and their CRDs ([`api`]), and
//! the `cosi-controller` that gives BucketClaims their Buckets ([`claim`] decides,
//! [`controller`] acts).

pub mod api;
pub mod claim;
pub mod controller;
pub mod flags;
pub mod run;
pub mod s3;
