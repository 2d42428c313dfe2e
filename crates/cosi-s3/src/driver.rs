//! The COSI services of cosi-s3. A bucket is an S3 bucket of the Bucket's name; an access is an
//! IAM user named after the grant (`ba-<BucketAccess UID>`, the account ID), allowed `s3:*` on
//! its bucket and nothing else, with one access key: revoking deletes the key, the policy and
//! the user, so the endpoint refuses the key from then on.

use std::collections::HashMap;

use csi_proto::cosi::v1alpha1 as cosi_v1alpha1;
use tonic::{Request, Response, Status};

use crate::client::{AwsClient, AwsError};

/// The Status for a failed S3 or IAM call: the endpoint's refusals as the caller's mistakes
/// where they are, everything else retryable.
fn status(error: AwsError) -> Status {
    let message = error.to_string();
    match error.code() {
        Some("InvalidBucketName" | "ValidationError" | "MalformedPolicyDocument") => {
            Status::invalid_argument(message)
        }
        Some("BucketAlreadyExists") => Status::already_exists(message),
        Some("NoSuchBucket" | "NoSuchEntity") => Status::not_found(message),
        Some("AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch") => {
            Status::permission_denied(message)
        }
        _ => Status::unavailable(message),
    }
}

/// The driver: its name and the S3 endpoint it manages (with administrator credentials).
#[derive(Clone, Debug)]
pub struct S3Driver {
    pub name: String,
    pub client: AwsClient,
}

impl S3Driver {
    /// The inline policy of an access: everything on its bucket and its objects.
    fn policy(bucket: &str) -> String {
        serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Effect": "Allow",
                "Action": "s3:*",
                "Resource": [format!("arn:aws:s3:::{bucket}"), format!("arn:aws:s3:::{bucket}/*")]
            }]
        })
        .to_string()
    }

    async fn access_keys(&self, user: &str) -> Result<Vec<String>, AwsError> {
        let answer = self
            .client
            .iam("ListAccessKeys", &[("UserName", user)])
            .await?;
        Ok(crate::client::xml_values(&answer, "AccessKeyId"))
    }
}

/// A parameter this driver does not know is an error, not ignored: the class would not do
/// what its author meant.
fn no_parameters(parameters: &HashMap<String, String>, call: &str) -> Result<(), Status> {
    match parameters.keys().next() {
        Some(key) => Err(Status::invalid_argument(format!(
            "{call}: unknown parameter {key:?} (cosi-s3 takes none)"
        ))),
        None => Ok(()),
    }
}

#[tonic::async_trait]
impl cosi_v1alpha1::identity_server::Identity for S3Driver {
    async fn driver_get_info(
        &self,
        _: Request<cosi_v1alpha1::DriverGetInfoRequest>,
    ) -> Result<Response<cosi_v1alpha1::DriverGetInfoResponse>, Status> {
        Ok(Response::new(cosi_v1alpha1::DriverGetInfoResponse {
            name: self.name.clone(),
        }))
    }
}

#[tonic::async_trait]
impl cosi_v1alpha1::provisioner_server::Provisioner for S3Driver {
    async fn driver_create_bucket(
        &self,
        request: Request<cosi_v1alpha1::DriverCreateBucketRequest>,
    ) -> Result<Response<cosi_v1alpha1::DriverCreateBucketResponse>, Status> {
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(Status::invalid_argument(
                "DriverCreateBucket: name is empty",
            ));
        }
        no_parameters(&request.parameters, "DriverCreateBucket")?;
        self.client
            .create_bucket(&request.name)
            .await
            .map_err(status)?;
        tracing::info!(bucket = %request.name, "created bucket");
        Ok(Response::new(cosi_v1alpha1::DriverCreateBucketResponse {
            bucket_id: request.name,
            bucket_info: Some(cosi_v1alpha1::Protocol {
                r#type: Some(cosi_v1alpha1::protocol::Type::S3(cosi_v1alpha1::S3 {
                    region: self.client.region().to_string(),
                    signature_version: cosi_v1alpha1::S3SignatureVersion::S3v4 as i32,
                })),
            }),
        }))
    }

    async fn driver_delete_bucket(
        &self,
        request: Request<cosi_v1alpha1::DriverDeleteBucketRequest>,
    ) -> Result<Response<cosi_v1alpha1::DriverDeleteBucketResponse>, Status> {
        let request = request.into_inner();
        if request.bucket_id.is_empty() {
            return Err(Status::invalid_argument(
                "DriverDeleteBucket: bucket_id is empty",
            ));
        }
        self.client
            .delete_bucket(&request.bucket_id)
            .await
            .map_err(status)?;
        tracing::info!(bucket = %request.bucket_id, "deleted bucket");
        Ok(Response::new(cosi_v1alpha1::DriverDeleteBucketResponse {}))
    }

    async fn driver_grant_bucket_access(
        &self,
        request: Request<cosi_v1alpha1::DriverGrantBucketAccessRequest>,
    ) -> Result<Response<cosi_v1alpha1::DriverGrantBucketAccessResponse>, Status> {
        let request = request.into_inner();
        if request.bucket_id.is_empty() || request.name.is_empty() {
            return Err(Status::invalid_argument(
                "DriverGrantBucketAccess: bucket_id and name are required",
            ));
        }
        if request.authentication_type != cosi_v1alpha1::AuthenticationType::Key as i32 {
            return Err(Status::invalid_argument(
                "DriverGrantBucketAccess: cosi-s3 grants Key authentication only",
            ));
        }
        no_parameters(&request.parameters, "DriverGrantBucketAccess")?;
        let user = request.name.as_str();
        match self.client.iam("CreateUser", &[("UserName", user)]).await {
            Err(error) if error.code() == Some("EntityAlreadyExists") => {}
            other => {
                other.map_err(status)?;
            }
        }
        let policy = Self::policy(&request.bucket_id);
        self.client
            .iam(
                "PutUserPolicy",
                &[
                    ("UserName", user),
                    ("PolicyName", "cosi-bucket"),
                    ("PolicyDocument", &policy),
                ],
            )
            .await
            .map_err(status)?;
        // A grant again (its answer was lost): the secret of the earlier key cannot be read
        // back, so that key goes and a new one is minted.
        for key in self.access_keys(user).await.map_err(status)? {
            self.client
                .iam(
                    "DeleteAccessKey",
                    &[("UserName", user), ("AccessKeyId", &key)],
                )
                .await
                .map_err(status)?;
        }
        let answer = self
            .client
            .iam("CreateAccessKey", &[("UserName", user)])
            .await
            .map_err(status)?;
        let value = |tag| crate::client::xml_values(&answer, tag).into_iter().next();
        let (Some(key_id), Some(secret)) = (value("AccessKeyId"), value("SecretAccessKey")) else {
            return Err(Status::internal("CreateAccessKey answered without a key"));
        };
        tracing::info!(bucket = %request.bucket_id, account = %user, "granted access");
        let secrets = HashMap::from([
            // As given (`http://host:port`), not as `Uri` prints it, with a path `/`.
            (
                "endpoint".to_string(),
                self.client
                    .s3_endpoint()
                    .to_string()
                    .trim_end_matches('/')
                    .to_string(),
            ),
            ("region".to_string(), self.client.region().to_string()),
            ("accessKeyID".to_string(), key_id),
            ("accessSecretKey".to_string(), secret),
        ]);
        Ok(Response::new(
            cosi_v1alpha1::DriverGrantBucketAccessResponse {
                account_id: user.to_string(),
                credentials: HashMap::from([(
                    "s3".to_string(),
                    cosi_v1alpha1::CredentialDetails { secrets },
                )]),
            },
        ))
    }

    async fn driver_revoke_bucket_access(
        &self,
        request: Request<cosi_v1alpha1::DriverRevokeBucketAccessRequest>,
    ) -> Result<Response<cosi_v1alpha1::DriverRevokeBucketAccessResponse>, Status> {
        let request = request.into_inner();
        if request.account_id.is_empty() {
            return Err(Status::invalid_argument(
                "DriverRevokeBucketAccess: account_id is empty",
            ));
        }
        let user = request.account_id.as_str();
        let keys = match self.access_keys(user).await {
            Err(error) if error.code() == Some("NoSuchEntity") => {
                return Ok(Response::new(
                    cosi_v1alpha1::DriverRevokeBucketAccessResponse {},
                ));
            }
            other => other.map_err(status)?,
        };
        for key in keys {
            self.client
                .iam(
                    "DeleteAccessKey",
                    &[("UserName", user), ("AccessKeyId", &key)],
                )
                .await
                .map_err(status)?;
        }
        for (action, parameters) in [
            (
                "DeleteUserPolicy",
                &[("UserName", user), ("PolicyName", "cosi-bucket")][..],
            ),
            ("DeleteUser", &[("UserName", user)][..]),
        ] {
            match self.client.iam(action, parameters).await {
                Err(error) if error.code() == Some("NoSuchEntity") => {}
                other => {
                    other.map_err(status)?;
                }
            }
        }
        tracing::info!(bucket = %request.bucket_id, account = %user, "revoked access");
        Ok(Response::new(
            cosi_v1alpha1::DriverRevokeBucketAccessResponse {},
        ))
    }
}
