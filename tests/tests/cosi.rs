//! COSI's API on a live cluster: the objectstorage.k8s.io/v1alpha1 CRDs generated from the Rust
//! types install on kube-sim and on a real API server (v1.19 serves CRD v1), and the server
//! holds the five kinds to their schema as upstream's CRDs do: the class's deletion policy
//! defaults to Retain, a policy outside Retain/Delete and a claim without protocols are refused,
//! fields the schema does not know are pruned, and status is written through its subresource
//! only. What the types read back is what was written (a `GCS` protocol reads as GCP).

use cosi::api::{
    AuthenticationType, Bucket, BucketAccess, BucketAccessClass, BucketClaim, BucketClass,
    DeletionPolicy, Protocol,
};
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::install_cosi_crds;
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

#[tokio::test]
async fn cosi_kinds_are_served_and_held_to_their_schema() {
    let cluster = Cluster::start("cosi-api").await;
    install_cosi_crds(&cluster.client).await;
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
        &cluster,
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
        &cluster,
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
            &cluster,
            "BucketClaim",
            "bucketclaims",
            true,
            json!({"metadata": {"name": "data"},
                   "spec": {"bucketClassName": class_name, "protocols": ["S3"], "colour": "blue"},
                   "status": {"bucketReady": true, "bucketName": "forged"}}),
        )
        .await
        .is_none(),
        "a valid claim is stored"
    );
    let claims = cluster.namespaced::<BucketClaim>();
    let claim = claims.get("data").await.expect("the claim");
    assert_eq!(claim.spec.protocols, vec![Protocol::S3]);
    assert_eq!(
        claim.status, None,
        "status comes through its subresource only"
    );
    let raw = serde_json::to_value(claims.get("data").await.expect("the claim")).expect("JSON");
    assert!(raw["spec"].get("colour").is_none(), "pruned: {raw}");

    let bucket_name = format!("bucket-{}", claim.metadata.uid.clone().expect("a uid"));
    let buckets = cluster.cluster_scoped::<Bucket>();
    cluster
        .create(
            &buckets,
            json!({"metadata": {"name": bucket_name},
                   "spec": {"driverName": driver, "bucketClassName": class_name,
                            "bucketClaim": {"name": "data", "namespace": cluster.namespace,
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
            "data",
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
            &cluster,
            "BucketAccess",
            "bucketaccesses",
            true,
            json!({"metadata": {"name": "reader"},
                   "spec": {"bucketClaimName": "data", "bucketAccessClassName": access_class_name,
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
}
