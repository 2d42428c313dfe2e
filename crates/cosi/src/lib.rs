//! COSI, the Container Object Storage Interface, at the line every shipping driver speaks:
//! v1alpha1 (COSI v0.2.2). The gRPC side is `csi_proto::cosi::v1alpha1`, the
//! `objectstorage.k8s.io/v1alpha1` kinds and their CRDs are `csi_kinds::objectstorage`; this
//! crate holds the controllers: the `cosi-controller` that gives BucketClaims their Buckets
//! ([`claim`] decides, [`controller`] acts), the `cosi-provisioner` sidecar that turns Buckets
//! and BucketAccesses into buckets and credentials Secrets through a driver ([`sidecar`]), and
//! `cosi-crds`, which writes the CRDs as YAML. The sample driver `cosi-s3` is a crate of its own.

pub mod claim;
pub mod controller;
pub mod flags;
pub mod run;
pub mod sidecar;

/// Objects for the table tests: a JSON base with fields merged over it.
#[cfg(test)]
mod test_objects {
    /// `base` with `extra`'s fields set over it, recursively (`null` clears one).
    pub fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
        fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
            match (base, extra) {
                (serde_json::Value::Object(base), serde_json::Value::Object(extra)) => {
                    for (key, value) in extra {
                        merge(base.entry(key).or_insert(serde_json::Value::Null), value);
                    }
                }
                (base, extra) => *base = extra,
            }
        }
        merge(&mut base, extra);
        base
    }
}
