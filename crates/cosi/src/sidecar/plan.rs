//! The cosi-provisioner sidecar's decisions, one step at a time: for a Bucket of its driver
//! ([`bucket`]) and for a BucketAccess of a class of its driver ([`access`]); the controller
//! only acts. As upstream's sidecar (v0.2.2), with its leaks closed: a Bucket is protected
//! before DriverCreateBucket and a BucketAccess before DriverGrantBucketAccess (upstream adds
//! both finalizers after the call, so an object deleted in between leaves a bucket or live
//! credentials behind), and the Bucket is held by its accesses before the grant.

use std::collections::BTreeMap;

use csi_kinds::objectstorage::{
    AuthenticationType, Bucket, BucketAccess, BucketAccessClass, BucketClaim, DeletionPolicy,
    Protocol,
};
use kube::ResourceExt;
use serde::Serialize;

/// On a Bucket the sidecar has taken on, until the bucket is deleted (or retained).
pub const BUCKET_FINALIZER: &str = "cosi.objectstorage.k8s.io/bucket-protection";
/// On a Bucket while accesses to it exist.
pub const ACCESS_BUCKET_FINALIZER: &str =
    "cosi.objectstorage.k8s.io/bucketaccess-bucket-protection";
/// On a BucketAccess until its access is revoked.
pub const ACCESS_FINALIZER: &str = "cosi.objectstorage.k8s.io/bucketaccess-protection";
/// On a credentials Secret until its access is revoked.
pub const SECRET_FINALIZER: &str = "cosi.objectstorage.k8s.io/secret-protection";
/// The one key of a credentials Secret.
pub const BUCKET_INFO_KEY: &str = "BucketInfo";

/// Event reasons (upstream's).
pub const FAILED_CREATE_BUCKET: &str = "FailedCreateBucket";
pub const FAILED_DELETE_BUCKET: &str = "FailedDeleteBucket";
pub const FAILED_GRANT_ACCESS: &str = "FailedGrantAccess";
pub const FAILED_REVOKE_ACCESS: &str = "FailedRevokeAccess";
pub const WAITING_FOR_BUCKET: &str = "WaitingForBucket";

/// Whether `driver` (a class's or Bucket's `driverName`) is this sidecar's: compared without
/// case, as upstream does.
pub fn ours(driver: &str, own: &str) -> bool {
    driver.eq_ignore_ascii_case(own)
}

fn has(object: &impl ResourceExt, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// The next step for a Bucket.
#[derive(Clone, Debug, PartialEq)]
pub enum BucketPlan {
    Done,
    AddFinalizer,
    /// DriverCreateBucket, then the status (and the claim's readiness).
    Create {
        parameters: BTreeMap<String, String>,
    },
    /// A bucket made outside COSI: ready as it is.
    Adopt {
        bucket_id: String,
    },
    /// The Bucket cannot be made: an Event, and retries.
    Refuse(String),
    /// Deleting: the accesses to it go first (those whose deletion has not begun).
    DeleteAccesses(Vec<String>),
    /// Deleting: every access left is being deleted (revoked); nothing to send until they go.
    WaitForAccesses,
    /// Deleting, and no access is left.
    RemoveAccessFinalizer,
    /// Deleting: DriverDeleteBucket (policy Delete), then the finalizer goes.
    DeleteAtProvider {
        bucket_id: String,
        context: BTreeMap<String, String>,
    },
    RemoveFinalizer,
}

/// A BucketAccess of the Bucket's claim that still exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimAccess {
    pub name: String,
    /// Its deletion has begun: deleting it again would change nothing.
    pub deleting: bool,
}

/// `accesses`: the BucketAccesses of the Bucket's claim that still exist.
pub fn bucket(bucket: &Bucket, own_driver: &str, accesses: &[ClaimAccess]) -> BucketPlan {
    if !ours(&bucket.spec.driver_name, own_driver) {
        return BucketPlan::Done;
    }
    let status = bucket.status.clone().unwrap_or_default();
    if bucket.metadata.deletion_timestamp.is_some() {
        if has(bucket, ACCESS_BUCKET_FINALIZER) {
            let live: Vec<String> = accesses
                .iter()
                .filter(|a| !a.deleting)
                .map(|a| a.name.clone())
                .collect();
            return if accesses.is_empty() {
                BucketPlan::RemoveAccessFinalizer
            } else if live.is_empty() {
                BucketPlan::WaitForAccesses
            } else {
                BucketPlan::DeleteAccesses(live)
            };
        }
        if !has(bucket, BUCKET_FINALIZER) {
            return BucketPlan::Done;
        }
        return match (&bucket.spec.deletion_policy, status.bucket_id) {
            (DeletionPolicy::Delete, Some(bucket_id)) if !bucket_id.is_empty() => {
                BucketPlan::DeleteAtProvider {
                    bucket_id,
                    context: bucket.spec.parameters.clone().unwrap_or_default(),
                }
            }
            _ => BucketPlan::RemoveFinalizer,
        };
    }
    if status.bucket_ready {
        return BucketPlan::Done;
    }
    if !has(bucket, BUCKET_FINALIZER) {
        return BucketPlan::AddFinalizer;
    }
    if let Some(bucket_id) = bucket
        .spec
        .existing_bucket_id
        .clone()
        .filter(|id| !id.is_empty())
    {
        return BucketPlan::Adopt { bucket_id };
    }
    if bucket.spec.bucket_class_name.is_empty() {
        return BucketPlan::Refuse(format!(
            "BucketClassName not defined for Bucket {}",
            bucket.name_any()
        ));
    }
    BucketPlan::Create {
        parameters: bucket.spec.parameters.clone().unwrap_or_default(),
    }
}

/// The next step for a BucketAccess.
#[derive(Clone, Debug, PartialEq)]
pub enum AccessPlan {
    Done,
    AddFinalizer,
    /// The claim or its Bucket is not ready: a WaitingForBucket Event, and retries.
    Wait(String),
    /// The access cannot be granted: a FailedGrantAccess Event, and retries.
    Refuse(String),
    /// Hold the Bucket, DriverGrantBucketAccess, the Secret, then the status.
    Grant(Grant),
    /// Deleting: DriverRevokeBucketAccess (when something was granted), the Secret goes, then
    /// the finalizer.
    Revoke {
        bucket_id: Option<String>,
        account_id: Option<String>,
    },
}

/// What a grant needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub bucket: String,
    pub bucket_id: String,
    /// `ba-<BucketAccess UID>`, the account's idempotency key.
    pub account_name: String,
    pub authentication_type: AuthenticationType,
    pub parameters: BTreeMap<String, String>,
}

/// `class`: the access's BucketAccessClass, `claim` and `bucket` as cached.
pub fn access(
    access: &BucketAccess,
    class: Option<&BucketAccessClass>,
    claim: Option<&BucketClaim>,
    bucket: Option<&Bucket>,
    own_driver: &str,
) -> AccessPlan {
    if class.is_some_and(|c| !ours(&c.driver_name, own_driver)) {
        return AccessPlan::Done;
    }
    let status = access.status.clone().unwrap_or_default();
    let bucket_id = bucket
        .and_then(|b| b.status.as_ref())
        .and_then(|s| s.bucket_id.clone())
        .filter(|id| !id.is_empty());
    if access.metadata.deletion_timestamp.is_some() {
        return if has(access, ACCESS_FINALIZER) {
            AccessPlan::Revoke {
                bucket_id,
                account_id: status.account_id.filter(|id| !id.is_empty()),
            }
        } else {
            AccessPlan::Done
        };
    }
    if status.access_granted && status.account_id.as_ref().is_some_and(|id| !id.is_empty()) {
        return AccessPlan::Done;
    }
    let Some(class) = class else {
        return AccessPlan::Refuse(format!(
            "BucketAccessClass {:?} not found",
            access.spec.bucket_access_class_name
        ));
    };
    if class.authentication_type == AuthenticationType::Iam
        && access
            .spec
            .service_account_name
            .as_ref()
            .is_none_or(|s| s.is_empty())
    {
        return AccessPlan::Refuse(
            "IAM authentication needs the BucketAccess's serviceAccountName".to_string(),
        );
    }
    if !has(access, ACCESS_FINALIZER) {
        return AccessPlan::AddFinalizer;
    }
    let claim_status = claim.and_then(|c| c.status.clone()).unwrap_or_default();
    let (Some(bucket_name), true) = (claim_status.bucket_name.clone(), claim_status.bucket_ready)
    else {
        return AccessPlan::Wait(format!(
            "BucketClaim {:?} is not ready",
            access.spec.bucket_claim_name
        ));
    };
    let (Some(bucket), Some(bucket_id)) = (bucket, bucket_id) else {
        return AccessPlan::Wait(format!("Bucket {bucket_name:?} is not ready"));
    };
    if !bucket.status.as_ref().is_some_and(|s| s.bucket_ready) {
        return AccessPlan::Wait(format!("Bucket {bucket_name:?} is not ready"));
    }
    AccessPlan::Grant(Grant {
        bucket: bucket_name,
        bucket_id,
        account_name: format!("ba-{}", access.uid().unwrap_or_default()),
        authentication_type: class.authentication_type,
        parameters: class.parameters(),
    })
}

/// The `BucketInfo` document of a credentials Secret, in upstream's format.
#[derive(Debug, Serialize)]
pub struct BucketInfo {
    pub metadata: BucketInfoMeta,
    pub spec: BucketInfoSpec,
}

#[derive(Debug, Serialize)]
pub struct BucketInfoMeta {
    pub name: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketInfoSpec {
    pub bucket_name: String,
    pub authentication_type: AuthenticationType,
    #[serde(rename = "secretS3")]
    pub s3: Option<SecretS3>,
    #[serde(rename = "secretAzure")]
    pub azure: Option<SecretAzure>,
    /// The access's protocol (empty when it names none, as upstream writes it).
    pub protocols: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretS3 {
    pub endpoint: String,
    pub region: String,
    #[serde(rename = "accessKeyID")]
    pub access_key_id: String,
    pub access_secret_key: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretAzure {
    pub access_token: String,
    pub expiry_time_stamp: Option<String>,
}

/// Why a grant's answer cannot become a Secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("DriverGrantBucketAccess returned no account_id")]
    NoAccount,
    #[error("DriverGrantBucketAccess returned {0} credentials, not exactly one")]
    NotOne(usize),
}

/// The `BucketInfo` JSON for a grant's answer: its one credential (`s3` or `azure`, with the
/// key spellings drivers use: `accessKeyID`, also `accessKeyId`).
pub fn bucket_info(
    access: &BucketAccess,
    grant: &Grant,
    account_id: &str,
    credentials: &std::collections::HashMap<String, BTreeMap<String, String>>,
) -> Result<String, CredentialsError> {
    if account_id.is_empty() {
        return Err(CredentialsError::NoAccount);
    }
    if credentials.len() != 1 {
        return Err(CredentialsError::NotOne(credentials.len()));
    }
    let secret = |map: &BTreeMap<String, String>, keys: &[&str]| {
        keys.iter()
            .find_map(|k| map.get(*k).cloned())
            .unwrap_or_default()
    };
    let s3 = credentials.get("s3").map(|s| SecretS3 {
        endpoint: secret(s, &["endpoint"]),
        region: secret(s, &["region"]),
        access_key_id: secret(s, &["accessKeyID", "accessKeyId"]),
        access_secret_key: secret(s, &["accessSecretKey"]),
    });
    let azure = credentials.get("azure").map(|a| SecretAzure {
        access_token: secret(a, &["accessToken"]),
        expiry_time_stamp: a.get("expiryTs").cloned(),
    });
    let info = BucketInfo {
        metadata: BucketInfoMeta {
            name: format!("bc-{}", access.uid().unwrap_or_default()),
        },
        spec: BucketInfoSpec {
            bucket_name: grant.bucket.clone(),
            authentication_type: grant.authentication_type,
            s3,
            azure,
            protocols: vec![
                access
                    .spec
                    .protocol
                    .as_ref()
                    .map(Protocol::to_string)
                    .unwrap_or_default(),
            ],
        },
    };
    Ok(serde_json::to_string(&info).expect("BucketInfo serializes"))
}

/// Whether `secret` is the credentials Secret this sidecar wrote for `access`: it carries
/// our finalizer and a `BucketInfo` named after the access (`bc-<UID>`).
pub fn is_own_secret(secret: &k8s_openapi::api::core::v1::Secret, access: &BucketAccess) -> bool {
    let named = secret
        .data
        .as_ref()
        .and_then(|data| data.get(BUCKET_INFO_KEY))
        .and_then(|info| serde_json::from_slice::<serde_json::Value>(&info.0).ok())
        .is_some_and(|info| {
            info["metadata"]["name"].as_str()
                == Some(&format!("bc-{}", access.uid().unwrap_or_default()))
        });
    has(secret, SECRET_FINALIZER) && named
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::test_objects::merged;

    const DRIVER: &str = "s3.example.com";

    fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn a_bucket(extra: serde_json::Value) -> Bucket {
        object(merged(
            json!({"apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "Bucket",
                   "metadata": {"name": "bucket-u1", "finalizers": [BUCKET_FINALIZER]},
                   "spec": {"driverName": "S3.Example.com", "bucketClassName": "fast",
                            "bucketClaim": {"name": "data", "namespace": "app", "uid": "u1"},
                            "protocols": ["S3"], "deletionPolicy": "Delete",
                            "parameters": {"tier": "gold"}}}),
            extra,
        ))
    }

    fn deleting(mut value: serde_json::Value) -> serde_json::Value {
        value["metadata"]["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
        value
    }

    #[test]
    fn buckets_are_protected_made_adopted_and_deleted_by_policy() {
        let gold = BTreeMap::from([("tier".to_string(), "gold".to_string())]);
        // The claim's accesses: (name, being deleted).
        type Accesses = &'static [(&'static str, bool)];
        let table: Vec<(serde_json::Value, Accesses, BucketPlan)> = vec![
            (
                json!({"spec": {"driverName": "other"}}),
                &[],
                BucketPlan::Done,
            ),
            (
                json!({"metadata": {"finalizers": []}}),
                &[],
                BucketPlan::AddFinalizer,
            ),
            (
                json!({}),
                &[],
                BucketPlan::Create {
                    parameters: gold.clone(),
                },
            ),
            (
                json!({"status": {"bucketReady": true, "bucketID": "b"}}),
                &[],
                BucketPlan::Done,
            ),
            (
                json!({"spec": {"existingBucketID": "legacy"}}),
                &[],
                BucketPlan::Adopt {
                    bucket_id: "legacy".into(),
                },
            ),
            (
                json!({"spec": {"bucketClassName": ""}}),
                &[],
                BucketPlan::Refuse("BucketClassName not defined for Bucket bucket-u1".into()),
            ),
            (
                deleting(
                    json!({"metadata": {"finalizers": [ACCESS_BUCKET_FINALIZER, BUCKET_FINALIZER]}}),
                ),
                &[("reader", false)],
                BucketPlan::DeleteAccesses(vec!["reader".into()]),
            ),
            (
                deleting(
                    json!({"metadata": {"finalizers": [ACCESS_BUCKET_FINALIZER, BUCKET_FINALIZER]}}),
                ),
                &[("reader", true), ("writer", false)],
                BucketPlan::DeleteAccesses(vec!["writer".into()]),
            ),
            (
                deleting(
                    json!({"metadata": {"finalizers": [ACCESS_BUCKET_FINALIZER, BUCKET_FINALIZER]}}),
                ),
                &[("reader", true)],
                BucketPlan::WaitForAccesses,
            ),
            (
                deleting(
                    json!({"metadata": {"finalizers": [ACCESS_BUCKET_FINALIZER, BUCKET_FINALIZER]}}),
                ),
                &[],
                BucketPlan::RemoveAccessFinalizer,
            ),
            (
                deleting(json!({"status": {"bucketReady": true, "bucketID": "b"}})),
                &[],
                BucketPlan::DeleteAtProvider {
                    bucket_id: "b".into(),
                    context: gold,
                },
            ),
            (
                deleting(json!({"spec": {"deletionPolicy": "Retain"},
                             "status": {"bucketReady": true, "bucketID": "b"}})),
                &[],
                BucketPlan::RemoveFinalizer,
            ),
            (
                deleting(json!({"metadata": {"finalizers": []}})),
                &[],
                BucketPlan::Done,
            ),
        ];
        for (extra, accesses, expected) in table {
            let accesses: Vec<ClaimAccess> = accesses
                .iter()
                .map(|(name, deleting)| ClaimAccess {
                    name: name.to_string(),
                    deleting: *deleting,
                })
                .collect();
            assert_eq!(
                bucket(&a_bucket(extra.clone()), DRIVER, &accesses),
                expected,
                "{extra}"
            );
        }
    }

    fn an_access(extra: serde_json::Value) -> BucketAccess {
        object(merged(
            json!({"apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketAccess",
                   "metadata": {"name": "reader", "namespace": "app", "uid": "a1",
                                "finalizers": [ACCESS_FINALIZER]},
                   "spec": {"bucketClaimName": "data", "bucketAccessClassName": "keys",
                            "credentialsSecretName": "creds", "protocol": "S3"}}),
            extra,
        ))
    }

    fn class(authentication: &str) -> BucketAccessClass {
        object(json!({"metadata": {"name": "keys"}, "driverName": DRIVER,
                      "authenticationType": authentication, "parameters": {"ro": "no"}}))
    }

    fn claim(ready: bool) -> BucketClaim {
        object(
            json!({"apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
                      "metadata": {"name": "data", "namespace": "app", "uid": "u1"},
                      "spec": {"protocols": ["S3"]},
                      "status": {"bucketReady": ready, "bucketName": "bucket-u1"}}),
        )
    }

    #[test]
    fn accesses_wait_for_their_bucket_then_are_granted_and_revoked() {
        let key = class("Key");
        let ready = a_bucket(json!({"status": {"bucketReady": true, "bucketID": "b"}}));
        let made = a_bucket(json!({}));
        let grant = AccessPlan::Grant(Grant {
            bucket: "bucket-u1".into(),
            bucket_id: "b".into(),
            account_name: "ba-a1".into(),
            authentication_type: AuthenticationType::Key,
            parameters: BTreeMap::from([("ro".to_string(), "no".to_string())]),
        });
        let other: BucketAccessClass = object(json!({"metadata": {"name": "keys"},
            "driverName": "other", "authenticationType": "Key"}));
        let table = [
            (
                an_access(json!({})),
                Some(&other),
                Some(claim(true)),
                Some(&ready),
                AccessPlan::Done,
            ),
            (
                an_access(json!({})),
                None,
                Some(claim(true)),
                Some(&ready),
                AccessPlan::Refuse("BucketAccessClass \"keys\" not found".into()),
            ),
            (
                an_access(json!({"metadata": {"finalizers": []}})),
                Some(&key),
                Some(claim(true)),
                Some(&ready),
                AccessPlan::AddFinalizer,
            ),
            (
                an_access(json!({})),
                Some(&key),
                Some(claim(false)),
                Some(&ready),
                AccessPlan::Wait("BucketClaim \"data\" is not ready".into()),
            ),
            (
                an_access(json!({})),
                Some(&key),
                None,
                None,
                AccessPlan::Wait("BucketClaim \"data\" is not ready".into()),
            ),
            (
                an_access(json!({})),
                Some(&key),
                Some(claim(true)),
                Some(&made),
                AccessPlan::Wait("Bucket \"bucket-u1\" is not ready".into()),
            ),
            (
                an_access(json!({})),
                Some(&key),
                Some(claim(true)),
                Some(&ready),
                grant,
            ),
            (
                an_access(json!({"status": {"accessGranted": true, "accountID": "ba-a1"}})),
                Some(&key),
                Some(claim(true)),
                Some(&ready),
                AccessPlan::Done,
            ),
            (
                object(deleting(
                    serde_json::to_value(an_access(
                        json!({"status": {"accessGranted": true, "accountID": "ba-a1"}}),
                    ))
                    .unwrap(),
                )),
                Some(&key),
                Some(claim(true)),
                Some(&ready),
                AccessPlan::Revoke {
                    bucket_id: Some("b".into()),
                    account_id: Some("ba-a1".into()),
                },
            ),
            (
                object(deleting(
                    serde_json::to_value(an_access(json!({}))).unwrap(),
                )),
                Some(&key),
                None,
                None,
                AccessPlan::Revoke {
                    bucket_id: None,
                    account_id: None,
                },
            ),
        ];
        for (access_object, class, claim, bucket, expected) in table {
            assert_eq!(
                access(&access_object, class, claim.as_ref(), bucket, DRIVER),
                expected,
                "{access_object:?}"
            );
        }
        let iam = class("IAM");
        assert_eq!(
            access(
                &an_access(json!({})),
                Some(&iam),
                Some(&claim(true)),
                Some(&ready),
                DRIVER
            ),
            AccessPlan::Refuse(
                "IAM authentication needs the BucketAccess's serviceAccountName".into()
            )
        );
    }

    #[test]
    fn bucket_info_is_upstreams_document() {
        let grant = Grant {
            bucket: "bucket-u1".into(),
            bucket_id: "b".into(),
            account_name: "ba-a1".into(),
            authentication_type: AuthenticationType::Key,
            parameters: BTreeMap::new(),
        };
        let s3 = BTreeMap::from([
            ("endpoint".to_string(), "http://s3:9000".to_string()),
            ("region".to_string(), "us-east-1".to_string()),
            ("accessKeyId".to_string(), "AKIA1".to_string()),
            ("accessSecretKey".to_string(), "s3cret".to_string()),
        ]);
        let credentials = HashMap::from([("s3".to_string(), s3)]);
        let info = bucket_info(&an_access(json!({})), &grant, "ba-a1", &credentials).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&info).unwrap(),
            json!({"metadata": {"name": "bc-a1"},
                   "spec": {"bucketName": "bucket-u1", "authenticationType": "Key",
                            "secretS3": {"endpoint": "http://s3:9000", "region": "us-east-1",
                                         "accessKeyID": "AKIA1", "accessSecretKey": "s3cret"},
                            "secretAzure": null, "protocols": ["S3"]}})
        );
        assert_eq!(
            bucket_info(&an_access(json!({})), &grant, "", &credentials),
            Err(CredentialsError::NoAccount)
        );
        assert_eq!(
            bucket_info(&an_access(json!({})), &grant, "ba-a1", &HashMap::new()),
            Err(CredentialsError::NotOne(0))
        );

        let secret = |finalizers: serde_json::Value,
                      info: &str|
         -> k8s_openapi::api::core::v1::Secret {
            object(
                json!({"metadata": {"name": "creds", "finalizers": finalizers},
                          "stringData": {}, "data": {BUCKET_INFO_KEY: k8s_openapi::ByteString(info.as_bytes().to_vec())}}),
            )
        };
        let access = an_access(json!({}));
        assert!(is_own_secret(
            &secret(json!([SECRET_FINALIZER]), &info),
            &access
        ));
        assert!(
            !is_own_secret(&secret(json!([]), &info), &access),
            "no finalizer: a user's"
        );
        assert!(
            !is_own_secret(
                &secret(
                    json!([SECRET_FINALIZER]),
                    r#"{"metadata":{"name":"bc-other"}}"#
                ),
                &access
            ),
            "another access's"
        );
    }
}
