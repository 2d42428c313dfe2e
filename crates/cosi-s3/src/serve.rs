//! cosi-s3's command line and server: the COSI socket (`COSI_ENDPOINT`: a Unix socket whose
//! path ends in `.sock`, as the spec requires), the S3 endpoint and its administrator's key.

use clap::Parser;
use csi_grpc::conn::Endpoint;
use csi_grpc::flags::CommonArgs;
use csi_proto::cosi::v1alpha1::identity_server::IdentityServer;
use csi_proto::cosi::v1alpha1::provisioner_server::ProvisionerServer;
use tokio_util::sync::CancellationToken;

use crate::client::AwsClient;
use crate::driver::S3Driver;
use crate::sigv4::Credentials;

/// cosi-s3: the sample COSI driver, for any S3 endpoint with IAM.
#[derive(Parser, Debug, Clone)]
#[command(name = "cosi-s3", version)]
pub struct S3Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The COSI socket the sidecar talks to.
    #[arg(
        long,
        env = "COSI_ENDPOINT",
        default_value = "unix:///var/lib/cosi/cosi.sock"
    )]
    pub cosi_endpoint: String,

    /// The driver's name (DriverGetInfo): classes name it in `driverName`.
    #[arg(long, default_value = "s3.cosi.csi-suite.io")]
    pub driver_name: String,

    /// The S3 endpoint, `http(s)://host[:port]` (path-style requests).
    #[arg(long, env = "S3_ENDPOINT")]
    pub s3_endpoint: http::Uri,

    /// The IAM endpoint that mints the per-access keys; default: the S3 endpoint.
    #[arg(long, env = "IAM_ENDPOINT")]
    pub iam_endpoint: Option<http::Uri>,

    /// The region requests are signed for and buckets report.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub region: String,

    /// The administrator's access key ID (creates buckets and IAM users).
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    pub access_key_id: String,

    /// Its secret: from the environment (a Secret), never a flag another user could read.
    #[arg(skip)]
    pub secret_access_key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("{0}")]
    Config(String),
    #[error("the COSI endpoint {endpoint}: {source}")]
    Listen {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("the gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

impl S3Args {
    /// The flags, with the secret from `AWS_SECRET_ACCESS_KEY`.
    pub fn from_env() -> Self {
        let mut args = Self::parse();
        args.secret_access_key = std::env::var("AWS_SECRET_ACCESS_KEY").ok();
        args
    }

    pub fn endpoint(&self) -> Result<Endpoint, S3Error> {
        let endpoint =
            Endpoint::parse(&self.cosi_endpoint).map_err(|e| S3Error::Config(e.to_string()))?;
        if endpoint.path().extension().is_none_or(|e| e != "sock") {
            return Err(S3Error::Config(format!(
                "COSI_ENDPOINT {}: the socket's name must end in .sock",
                self.cosi_endpoint
            )));
        }
        Ok(endpoint)
    }

    pub fn driver(&self) -> Result<S3Driver, S3Error> {
        let secret = self
            .secret_access_key
            .clone()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| S3Error::Config("AWS_SECRET_ACCESS_KEY is not set".into()))?;
        let client = AwsClient::new(
            self.s3_endpoint.clone(),
            self.iam_endpoint
                .clone()
                .unwrap_or(self.s3_endpoint.clone()),
            &self.region,
            Credentials {
                access_key_id: self.access_key_id.clone(),
                secret_access_key: secret,
            },
        )
        .map_err(|e| S3Error::Config(format!("loading the system's root certificates: {e}")))?;
        Ok(S3Driver {
            name: self.driver_name.clone(),
            client,
        })
    }
}

/// Serves the driver's COSI services on `endpoint` until `shutdown`.
pub async fn serve(
    driver: S3Driver,
    endpoint: &Endpoint,
    shutdown: CancellationToken,
) -> Result<(), S3Error> {
    let listener = endpoint.listen().map_err(|source| S3Error::Listen {
        endpoint: endpoint.to_string(),
        source,
    })?;
    tracing::info!(%endpoint, driver = %driver.name, s3 = %driver.client.s3_endpoint(), "serving COSI");
    let served = csi_grpc::grpc_server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_service(ProvisionerServer::new(driver))
        .serve_with_incoming_shutdown(
            csi_grpc::grpc_server::incoming(listener),
            shutdown.cancelled(),
        )
        .await;
    let _ = std::fs::remove_file(endpoint.path());
    Ok(served?)
}
