//! The adapters: the API server (the snapshot's objects, the driver's SnapshotMetadataService,
//! a TokenRequest, a SelfSubjectReview for the caller's own ServiceAccount) and the gRPC
//! service over TLS. Steps in upstream's order; each error names the call that failed, as
//! upstream's do.

use std::io::Write;
use std::path::{Path, PathBuf};

use csi_grpc::conn::GoStatus;
use csi_kinds::cbt::SnapshotMetadataService;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use csi_proto::snapshotmetadata::snapshot_metadata_client::SnapshotMetadataClient;
use csi_proto::snapshotmetadata::{
    GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest,
    GetMetadataDeltaResponse,
};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use super::emit::{Emitter, JsonEmitter, Record, TableEmitter};
use super::flags::{ListerArgs, OutputFormat};
use super::resolve::{self, Previous, Query, ResolveError, ServiceAccountRef};

/// A token for the SnapshotMetadata service: a credential, so its `Debug` hides it.
#[derive(Clone)]
pub struct SecurityToken(String);

impl SecurityToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token, for the request that carries it.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecurityToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecurityToken(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListerError {
    #[error(transparent)]
    KubeClient(#[from] csi_sidecar::kube::KubeClientError),
    #[error("SelfSubjectReviews.Create(): {0}")]
    SelfSubjectReview(#[source] kube::Error),
    #[error("VolumeSnapshots.Get({namespace}/{name}): {source}")]
    GetSnapshot {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "VolumeSnapshotContents.Get({content}) for VolumeSnapshot({namespace}/{name}): {source}"
    )]
    GetContent {
        content: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("SnapshotMetadataServices.Get({driver}): {source}")]
    GetService { driver: String, source: kube::Error },
    #[error("ServiceAccounts.CreateToken({namespace}/{name}): {source}")]
    CreateToken {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("ServiceAccounts.CreateToken({namespace}/{name}): the response has no token")]
    NoToken { namespace: String, name: String },
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("failed to add the SnapshotMetadataService CR CA certificate: {0}")]
    CaCert(String),
    #[error("connecting to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("{call}: {}", GoStatus(status))]
    Call { call: String, status: Status },
    #[error("{call}.Recv: {}", GoStatus(status))]
    Recv { call: String, status: Status },
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

impl ListerError {
    /// The gRPC status of a failed call or stream.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Self::Call { status, .. } | Self::Recv { status, .. } => Some(status),
            _ => None,
        }
    }
}

/// The binary: resolve, call, print every record in the chosen format; the number of records.
pub async fn run(args: &ListerArgs, out: impl Write) -> Result<usize, ListerError> {
    let lister = Lister::new(kube_client(args.kubeconfig.as_deref()).await?);
    let query = args.query();
    let account = args.service_account();
    let expiry = args.token_expiry_secs();
    match args.output_format {
        OutputFormat::Table => {
            let mut table = TableEmitter(out);
            lister.list(&query, account, expiry, &mut table).await
        }
        OutputFormat::Json => {
            let mut json = JsonEmitter(out);
            lister.list(&query, account, expiry, &mut json).await
        }
    }
}

/// Upstream's configuration: the kubeconfig given, else `~/.kube/config` when it exists,
/// else the in-cluster one.
async fn kube_client(kubeconfig: Option<&Path>) -> Result<Client, ListerError> {
    let home_config = || {
        let path = PathBuf::from(std::env::var_os("HOME")?).join(".kube/config");
        path.exists().then_some(path)
    };
    let path = kubeconfig.map(Path::to_path_buf).or_else(home_config);
    let args = csi_sidecar::flags::KubeArgs {
        kubeconfig: path.map(|p| p.display().to_string()).unwrap_or_default(),
        kube_api_qps: None,
        kube_api_burst: None,
    };
    let config = csi_sidecar::kube::config(&args).await?;
    Ok(csi_sidecar::kube::client_from_config(config, None)?)
}

/// The API-server half of the client.
#[derive(Clone)]
pub struct Lister {
    client: Client,
}

impl std::fmt::Debug for Lister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lister").finish_non_exhaustive()
    }
}

impl Lister {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Streams the records of `query` into `emitter` (then its `done`); the number of records.
    pub async fn list(
        &self,
        query: &Query,
        account: Option<ServiceAccountRef>,
        token_expiry_secs: i64,
        emitter: &mut impl Emitter,
    ) -> Result<usize, ListerError> {
        let mut stream = self.open(query, account, token_expiry_secs).await?;
        let mut records = 0;
        while let Some(record) = stream.next().await? {
            records += 1;
            emitter.record(records, &record)?;
        }
        emitter.done(records)?;
        Ok(records)
    }

    /// Everything up to the open stream: the token's ServiceAccount (the caller's own when
    /// `account` is `None`), the driver, its service, the token, the connection, the base
    /// snapshot's handle.
    pub async fn open(
        &self,
        query: &Query,
        account: Option<ServiceAccountRef>,
        token_expiry_secs: i64,
    ) -> Result<MetadataStream, ListerError> {
        let account = match account {
            Some(account) => account,
            None => self.own_service_account().await?,
        };
        let driver = self.driver_of(&query.namespace, &query.snapshot).await?;
        let service = self.service(&driver).await?;
        let token = self
            .token(&account, &service.spec.audience, token_expiry_secs)
            .await?;
        let client = connect(&service).await?;
        let base = match &query.previous {
            None => None,
            Some(Previous::Id(handle)) => Some(handle.clone()),
            Some(Previous::Name(name)) => Some(self.previous_handle(&query.namespace, name).await?),
        };
        MetadataStream::open(client, &token, query, base).await
    }

    /// The ServiceAccount this client authenticates as.
    pub async fn own_service_account(&self) -> Result<ServiceAccountRef, ListerError> {
        let reviews: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = reviews
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(ListerError::SelfSubjectReview)?;
        let username = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default();
        Ok(resolve::service_account_of(&username)?)
    }

    async fn snapshot(&self, namespace: &str, name: &str) -> Result<VolumeSnapshot, ListerError> {
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), namespace);
        snapshots
            .get(name)
            .await
            .map_err(|source| ListerError::GetSnapshot {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            })
    }

    async fn content(
        &self,
        snapshot: &VolumeSnapshot,
        content: &str,
    ) -> Result<VolumeSnapshotContent, ListerError> {
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        contents
            .get(content)
            .await
            .map_err(|source| ListerError::GetContent {
                content: content.to_string(),
                namespace: snapshot.metadata.namespace.clone().unwrap_or_default(),
                name: snapshot.metadata.name.clone().unwrap_or_default(),
                source,
            })
    }

    /// The CSI driver of a VolumeSnapshot (its bound content's `spec.driver`).
    pub async fn driver_of(&self, namespace: &str, name: &str) -> Result<String, ListerError> {
        let snapshot = self.snapshot(namespace, name).await?;
        let content = resolve::target_content(&snapshot)?;
        Ok(self.content(&snapshot, content).await?.spec.driver)
    }

    /// The CSI snapshot handle of a previous VolumeSnapshot.
    pub async fn previous_handle(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, ListerError> {
        let snapshot = self.snapshot(namespace, name).await?;
        let content = self
            .content(&snapshot, resolve::previous_content(&snapshot)?)
            .await?;
        Ok(resolve::previous_handle(&snapshot, &content)?)
    }

    /// The SnapshotMetadataService object of `driver`.
    pub async fn service(&self, driver: &str) -> Result<SnapshotMetadataService, ListerError> {
        let services: Api<SnapshotMetadataService> = Api::all(self.client.clone());
        services
            .get(driver)
            .await
            .map_err(|source| ListerError::GetService {
                driver: driver.to_string(),
                source,
            })
    }

    /// A token of `account` for `audience` (TokenRequest), valid for `expiry_secs`.
    pub async fn token(
        &self,
        account: &ServiceAccountRef,
        audience: &str,
        expiry_secs: i64,
    ) -> Result<SecurityToken, ListerError> {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), &account.namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_string()],
                expiration_seconds: Some(expiry_secs),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let response = accounts
            .create_token_request(&account.name, &PostParams::default(), &request)
            .await
            .map_err(|source| ListerError::CreateToken {
                namespace: account.namespace.clone(),
                name: account.name.clone(),
                source,
            })?;
        match response.status.map(|s| s.token) {
            Some(token) if !token.is_empty() => Ok(SecurityToken(token)),
            _ => Err(ListerError::NoToken {
                namespace: account.namespace.clone(),
                name: account.name.clone(),
            }),
        }
    }
}

/// A client of the service at the object's address, trusting only the object's CA bundle.
pub async fn connect(
    service: &SnapshotMetadataService,
) -> Result<SnapshotMetadataClient<Channel>, ListerError> {
    use csi_grpc::tls::{ConnectError, TlsError};
    let address = &service.spec.address;
    match csi_grpc::tls::connect(address, &service.spec.ca_cert.0).await {
        Ok(channel) => Ok(SnapshotMetadataClient::new(channel)),
        Err(ConnectError::Tls(error @ (TlsError::CaBundle(_) | TlsError::NoCaCertificate))) => {
            Err(ListerError::CaCert(error.to_string()))
        }
        Err(error) => Err(ListerError::Connect {
            address: address.clone(),
            reason: error.to_string(),
        }),
    }
}

enum Messages {
    Allocated(Streaming<GetMetadataAllocatedResponse>),
    Delta(Streaming<GetMetadataDeltaResponse>),
}

/// The records of one GetMetadataAllocated or GetMetadataDelta call, in order. Dropping it
/// cancels the call.
pub struct MetadataStream {
    messages: Messages,
    /// The call as upstream's errors name it.
    call: String,
}

impl std::fmt::Debug for MetadataStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataStream")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

impl MetadataStream {
    /// Calls GetMetadataDelta from `base` (a CSI snapshot handle) when given, else
    /// GetMetadataAllocated.
    pub async fn open(
        mut client: SnapshotMetadataClient<Channel>,
        token: &SecurityToken,
        query: &Query,
        base: Option<String>,
    ) -> Result<Self, ListerError> {
        let Query {
            namespace,
            snapshot,
            starting_offset,
            max_results,
            ..
        } = query.clone();
        let (messages, call) = match base {
            None => {
                let call = format!("GetMetadataAllocated({namespace},{snapshot})");
                let request = GetMetadataAllocatedRequest {
                    security_token: token.secret().to_string(),
                    namespace,
                    snapshot_name: snapshot,
                    starting_offset,
                    max_results,
                };
                match client.get_metadata_allocated(request).await {
                    Ok(response) => (Messages::Allocated(response.into_inner()), call),
                    Err(status) => return Err(ListerError::Call { call, status }),
                }
            }
            Some(base) => {
                let call = format!("GetMetadataDelta({namespace},{base},{snapshot})");
                let request = GetMetadataDeltaRequest {
                    security_token: token.secret().to_string(),
                    namespace,
                    base_snapshot_id: base,
                    target_snapshot_name: snapshot,
                    starting_offset,
                    max_results,
                };
                match client.get_metadata_delta(request).await {
                    Ok(response) => (Messages::Delta(response.into_inner()), call),
                    Err(status) => return Err(ListerError::Call { call, status }),
                }
            }
        };
        Ok(Self { messages, call })
    }

    /// The next record; `None` once the stream has ended.
    pub async fn next(&mut self) -> Result<Option<Record>, ListerError> {
        let message = match &mut self.messages {
            Messages::Allocated(stream) => stream.message().await.map(|m| {
                m.map(|m| Record {
                    block_metadata_type: m.block_metadata_type,
                    volume_capacity_bytes: m.volume_capacity_bytes,
                    block_metadata: m.block_metadata,
                })
            }),
            Messages::Delta(stream) => stream.message().await.map(|m| {
                m.map(|m| Record {
                    block_metadata_type: m.block_metadata_type,
                    volume_capacity_bytes: m.volume_capacity_bytes,
                    block_metadata: m.block_metadata,
                })
            }),
        };
        message.map_err(|status| ListerError::Recv {
            call: self.call.clone(),
            status,
        })
    }
}
