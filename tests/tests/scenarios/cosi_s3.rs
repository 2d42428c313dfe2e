//! cosi-s3 against a real S3 server on loopback: moto in server mode with IAM enforcement on
//! (`INITIAL_NO_AUTH_ACTION_COUNT`: after the set-up's calls, every request must be signed by a
//! key IAM knows and allows). Over the driver's COSI socket: a bucket is made (twice: the same
//! answer), an access is granted and its key puts and reads objects in its bucket only; a second
//! grant of the same name replaces the key; revoking makes the endpoint refuse the key; the
//! bucket is deleted with its objects (twice: still fine). Needs moto
//! ([`csi_suite_scenarios::moto`]); no cluster.

use std::time::Duration;

use cosi_s3::driver::S3Driver;
use cosi_s3::sigv4::Credentials;
use csi_grpc::conn::{CsiConnection, Endpoint};
use csi_proto::cosi::v1alpha1 as proto;
use csi_suite_scenarios::moto::{Moto, keys};
use proto::identity_client::IdentityClient;
use proto::provisioner_client::ProvisionerClient;
use tokio_util::sync::CancellationToken;

fn s3_keys(response: &proto::DriverGrantBucketAccessResponse) -> Credentials {
    let secrets = &response.credentials["s3"].secrets;
    keys(&secrets["accessKeyID"], &secrets["accessSecretKey"])
}

#[tokio::test]
async fn buckets_and_per_access_keys_the_endpoint_enforces() {
    let Some(moto) = Moto::start().await else {
        return;
    };
    let (endpoint, admin) = (moto.endpoint.clone(), moto.admin.clone());
    let outsider = admin.with_credentials(keys("AKIAUNKNOWN", "nothing"));
    assert!(
        outsider.list_objects("anything").await.is_err(),
        "enforcement is on: an unknown key is refused"
    );

    let dir = tempfile::tempdir().unwrap();
    let socket = Endpoint::from_path(dir.path().join("cosi.sock")).unwrap();
    let shutdown = CancellationToken::new();
    let driver = S3Driver {
        name: "s3.cosi.csi-suite.io".into(),
        client: admin.clone(),
    };
    let serving = tokio::spawn({
        let (socket, shutdown) = (socket.clone(), shutdown.clone());
        async move { cosi_s3::serve::serve(driver, &socket, shutdown).await }
    });
    let connection: CsiConnection = csi_grpc::conn::connect(
        &socket,
        Duration::from_secs(10),
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .expect("the driver's socket");
    let info = IdentityClient::new(connection.channel())
        .driver_get_info(proto::DriverGetInfoRequest {})
        .await
        .expect("DriverGetInfo")
        .into_inner();
    assert_eq!(info.name, "s3.cosi.csi-suite.io");
    let mut provisioner = ProvisionerClient::new(connection.channel());

    let create = proto::DriverCreateBucketRequest {
        name: "bucket-photos".into(),
        ..Default::default()
    };
    for _ in 0..2 {
        let created = provisioner
            .driver_create_bucket(create.clone())
            .await
            .expect("DriverCreateBucket (again: the same answer)")
            .into_inner();
        assert_eq!(created.bucket_id, "bucket-photos");
    }
    admin
        .create_bucket("bucket-other")
        .await
        .expect("another bucket");
    let refused = provisioner
        .driver_create_bucket(proto::DriverCreateBucketRequest {
            name: "bucket-odd".into(),
            parameters: [("tier".to_string(), "gold".to_string())].into(),
        })
        .await
        .expect_err("an unknown parameter");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let grant = proto::DriverGrantBucketAccessRequest {
        bucket_id: "bucket-photos".into(),
        name: "ba-1234".into(),
        authentication_type: proto::AuthenticationType::Key as i32,
        ..Default::default()
    };
    let granted = provisioner
        .driver_grant_bucket_access(grant.clone())
        .await
        .expect("DriverGrantBucketAccess")
        .into_inner();
    assert_eq!(granted.account_id, "ba-1234");
    let secrets = &granted.credentials["s3"].secrets;
    let authority = endpoint.authority().expect("an authority");
    assert_eq!(secrets["endpoint"], format!("http://{authority}"));
    assert!(!format!("{granted:?}").contains(&secrets["accessSecretKey"]));
    let workload = admin.with_credentials(s3_keys(&granted));
    workload
        .put_object("bucket-photos", "cat.jpg", b"meow")
        .await
        .expect("the access writes its bucket");
    assert_eq!(
        &workload
            .get_object("bucket-photos", "cat.jpg")
            .await
            .expect("and reads it")[..],
        b"meow"
    );
    assert!(
        workload
            .put_object("bucket-other", "cat.jpg", b"meow")
            .await
            .is_err(),
        "another bucket is refused"
    );

    // The same grant again (its answer lost): a new key, the old one no longer works.
    let again = provisioner
        .driver_grant_bucket_access(grant)
        .await
        .expect("DriverGrantBucketAccess again")
        .into_inner();
    let renewed = admin.with_credentials(s3_keys(&again));
    renewed
        .get_object("bucket-photos", "cat.jpg")
        .await
        .expect("the new key reads");
    assert!(
        workload
            .get_object("bucket-photos", "cat.jpg")
            .await
            .is_err()
    );

    let revoke = proto::DriverRevokeBucketAccessRequest {
        bucket_id: "bucket-photos".into(),
        account_id: "ba-1234".into(),
        ..Default::default()
    };
    provisioner
        .driver_revoke_bucket_access(revoke.clone())
        .await
        .expect("DriverRevokeBucketAccess");
    let error = renewed
        .get_object("bucket-photos", "cat.jpg")
        .await
        .expect_err("a revoked key is refused");
    assert_eq!(error.code(), Some("InvalidAccessKeyId"), "{error}");
    provisioner
        .driver_revoke_bucket_access(revoke)
        .await
        .expect("revoking again is fine");

    for _ in 0..2 {
        provisioner
            .driver_delete_bucket(proto::DriverDeleteBucketRequest {
                bucket_id: "bucket-photos".into(),
                ..Default::default()
            })
            .await
            .expect("DriverDeleteBucket, with its objects (again: fine)");
    }
    assert_eq!(
        admin
            .list_objects("bucket-photos")
            .await
            .expect_err("the bucket is gone")
            .code(),
        Some("NoSuchBucket")
    );
    shutdown.cancel();
    serving.await.unwrap().expect("the server ends cleanly");
}
