//! The COSI pipeline for the scenarios and the demo: the sample driver cosi-s3 on a real S3
//! server (moto, IAM enforced) with the cosi-provisioner sidecar beside it, and the steps a
//! user takes: a ready claim, a granted access and the workload's S3 client from its Secret.

use cosi_s3::client::AwsClient;
use cosi_s3::driver::S3Driver;
use csi_grpc::conn::Endpoint;
use csi_kinds::objectstorage::{Bucket, BucketAccess, BucketClaim};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::moto::{Moto, keys};
use crate::{Cluster, Sidecar};

/// cosi-s3 serving on a socket of its own, the S3 server behind it and the sidecar beside it;
/// all stop when this is dropped.
#[derive(Debug)]
pub struct CosiDriver {
    pub moto: Moto,
    /// The driver's name, unique to the scenario (classes name it).
    pub name: String,
    _dir: tempfile::TempDir,
    _stop_driver: DropGuard,
    sidecar: Sidecar,
}

impl CosiDriver {
    /// `None` where moto is not installed outside CI ([`Moto::start`]).
    pub async fn start(cluster: &Cluster) -> Option<Self> {
        let moto = Moto::start().await?;
        let dir = tempfile::tempdir().expect("a directory");
        let socket = Endpoint::from_path(dir.path().join("cosi.sock")).expect("a socket path");
        let stop = CancellationToken::new();
        let driver = S3Driver {
            name: format!("s3.{}.cosi.example.com", cluster.namespace),
            client: moto.admin.clone(),
        };
        let name = driver.name.clone();
        tokio::spawn({
            let (socket, stop) = (socket.clone(), stop.clone());
            async move { cosi_s3::serve::serve(driver, &socket, stop).await }
        });
        let sidecar = cluster.start_cosi_provisioner(&socket).await;
        Some(Self {
            moto,
            name,
            _dir: dir,
            _stop_driver: stop.drop_guard(),
            sidecar,
        })
    }

    /// Stops the sidecar (waiting for it), then the driver and the S3 server.
    pub async fn stop(self) {
        let Self { sidecar, .. } = self;
        sidecar.stop().await;
    }
}

/// Creates a claim of `spec` (S3) and waits until it is ready.
pub async fn claim_ready(
    cluster: &Cluster,
    claims: &Api<BucketClaim>,
    name: &str,
    mut spec: serde_json::Value,
) -> BucketClaim {
    spec["protocols"] = json!(["S3"]);
    cluster
        .create(claims, json!({"metadata": {"name": name}, "spec": spec}))
        .await;
    cluster
        .wait_for(claims, name, "the claim ready", |c| {
            c.status.as_ref().is_some_and(|s| s.bucket_ready)
        })
        .await
}

/// The provider's ID of a ready claim's bucket.
pub async fn bucket_id_of(cluster: &Cluster, buckets: &Api<Bucket>, claim: &BucketClaim) -> String {
    let name = claim
        .status
        .as_ref()
        .and_then(|s| s.bucket_name.clone())
        .expect("a ready claim names its Bucket");
    let bucket = cluster
        .wait_for(buckets, &name, "the Bucket ready", |b| {
            b.status.as_ref().is_some_and(|s| s.bucket_ready)
        })
        .await;
    bucket
        .status
        .and_then(|s| s.bucket_id)
        .expect("a ready Bucket has an ID")
}

/// Creates an access `name` to `claim` with Secret `<name>-creds`, waits until it is granted
/// and returns an S3 client with the Secret's credentials, as a workload would use them.
pub async fn access_ready(
    cluster: &Cluster,
    accesses: &Api<BucketAccess>,
    secrets: &Api<Secret>,
    claim: &str,
    name: &str,
    class: &str,
    admin: &AwsClient,
) -> AwsClient {
    let secret_name = format!("{name}-creds");
    cluster
        .create(
            accesses,
            json!({"metadata": {"name": name},
                   "spec": {"bucketClaimName": claim, "bucketAccessClassName": class,
                            "credentialsSecretName": secret_name, "protocol": "S3"}}),
        )
        .await;
    cluster
        .wait_for(accesses, name, "the access granted", |a| {
            a.status.as_ref().is_some_and(|s| s.access_granted)
        })
        .await;
    let secret = cluster
        .wait_for(secrets, &secret_name, "the credentials Secret", |_| true)
        .await;
    let info = secret
        .data
        .as_ref()
        .and_then(|d| d.get("BucketInfo"))
        .expect("a BucketInfo key");
    let info: serde_json::Value = serde_json::from_slice(&info.0).expect("BucketInfo is JSON");
    assert_eq!(info["spec"]["authenticationType"], "Key", "{info}");
    assert_eq!(info["spec"]["protocols"], json!(["S3"]), "{info}");
    let s3 = &info["spec"]["secretS3"];
    admin.with_credentials(keys(
        s3["accessKeyID"].as_str().expect("accessKeyID"),
        s3["accessSecretKey"].as_str().expect("accessSecretKey"),
    ))
}
