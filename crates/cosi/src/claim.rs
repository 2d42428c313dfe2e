//! The cosi-controller's decision for one BucketClaim: from the claim, its class and its
//! Bucket (as cached) to the one next step ([`plan`]); the controller only acts.
//!
//! As upstream's controller (v0.2.2 `bucketclaim.go`): a claim gets the Bucket
//! `bucket-<claim UID>` made from its class (driver, parameters, deletion policy, the claim's
//! protocols), or binds the existing Bucket it names (`existingBucketName`), and its status
//! names the Bucket; deleting the claim deletes its Bucket. Where upstream can leak or stall,
//! this differs:
//! - the claim's protection finalizer is added *before* the Bucket is made (upstream adds it
//!   after, so a claim deleted in between leaves a Bucket, and a bucket, behind);
//! - the finalizer is removed once the claim's Bucket is gone (upstream leaves that to the
//!   sidecar, so a claim whose Bucket never came, or went by hand, keeps it forever);
//! - an existing Bucket bound to another claim is refused, not taken over;
//! - `bucketReady` follows the Bucket's own readiness (so it is right with either sidecar).

use std::collections::BTreeMap;

use csi_kinds::crd::ObjectReference;
use csi_kinds::objectstorage::{Bucket, BucketClaim, BucketClass, BucketSpec, Protocol};
use kube::ResourceExt;

/// On every BucketClaim until its Bucket is gone.
pub const BUCKET_CLAIM_FINALIZER: &str = "cosi.objectstorage.k8s.io/bucketclaim-protection";
/// The Event reason of a claim that cannot get its Bucket (upstream's).
pub const FAILED_CREATE_BUCKET: &str = "FailedCreateBucket";
/// The Event reason of a claim whose Bucket cannot be deleted (upstream's).
pub const FAILED_DELETE_BUCKET: &str = "FailedDeleteBucket";

/// The next step for a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimPlan {
    /// Nothing left to do at this version.
    Done,
    /// Protect the claim first, so the Bucket made next is never left behind.
    AddFinalizer,
    /// Make the claim's Bucket.
    CreateBucket(Box<Bucket>),
    /// Bind the existing Bucket to the claim: its `bucketClaim` and protocols.
    BindBucket {
        name: String,
        claim: ObjectReference,
        protocols: Vec<Protocol>,
    },
    /// Write the claim's status.
    SetStatus { bucket_name: String, ready: bool },
    /// The claim cannot get a Bucket (yet): an Event, and retries with backoff.
    Refuse(Refusal),
    /// The claim is being deleted: delete its Bucket.
    DeleteBucket(String),
    /// The claim is being deleted and its Bucket is going: wait for it.
    WaitForBucket(String),
    /// The claim is being deleted and its Bucket is gone: let the claim go.
    RemoveFinalizer,
}

/// Why a claim cannot get its Bucket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the BucketClaim names no bucketClassName and no existingBucketName")]
    NoClass,
    #[error("BucketClass {0:?} not found")]
    ClassNotFound(String),
    #[error("the BucketClaim asks for no protocol")]
    NoProtocol,
    #[error("existing Bucket {0:?} not found")]
    ExistingBucketNotFound(String),
    #[error("existing Bucket {bucket:?} is bound to BucketClaim {claim}")]
    BoundElsewhere { bucket: String, claim: String },
}

/// The Bucket a claim has, or is to have: the one its status names, the existing one it asks
/// for, or `bucket-<uid>`.
pub fn bucket_name(claim: &BucketClaim) -> Option<String> {
    if let Some(name) = claim
        .status
        .as_ref()
        .and_then(|s| s.bucket_name.clone())
        .filter(|n| !n.is_empty())
    {
        return Some(name);
    }
    if let Some(existing) = claim
        .spec
        .existing_bucket_name
        .clone()
        .filter(|n| !n.is_empty())
    {
        return Some(existing);
    }
    claim.uid().map(|uid| format!("bucket-{uid}"))
}

/// The reference a Bucket keeps to its claim.
pub fn claim_reference(claim: &BucketClaim) -> ObjectReference {
    ObjectReference {
        name: Some(claim.name_any()),
        namespace: claim.namespace(),
        uid: claim.uid(),
        ..ObjectReference::default()
    }
}

/// Whether `bucket` is bound to another claim than `claim`.
fn bound_elsewhere(bucket: &Bucket, claim: &BucketClaim) -> Option<String> {
    let reference = &bucket.spec.bucket_claim;
    let name = reference.name.as_deref().filter(|n| !n.is_empty())?;
    let claim_uid = claim.uid();
    let same = reference
        .uid
        .as_deref()
        .is_some_and(|uid| Some(uid) == claim_uid.as_deref())
        || (reference.uid.is_none()
            && Some(name) == claim.metadata.name.as_deref()
            && reference.namespace == claim.namespace());
    (!same).then(|| {
        format!(
            "{}/{name}",
            reference.namespace.as_deref().unwrap_or_default()
        )
    })
}

/// The next step for `claim`, given its class and its Bucket ([`bucket_name`]) as cached.
pub fn plan(
    claim: &BucketClaim,
    class: Option<&BucketClass>,
    bucket: Option<&Bucket>,
) -> ClaimPlan {
    let protected = claim
        .finalizers()
        .iter()
        .any(|f| f == BUCKET_CLAIM_FINALIZER);
    if claim.metadata.deletion_timestamp.is_some() {
        return match bucket {
            _ if !protected => ClaimPlan::Done,
            None => ClaimPlan::RemoveFinalizer,
            Some(bucket) if bucket.metadata.deletion_timestamp.is_some() => {
                ClaimPlan::WaitForBucket(bucket.name_any())
            }
            // A Bucket of another claim (a brownfield claim refused) is not this claim's.
            Some(bucket) if bound_elsewhere(bucket, claim).is_some() => ClaimPlan::RemoveFinalizer,
            Some(bucket) => ClaimPlan::DeleteBucket(bucket.name_any()),
        };
    }
    if claim.spec.protocols.is_empty() {
        return ClaimPlan::Refuse(Refusal::NoProtocol);
    }
    if !protected {
        return ClaimPlan::AddFinalizer;
    }
    let status = claim.status.clone().unwrap_or_default();
    let status_plan = |name: String, ready: bool| {
        if status.bucket_name.as_deref() == Some(name.as_str()) && status.bucket_ready == ready {
            ClaimPlan::Done
        } else {
            ClaimPlan::SetStatus {
                bucket_name: name,
                ready,
            }
        }
    };
    if let Some(existing) = claim
        .spec
        .existing_bucket_name
        .clone()
        .filter(|n| !n.is_empty())
    {
        let Some(bucket) = bucket else {
            return ClaimPlan::Refuse(Refusal::ExistingBucketNotFound(existing));
        };
        if let Some(other) = bound_elsewhere(bucket, claim) {
            return ClaimPlan::Refuse(Refusal::BoundElsewhere {
                bucket: existing,
                claim: other,
            });
        }
        let reference = claim_reference(claim);
        if bucket.spec.bucket_claim.uid != reference.uid
            || bucket.spec.protocols != claim.spec.protocols
        {
            return ClaimPlan::BindBucket {
                name: existing,
                claim: reference,
                protocols: claim.spec.protocols.clone(),
            };
        }
        // A brownfield claim is ready once bound, as upstream's.
        return status_plan(existing, true);
    }
    if let Some(bucket) = bucket {
        let ready = bucket.status.as_ref().is_some_and(|s| s.bucket_ready);
        return status_plan(bucket.name_any(), ready);
    }
    let Some(class_name) = claim
        .spec
        .bucket_class_name
        .clone()
        .filter(|n| !n.is_empty())
    else {
        return ClaimPlan::Refuse(Refusal::NoClass);
    };
    let Some(class) = class else {
        return ClaimPlan::Refuse(Refusal::ClassNotFound(class_name));
    };
    let Some(name) = bucket_name(claim) else {
        return ClaimPlan::Done;
    };
    ClaimPlan::CreateBucket(Box::new(new_bucket(&name, claim, class)))
}

/// The Bucket made for `claim` from `class`.
pub fn new_bucket(name: &str, claim: &BucketClaim, class: &BucketClass) -> Bucket {
    let mut bucket = Bucket::new(
        name,
        BucketSpec {
            driver_name: class.driver_name.clone(),
            bucket_class_name: class.name_any(),
            bucket_claim: claim_reference(claim),
            protocols: claim.spec.protocols.clone(),
            parameters: Some(class.parameters()).filter(|p: &BTreeMap<_, _>| !p.is_empty()),
            deletion_policy: class.deletion_policy,
            existing_bucket_id: None,
        },
    );
    // `new` copies the CRD's approval annotation onto the object; a Bucket carries none.
    bucket.metadata.annotations = None;
    bucket
}

#[cfg(test)]
mod tests {
    use csi_kinds::objectstorage::DeletionPolicy;
    use serde_json::json;

    use super::*;
    use crate::test_objects::merged;

    fn claim(extra: serde_json::Value) -> BucketClaim {
        let base = json!({
            "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
            "metadata": {"name": "data", "namespace": "app", "uid": "u1",
                         "finalizers": [BUCKET_CLAIM_FINALIZER]},
            "spec": {"bucketClassName": "fast", "protocols": ["S3"]}
        });
        serde_json::from_value(merged(base, extra)).unwrap()
    }

    fn class() -> BucketClass {
        serde_json::from_value(
            json!({"metadata": {"name": "fast"}, "driverName": "s3.example.com",
            "deletionPolicy": "Delete", "parameters": {"tier": "gold"}}),
        )
        .unwrap()
    }

    fn bucket(name: &str, extra: serde_json::Value) -> Bucket {
        let base = json!({
            "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "Bucket",
            "metadata": {"name": name},
            "spec": {"driverName": "s3.example.com", "bucketClassName": "fast",
                     "bucketClaim": {"name": "data", "namespace": "app", "uid": "u1"},
                     "protocols": ["S3"]}
        });
        serde_json::from_value(merged(base, extra)).unwrap()
    }

    #[test]
    fn a_new_claim_is_protected_then_gets_its_bucket_from_the_class() {
        let unprotected = claim(json!({"metadata": {"finalizers": []}}));
        assert_eq!(
            plan(&unprotected, Some(&class()), None),
            ClaimPlan::AddFinalizer
        );

        let ClaimPlan::CreateBucket(made) = plan(&claim(json!({})), Some(&class()), None) else {
            panic!("a Bucket is made");
        };
        assert_eq!(made.name_any(), "bucket-u1");
        assert_eq!(made.spec.driver_name, "s3.example.com");
        assert_eq!(made.spec.bucket_class_name, "fast");
        assert_eq!(made.spec.deletion_policy, DeletionPolicy::Delete);
        assert_eq!(made.spec.protocols, vec![Protocol::S3]);
        assert_eq!(made.spec.parameters, Some(class().parameters()));
        assert_eq!(made.spec.bucket_claim, claim_reference(&claim(json!({}))));
    }

    #[test]
    fn the_status_follows_the_bucket() {
        let made = bucket("bucket-u1", json!({}));
        let ready = bucket(
            "bucket-u1",
            json!({"status": {"bucketReady": true, "bucketID": "b"}}),
        );
        let table = [
            (
                json!({}),
                &made,
                ClaimPlan::SetStatus {
                    bucket_name: "bucket-u1".into(),
                    ready: false,
                },
            ),
            (
                json!({}),
                &ready,
                ClaimPlan::SetStatus {
                    bucket_name: "bucket-u1".into(),
                    ready: true,
                },
            ),
            (
                json!({"status": {"bucketName": "bucket-u1", "bucketReady": false}}),
                &made,
                ClaimPlan::Done,
            ),
            (
                json!({"status": {"bucketName": "bucket-u1", "bucketReady": false}}),
                &ready,
                ClaimPlan::SetStatus {
                    bucket_name: "bucket-u1".into(),
                    ready: true,
                },
            ),
            (
                json!({"status": {"bucketName": "bucket-u1", "bucketReady": true}}),
                &ready,
                ClaimPlan::Done,
            ),
        ];
        for (extra, bucket, expected) in table {
            assert_eq!(
                plan(&claim(extra.clone()), Some(&class()), Some(bucket)),
                expected,
                "{extra}"
            );
        }
    }

    #[test]
    fn bad_claims_are_refused() {
        let table = [
            (
                json!({"spec": {"bucketClassName": ""}}),
                None,
                Refusal::NoClass,
            ),
            (json!({}), None, Refusal::ClassNotFound("fast".into())),
            (
                json!({"spec": {"protocols": []}}),
                Some(class()),
                Refusal::NoProtocol,
            ),
            (
                json!({"spec": {"existingBucketName": "old"}}),
                Some(class()),
                Refusal::ExistingBucketNotFound("old".into()),
            ),
        ];
        for (extra, class, refusal) in table {
            assert_eq!(
                plan(&claim(extra.clone()), class.as_ref(), None),
                ClaimPlan::Refuse(refusal),
                "{extra}"
            );
        }
    }

    #[test]
    fn an_existing_bucket_is_bound_once_and_never_taken_from_another_claim() {
        let brownfield = claim(json!({"spec": {"existingBucketName": "old", "protocols": ["S3"]}}));
        let unbound = bucket(
            "old",
            json!({"spec": {"bucketClaim": {"name": null, "namespace": null, "uid": null}, "protocols": []}}),
        );
        assert_eq!(
            plan(&brownfield, None, Some(&unbound)),
            ClaimPlan::BindBucket {
                name: "old".into(),
                claim: claim_reference(&brownfield),
                protocols: vec![Protocol::S3],
            }
        );
        let bound = bucket("old", json!({}));
        assert_eq!(
            plan(&brownfield, None, Some(&bound)),
            ClaimPlan::SetStatus {
                bucket_name: "old".into(),
                ready: true
            }
        );
        let other = bucket(
            "old",
            json!({"spec": {"bucketClaim": {"name": "other", "namespace": "team", "uid": "u9"}}}),
        );
        assert_eq!(
            plan(&brownfield, None, Some(&other)),
            ClaimPlan::Refuse(Refusal::BoundElsewhere {
                bucket: "old".into(),
                claim: "team/other".into()
            })
        );
    }

    #[test]
    fn a_deleted_claim_deletes_its_bucket_and_goes_when_the_bucket_is_gone() {
        let deleting = |extra: serde_json::Value| {
            let mut c = claim(extra);
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            c
        };
        let made = bucket("bucket-u1", json!({}));
        let mut going = made.clone();
        going.metadata.deletion_timestamp = deleting(json!({})).metadata.deletion_timestamp;
        let other = bucket(
            "bucket-u1",
            json!({"spec": {"bucketClaim": {"name": "other", "uid": "u9"}}}),
        );
        let table = [
            (
                deleting(json!({})),
                Some(&made),
                ClaimPlan::DeleteBucket("bucket-u1".into()),
            ),
            (
                deleting(json!({})),
                Some(&going),
                ClaimPlan::WaitForBucket("bucket-u1".into()),
            ),
            (deleting(json!({})), None, ClaimPlan::RemoveFinalizer),
            (
                deleting(json!({})),
                Some(&other),
                ClaimPlan::RemoveFinalizer,
            ),
            (
                deleting(json!({"metadata": {"finalizers": ["someone.else/keep"]}})),
                Some(&made),
                ClaimPlan::Done,
            ),
        ];
        for (claim, bucket, expected) in table {
            assert_eq!(plan(&claim, Some(&class()), bucket), expected);
        }
    }

    #[test]
    fn the_bucket_a_claim_has() {
        assert_eq!(bucket_name(&claim(json!({}))).as_deref(), Some("bucket-u1"));
        assert_eq!(
            bucket_name(&claim(json!({"spec": {"existingBucketName": "old"}}))).as_deref(),
            Some("old")
        );
        assert_eq!(
            bucket_name(&claim(
                json!({"status": {"bucketName": "named", "bucketReady": false}})
            ))
            .as_deref(),
            Some("named")
        );
    }
}
