//! COSI's API on a live cluster: the objectstorage.k8s.io/v1alpha1 CRDs generated from the Rust
//! types install on kube-sim and on a real API server (v1.19 serves CRD v1), and the server
//! holds the five kinds to their schema as upstream's CRDs do: the class's deletion policy
//! defaults to Retain, a policy outside Retain/Delete and a claim without protocols are refused,
//! fields the schema does not know are pruned, and status is written through its subresource
//! only. What the types read back is what was written (a `GCS` protocol reads as GCP). Then
//! cosi-controller gives claims their Buckets there.

use cosi::claim::{BUCKET_CLAIM_FINALIZER, FAILED_CREATE_BUCKET};
use cosi::sidecar::plan::FAILED_CREATE_BUCKET as FAILED_CREATE_BUCKET_AT_DRIVER;
use csi_kinds::objectstorage::{
    AuthenticationType, Bucket, BucketAccess, BucketAccessClass, BucketClaim, BucketClass,
    DeletionPolicy, Protocol,
};
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::install_cosi_crds;
use csi_suite_scenarios::object_storage::{CosiDriver, access_ready, bucket_id_of, claim_ready};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

/// Posts `value` as a `kind` without the Rust types (which cannot hold invalid objects);
/// returns the API server's refusal, if any.
async fn post_raw(
    cluster: &Cluster,
    kind: &str,
    plural: &str,
    namespaced: bool,
    value: serde_json::Value,
) -> Option<kube::core::Status> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("objectstorage.k8s.io", "v1alpha1", kind),
        plural,
    );
    let api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(cluster.client.clone(), &cluster.namespace, &resource)
    } else {
        Api::all_with(cluster.client.clone(), &resource)
    };
    let mut object: DynamicObject = serde_json::from_value(value).expect("an object");
    object.types = Some(kube::core::TypeMeta {
        api_version: "objectstorage.k8s.io/v1alpha1".into(),
        kind: kind.into(),
    });
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(*status),
        Err(error) => panic!("posting a {kind}: {error}"),
    }
}

/// One scenario for both parts: cosi-controller is cluster-wide, and would act on the claims of
/// the schema checks if they ran beside it.
#[tokio::test]
async fn cosi_kinds_are_served_and_claims_get_their_buckets() {
    let cluster = Cluster::start("cosi").await;
    install_cosi_crds(&cluster.client).await;
    kinds_are_held_to_their_schema(&cluster).await;
    let controller = cluster.start_cosi_controller();
    claims_get_their_buckets_and_take_them_along_when_deleted(&cluster).await;
    workloads_get_credentials_that_work_until_revoked(&cluster).await;
    controller.stop().await;
    // On kube-sim: every request of both components was one the chart's RBAC allows.
    cluster.stop().await;
}

async fn kinds_are_held_to_their_schema(cluster: &Cluster) {
    let driver = "s3.cosi.example.com";

    // A class without a policy gets Retain, as upstream's schema defaults it.
    let classes = cluster.cluster_scoped::<BucketClass>();
    let class_name = format!("{}-standard", cluster.namespace);
    let class = cluster
        .create(
            &classes,
            json!({"metadata": {"name": class_name}, "driverName": driver,
                   "parameters": {"tier": "standard"}}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketClass>(None, &class_name);
    let stored = classes.get(&class_name).await.expect("the class");
    assert_eq!(stored.deletion_policy, DeletionPolicy::Retain);
    assert_eq!(stored.parameters(), class.parameters());
    let raw: serde_json::Value = cluster
        .client
        .request(
            http::Request::get(format!(
                "/apis/objectstorage.k8s.io/v1alpha1/bucketclasses/{class_name}"
            ))
            .body(Vec::new())
            .expect("a request"),
        )
        .await
        .expect("the class as JSON");
    assert_eq!(raw["deletionPolicy"], "Retain", "{raw}");

    let refused = post_raw(
        cluster,
        "BucketClass",
        "bucketclasses",
        false,
        json!({"metadata": {"name": format!("{}-sometimes", cluster.namespace)},
               "driverName": driver, "deletionPolicy": "Sometimes"}),
    )
    .await
    .expect("a policy outside Retain/Delete is refused");
    assert_eq!(refused.code, 422, "{refused:?}");

    let access_classes = cluster.cluster_scoped::<BucketAccessClass>();
    let access_class_name = format!("{}-keys", cluster.namespace);
    cluster
        .create(
            &access_classes,
            json!({"metadata": {"name": access_class_name}, "driverName": driver,
                   "authenticationType": "Key"}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketAccessClass>(None, &access_class_name);
    assert_eq!(
        access_classes
            .get(&access_class_name)
            .await
            .expect("the access class")
            .authentication_type,
        AuthenticationType::Key
    );

    let refused = post_raw(
        cluster,
        "BucketClaim",
        "bucketclaims",
        true,
        json!({"metadata": {"name": "no-protocols"}, "spec": {"bucketClassName": class_name}}),
    )
    .await
    .expect("a claim without protocols is refused");
    assert_eq!(refused.code, 422, "{refused:?}");

    // Unknown fields are pruned; the status given at create is dropped (status subresource).
    assert!(
        post_raw(
            cluster,
            "BucketClaim",
            "bucketclaims",
            true,
            json!({"metadata": {"name": "schema-check"},
                   "spec": {"bucketClassName": class_name, "protocols": ["S3"], "colour": "blue"},
                   "status": {"bucketReady": true, "bucketName": "forged"}}),
        )
        .await
        .is_none(),
        "a valid claim is stored"
    );
    let claims = cluster.namespaced::<BucketClaim>();
    let claim = claims.get("schema-check").await.expect("the claim");
    assert_eq!(claim.spec.protocols, vec![Protocol::S3]);
    assert_eq!(
        claim.status, None,
        "status comes through its subresource only"
    );
    let raw =
        serde_json::to_value(claims.get("schema-check").await.expect("the claim")).expect("JSON");
    assert!(raw["spec"].get("colour").is_none(), "pruned: {raw}");

    let bucket_name = format!("bucket-{}", claim.metadata.uid.clone().expect("a uid"));
    let buckets = cluster.cluster_scoped::<Bucket>();
    cluster
        .create(
            &buckets,
            json!({"metadata": {"name": bucket_name},
                   "spec": {"driverName": driver, "bucketClassName": class_name,
                            "bucketClaim": {"name": "schema-check", "namespace": cluster.namespace,
                                            "uid": claim.metadata.uid},
                            "protocols": ["S3"], "parameters": {"tier": "standard"}}}),
        )
        .await;
    cluster.delete_at_cleanup::<Bucket>(None, &bucket_name);
    let params = PatchParams::default();
    let bucket = buckets
        .patch_status(
            &bucket_name,
            &params,
            &Patch::Merge(json!({"status": {"bucketReady": true, "bucketID": "cosi-data-1"}})),
        )
        .await
        .expect("the bucket's status");
    let status = bucket.status.expect("a status");
    assert!(status.bucket_ready);
    assert_eq!(status.bucket_id.as_deref(), Some("cosi-data-1"));
    assert_eq!(bucket.spec.deletion_policy, DeletionPolicy::Retain);

    let claim = claims
        .patch_status(
            "schema-check",
            &params,
            &Patch::Merge(json!({"status": {"bucketReady": true, "bucketName": bucket_name}})),
        )
        .await
        .expect("the claim's status");
    let status = claim.status.expect("a status");
    assert!(status.bucket_ready);
    assert_eq!(status.bucket_name.as_deref(), Some(bucket_name.as_str()));

    // Upstream's documentation says GCS where its constant says GCP: both read as Gcp.
    assert!(
        post_raw(
            cluster,
            "BucketAccess",
            "bucketaccesses",
            true,
            json!({"metadata": {"name": "reader"},
                   "spec": {"bucketClaimName": "schema-check", "bucketAccessClassName": access_class_name,
                            "credentialsSecretName": "reader-creds", "protocol": "GCS"}}),
        )
        .await
        .is_none(),
        "a valid access is stored"
    );
    let accesses = cluster.namespaced::<BucketAccess>();
    assert_eq!(
        accesses
            .get("reader")
            .await
            .expect("the access")
            .spec
            .protocol,
        Some(Protocol::Gcp)
    );
    let access = accesses
        .patch_status(
            "reader",
            &params,
            &Patch::Merge(json!({"status": {"accessGranted": true, "accountID": "acct-1"}})),
        )
        .await
        .expect("the access's status");
    let status = access.status.expect("a status");
    assert!(status.access_granted);
    assert_eq!(status.account_id.as_deref(), Some("acct-1"));
    // Gone before the controller starts, which would otherwise take it on.
    cluster
        .delete_and_wait(&claims, "schema-check", "the schema check's claim")
        .await;
}

/// cosi-controller on a live cluster, standing in for a COSI sidecar by hand (it writes the
/// Bucket's status, and holds a Bucket with the sidecar's finalizer): a claim is protected and
/// gets `bucket-<uid>` from its class, and is ready when its Bucket is; a claim of a missing
/// class gets a FailedCreateBucket Event and its Bucket once the class exists; a brownfield
/// claim binds the existing Bucket it names; deleting a claim deletes its Bucket, and the claim
/// goes once the Bucket has gone (waiting while the sidecar's finalizer holds it).
async fn claims_get_their_buckets_and_take_them_along_when_deleted(cluster: &Cluster) {
    let driver = "s3.cosi.example.com";
    let classes = cluster.cluster_scoped::<BucketClass>();
    let class_name = format!("{}-delete", cluster.namespace);
    cluster
        .create(
            &classes,
            json!({"metadata": {"name": class_name}, "driverName": driver,
                   "deletionPolicy": "Delete", "parameters": {"tier": "gold"}}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketClass>(None, &class_name);

    let claims = cluster.namespaced::<BucketClaim>();
    let buckets = cluster.cluster_scoped::<Bucket>();
    let claim = cluster
        .create(
            &claims,
            json!({"metadata": {"name": "data"},
                   "spec": {"bucketClassName": class_name, "protocols": ["S3"]}}),
        )
        .await;
    let bucket_name = format!("bucket-{}", claim.metadata.uid.clone().expect("a uid"));
    cluster.delete_at_cleanup::<Bucket>(None, &bucket_name);
    let bucket = cluster
        .wait_for(&buckets, &bucket_name, "the claim's Bucket", |_| true)
        .await;
    assert_eq!(bucket.spec.driver_name, driver);
    assert_eq!(bucket.spec.bucket_class_name, class_name);
    assert_eq!(bucket.spec.deletion_policy, DeletionPolicy::Delete);
    assert_eq!(bucket.spec.protocols, vec![Protocol::S3]);
    assert_eq!(
        bucket.spec.parameters.as_ref().and_then(|p| p.get("tier")),
        Some(&"gold".to_string())
    );
    assert_eq!(bucket.spec.bucket_claim.uid, claim.metadata.uid);
    let claim = cluster
        .wait_for(&claims, "data", "the claim names its Bucket", |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.bucket_name.as_deref() == Some(bucket_name.as_str()))
        })
        .await;
    assert!(
        claim
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == BUCKET_CLAIM_FINALIZER)
    );
    assert!(!claim.status.expect("a status").bucket_ready);

    // The sidecar's part: the bucket is made at the provider.
    buckets
        .patch_status(
            &bucket_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"bucketReady": true, "bucketID": "data-1"}})),
        )
        .await
        .expect("the Bucket's status");
    cluster
        .wait_for(&claims, "data", "the claim is ready with its Bucket", |c| {
            c.status.as_ref().is_some_and(|s| s.bucket_ready)
        })
        .await;

    // A claim of a class that does not exist yet.
    let late_class = format!("{}-late", cluster.namespace);
    let waiting = cluster
        .create(
            &claims,
            json!({"metadata": {"name": "early"},
                   "spec": {"bucketClassName": late_class, "protocols": ["S3"]}}),
        )
        .await;
    let message = cluster
        .wait_for_event("early", FAILED_CREATE_BUCKET, "not found")
        .await;
    assert!(message.contains(&late_class), "{message}");
    cluster
        .create(
            &classes,
            json!({"metadata": {"name": late_class}, "driverName": driver}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketClass>(None, &late_class);
    let late_bucket = format!("bucket-{}", waiting.metadata.uid.clone().expect("a uid"));
    cluster.delete_at_cleanup::<Bucket>(None, &late_bucket);
    let made = cluster
        .wait_for(
            &buckets,
            &late_bucket,
            "the Bucket once its class exists",
            |_| true,
        )
        .await;
    assert_eq!(made.spec.deletion_policy, DeletionPolicy::Retain);

    // Brownfield: a Bucket an administrator made for a bucket that exists at the provider,
    // held by the sidecar's finalizer.
    let existing = format!("{}-existing", cluster.namespace);
    let sidecar_finalizer = "cosi.objectstorage.k8s.io/bucket-protection";
    cluster
        .create(
            &buckets,
            json!({"metadata": {"name": existing, "finalizers": [sidecar_finalizer]},
                   "spec": {"driverName": driver, "bucketClassName": class_name,
                            "bucketClaim": {}, "protocols": [],
                            "existingBucketID": "legacy-photos"}}),
        )
        .await;
    cluster.delete_at_cleanup::<Bucket>(None, &existing);
    let imported = cluster
        .create(
            &claims,
            json!({"metadata": {"name": "imported"},
                   "spec": {"existingBucketName": existing, "protocols": ["S3"]}}),
        )
        .await;
    let bound = cluster
        .wait_for(
            &buckets,
            &existing,
            "the existing Bucket bound to its claim",
            |b| b.spec.bucket_claim.uid == imported.metadata.uid,
        )
        .await;
    assert_eq!(bound.spec.protocols, vec![Protocol::S3]);
    cluster
        .wait_for(&claims, "imported", "the brownfield claim is ready", |c| {
            c.status.as_ref().is_some_and(|s| {
                s.bucket_ready && s.bucket_name.as_deref() == Some(existing.as_str())
            })
        })
        .await;

    // Deleting claims: their Buckets go, then the claims.
    cluster
        .delete_and_wait(&claims, "data", "the claim, after its Bucket")
        .await;
    cluster
        .wait_gone(&buckets, &bucket_name, "the deleted claim's Bucket")
        .await;

    claims
        .delete("imported", &kube::api::DeleteParams::default())
        .await
        .expect("deleting the brownfield claim");
    cluster
        .wait_for(&buckets, &existing, "its Bucket being deleted", |b| {
            b.metadata.deletion_timestamp.is_some()
        })
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        claims.get_opt("imported").await.expect("a read").is_some(),
        "the claim stays while the sidecar's finalizer holds its Bucket"
    );
    buckets
        .patch(
            &existing,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("the sidecar lets the Bucket go");
    cluster
        .wait_gone(&claims, "imported", "the claim, once its Bucket is gone")
        .await;
    // With a Retain class: the Bucket object goes all the same (the sidecar keeps the bucket).
    cluster
        .delete_and_wait(&claims, "early", "the late class's claim")
        .await;
    cluster
        .wait_gone(&buckets, &late_bucket, "the late class's Bucket")
        .await;
}

/// The whole COSI pipeline on a real S3 server (moto, IAM enforced): cosi-controller,
/// cosi-provisioner and cosi-s3. A claim's bucket is made; an access's Secret carries
/// credentials a workload (the S3 client) writes and reads with; deleting the access revokes
/// them at the endpoint; deleting the claim deletes the bucket (Delete) or keeps it (Retain); a
/// bucket made outside COSI is imported and read through a new access; a driver error is an
/// Event on the Bucket, retried until the Bucket is fixed.
async fn workloads_get_credentials_that_work_until_revoked(cluster: &Cluster) {
    let Some(stack) = CosiDriver::start(cluster).await else {
        return;
    };
    let (admin, driver_name) = (stack.moto.admin.clone(), stack.name.clone());
    let classes = cluster.cluster_scoped::<BucketClass>();
    let access_classes = cluster.cluster_scoped::<BucketAccessClass>();
    let delete_class = format!("{}-s3-delete", cluster.namespace);
    let retain_class = format!("{}-s3-retain", cluster.namespace);
    let keys_class = format!("{}-s3-keys", cluster.namespace);
    for (name, policy) in [(&delete_class, "Delete"), (&retain_class, "Retain")] {
        cluster
            .create(
                &classes,
                json!({"metadata": {"name": name}, "driverName": driver_name,
                       "deletionPolicy": policy}),
            )
            .await;
        cluster.delete_at_cleanup::<BucketClass>(None, name);
    }
    cluster
        .create(
            &access_classes,
            json!({"metadata": {"name": keys_class}, "driverName": driver_name,
                   "authenticationType": "Key"}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketAccessClass>(None, &keys_class);

    let claims = cluster.namespaced::<BucketClaim>();
    let accesses = cluster.namespaced::<BucketAccess>();
    let buckets = cluster.cluster_scoped::<Bucket>();
    let secrets = cluster.namespaced::<Secret>();

    // A bucket, and an access a workload uses.
    let photos = claim_ready(
        cluster,
        &claims,
        "photos",
        json!({"bucketClassName": delete_class}),
    )
    .await;
    let bucket_id = bucket_id_of(cluster, &buckets, &photos).await;
    let workload = access_ready(
        cluster,
        &accesses,
        &secrets,
        "photos",
        "photos-writer",
        &keys_class,
        &admin,
    )
    .await;
    workload
        .put_object(&bucket_id, "cat.jpg", b"meow")
        .await
        .expect("the workload writes with its Secret's credentials");
    assert_eq!(
        &workload
            .get_object(&bucket_id, "cat.jpg")
            .await
            .expect("and reads")[..],
        b"meow"
    );

    // Revoked with its BucketAccess: the Secret goes, the endpoint refuses the key.
    cluster
        .delete_and_wait(&accesses, "photos-writer", "the revoked access")
        .await;
    cluster
        .wait_gone(
            &secrets,
            "photos-writer-creds",
            "the revoked access's Secret",
        )
        .await;
    let refused = workload
        .get_object(&bucket_id, "cat.jpg")
        .await
        .expect_err("revoked credentials are refused");
    assert_eq!(refused.code(), Some("InvalidAccessKeyId"), "{refused}");

    // Delete policy: the bucket goes with its claim, objects and all.
    let photos_bucket = photos
        .status
        .clone()
        .and_then(|s| s.bucket_name)
        .expect("a Bucket");
    cluster
        .delete_and_wait(&claims, "photos", "the Delete claim")
        .await;
    cluster
        .wait_gone(&buckets, &photos_bucket, "the Delete claim's Bucket")
        .await;
    assert_eq!(
        admin
            .list_objects(&bucket_id)
            .await
            .expect_err("gone")
            .code(),
        Some("NoSuchBucket")
    );

    // Retain policy: the Bucket object goes, the bucket stays.
    let archive = claim_ready(
        cluster,
        &claims,
        "archive",
        json!({"bucketClassName": retain_class}),
    )
    .await;
    let archive_id = bucket_id_of(cluster, &buckets, &archive).await;
    cluster
        .delete_and_wait(&claims, "archive", "the Retain claim")
        .await;
    admin
        .list_objects(&archive_id)
        .await
        .expect("a retained bucket stays at the provider");

    // Brownfield: the retained bucket, imported by an administrator's Bucket.
    let imported = format!("{}-imported", cluster.namespace);
    admin
        .put_object(&archive_id, "old.txt", b"kept")
        .await
        .expect("an old object");
    cluster
        .create(
            &buckets,
            json!({"metadata": {"name": imported},
                   "spec": {"driverName": driver_name, "bucketClassName": retain_class,
                            "bucketClaim": {}, "protocols": ["S3"], "deletionPolicy": "Retain",
                            "existingBucketID": archive_id}}),
        )
        .await;
    cluster.delete_at_cleanup::<Bucket>(None, &imported);
    claim_ready(
        cluster,
        &claims,
        "legacy",
        json!({"existingBucketName": imported}),
    )
    .await;
    let reader = access_ready(
        cluster,
        &accesses,
        &secrets,
        "legacy",
        "legacy-reader",
        &keys_class,
        &admin,
    )
    .await;
    assert_eq!(
        &reader
            .get_object(&archive_id, "old.txt")
            .await
            .expect("the old object")[..],
        b"kept"
    );
    cluster
        .delete_and_wait(&accesses, "legacy-reader", "the brownfield access")
        .await;
    cluster
        .delete_and_wait(&claims, "legacy", "the brownfield claim")
        .await;
    cluster
        .wait_gone(&buckets, &imported, "the imported Bucket")
        .await;
    admin
        .list_objects(&archive_id)
        .await
        .expect("an imported Retain bucket stays");
    admin.delete_bucket(&archive_id).await.expect("cleaning up");

    // A driver error: an Event on the Bucket, and retries until the Bucket is fixed.
    let odd_class = format!("{}-s3-odd", cluster.namespace);
    cluster
        .create(
            &classes,
            json!({"metadata": {"name": odd_class}, "driverName": driver_name,
                   "deletionPolicy": "Delete", "parameters": {"tier": "gold"}}),
        )
        .await;
    cluster.delete_at_cleanup::<BucketClass>(None, &odd_class);
    let odd = cluster
        .create(
            &claims,
            json!({"metadata": {"name": "odd"},
                   "spec": {"bucketClassName": odd_class, "protocols": ["S3"]}}),
        )
        .await;
    let odd_bucket = format!("bucket-{}", odd.metadata.uid.clone().expect("a uid"));
    cluster.delete_at_cleanup::<Bucket>(None, &odd_bucket);
    let message =
        wait_for_cluster_event(cluster, &odd_bucket, FAILED_CREATE_BUCKET_AT_DRIVER).await;
    assert!(message.contains("unknown parameter"), "{message}");
    buckets
        .patch(
            &odd_bucket,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"parameters": null}})),
        )
        .await
        .expect("the Bucket fixed");
    cluster
        .wait_for(
            &claims,
            "odd",
            "the claim ready once its Bucket is fixed",
            |c| c.status.as_ref().is_some_and(|s| s.bucket_ready),
        )
        .await;
    cluster
        .delete_and_wait(&claims, "odd", "the fixed claim")
        .await;
    cluster.wait_gone(&buckets, &odd_bucket, "its Bucket").await;
    stack.stop().await;
}

/// Waits for an Event of `reason` about the cluster-scoped object `name` (Events of cluster
/// objects go to the `default` namespace).
async fn wait_for_cluster_event(cluster: &Cluster, name: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client.clone(), "default");
    let deadline = std::time::Instant::now() + csi_suite_scenarios::step_timeout();
    loop {
        let list = events.list(&Default::default()).await.expect("Events");
        if let Some(message) = list
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .find(|e| e.reason.as_deref() == Some(reason))
            .and_then(|e| e.message)
        {
            return message;
        }
        if std::time::Instant::now() > deadline {
            cluster.dump().await;
            panic!("timed out waiting for a {reason} Event about {name}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
