//! The SnapshotMetadata gRPC service: the adapters around [`crate::plan`] (TokenReview,
//! SubjectAccessReview, the snapshot GETs, the class and its Secret, the driver's stream) and
//! the relay of the driver's stream to the client.
//!
//! A request runs under the max streaming duration from its start, as upstream's handler
//! context: the Kubernetes calls, opening the driver's stream (its gRPC deadline says the time
//! left) and every message. The relay holds at most [`RELAY_DEPTH`] messages: the driver is
//! read only as fast as the client reads, and a client that goes away cancels the driver's
//! stream. The security token is never logged.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_kinds::cbt::SnapshotMetadataService;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use csi_proto::snapshotmetadata as api;
use csi_proto::snapshotmetadata::snapshot_metadata_server::SnapshotMetadata;
use csi_sidecar::api_errors::GoApiError;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, timeout_at};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::metrics::RequestMetrics;
use crate::plan::{self, ClassChoice, Plan, Resolved, messages};

/// Messages the relay holds between the driver and a slow client.
pub const RELAY_DEPTH: usize = 4;

/// What the service needs, set up by [`crate::run`] (or a test).
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    /// `--audience`; empty: the SnapshotMetadataService's.
    pub audience: String,
    pub max_streaming_duration: Duration,
}

/// The service; cheap to clone.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    metrics: RequestMetrics,
    ready: watch::Receiver<bool>,
    operations: AtomicU64,
}

impl Service {
    /// `ready` is the readiness `/health` reports too: requests are refused while it is false
    /// (before the driver is validated, and from shutdown on).
    pub fn new(
        client: Client,
        csi: CsiConnection,
        settings: Settings,
        metrics: RequestMetrics,
        ready: watch::Receiver<bool>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                csi,
                settings,
                metrics,
                ready,
                operations: AtomicU64::new(0),
            }),
        }
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client has no Debug; the rest says which service this is.
        f.debug_struct("Inner")
            .field("csi", &self.csi)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

type Relay<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl SnapshotMetadata for Service {
    type GetMetadataAllocatedStream = Relay<api::GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Relay<api::GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<api::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let request = request.into_inner();
        let span = tracing::info_span!(
            "GetMetadataAllocated",
            op = %self.inner.operation_id("GetMetadataAllocated"),
            namespace = %request.namespace,
            snapshot_name = %request.snapshot_name,
            starting_offset = request.starting_offset,
            max_results = request.max_results,
        );
        let inner = Arc::clone(&self.inner);
        let token = request.security_token.clone();
        let labels = (
            format!("{}/{}", request.namespace, request.snapshot_name),
            String::new(),
        );
        self.inner
            .serve(
                plan::validate_allocated(&request),
                labels,
                token,
                |plan, resolved, secrets, deadline| async move {
                    let csi_request = plan::csi_allocated_request(&plan, &resolved, secrets);
                    tracing::debug!(snapshot_id = %csi_request.snapshot_id, "calling CSI driver");
                    let mut client = SnapshotMetadataClient::new(inner.csi.channel());
                    let stream = client
                        .get_metadata_allocated(with_deadline(csi_request, deadline))
                        .await;
                    log_open_failure(&stream, "csi.GetMetadataAllocated");
                    Ok(stream?.into_inner())
                },
                plan::allocated_response,
            )
            .instrument(span)
            .await
    }

    async fn get_metadata_delta(
        &self,
        request: Request<api::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let request = request.into_inner();
        let span = tracing::info_span!(
            "GetMetadataDelta",
            op = %self.inner.operation_id("GetMetadataDelta"),
            namespace = %request.namespace,
            base_snapshot_id = %request.base_snapshot_id,
            target_snapshot_name = %request.target_snapshot_name,
            starting_offset = request.starting_offset,
            max_results = request.max_results,
        );
        let inner = Arc::clone(&self.inner);
        let token = request.security_token.clone();
        let labels = (
            format!("{}/{}", request.namespace, request.target_snapshot_name),
            request.base_snapshot_id.clone(),
        );
        self.inner
            .serve(
                plan::validate_delta(&request),
                labels,
                token,
                |plan, resolved, secrets, deadline| async move {
                    let csi_request = plan::csi_delta_request(&plan, &resolved, secrets);
                    tracing::debug!(
                        base_snapshot_id = %csi_request.base_snapshot_id,
                        target_snapshot_id = %csi_request.target_snapshot_id,
                        "calling CSI driver"
                    );
                    let mut client = SnapshotMetadataClient::new(inner.csi.channel());
                    let stream = client
                        .get_metadata_delta(with_deadline(csi_request, deadline))
                        .await;
                    log_open_failure(&stream, "csi.GetMetadataDelta");
                    Ok(stream?.into_inner())
                },
                plan::delta_response,
            )
            .instrument(span)
            .await
    }
}

/// A CSI request whose gRPC deadline is the request's.
fn with_deadline<T>(message: T, deadline: Instant) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    request
}

fn log_open_failure<T>(result: &Result<T, Status>, call: &str) {
    if let Err(status) = result {
        tracing::error!(code = ?status.code(), message = status.message(), "{call}");
    }
}

impl Inner {
    fn operation_id(&self, operation: &str) -> String {
        format!(
            "{operation}-{}",
            self.operations.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    /// One request: resolve it to the driver's stream (`open`), then relay that stream through
    /// `convert`. The request is recorded in the metrics when it ends, however it ends, with
    /// `labels` (`target_snapshot`, `base_snapshot`) taken from the request as it came.
    async fn serve<C, A, O, F>(
        self: &Arc<Self>,
        plan: Result<Plan, Status>,
        labels: (String, String),
        token: String,
        open: O,
        convert: fn(C) -> A,
    ) -> Result<Response<Relay<A>>, Status>
    where
        O: FnOnce(Plan, Resolved, HashMap<String, String>, Instant) -> F,
        F: Future<Output = Result<Streaming<C>, Status>>,
        C: Send + 'static,
        A: Send + 'static,
    {
        let started = Instant::now();
        let deadline = started + self.settings.max_streaming_duration;
        let plan = match plan {
            Ok(plan) => plan,
            Err(status) => {
                tracing::error!(message = status.message(), "validation failed");
                self.metrics
                    .record(labels.0, labels.1, status.code(), started.elapsed());
                return Err(status);
            }
        };
        let opened = timeout_at(deadline, async {
            let (resolved, secrets) = self.resolve(&token, &plan).await?;
            open(plan, resolved, secrets, deadline).await
        })
        .await
        .unwrap_or_else(|_| Err(deadline_exceeded()));
        let stream = match opened {
            Ok(stream) => stream,
            Err(status) => {
                self.metrics
                    .record(labels.0, labels.1, status.code(), started.elapsed());
                return Err(status);
            }
        };
        let (sender, receiver) = mpsc::channel(RELAY_DEPTH);
        let metrics = self.metrics.clone();
        tokio::spawn(
            async move {
                let code = relay(stream, &sender, convert, deadline).await;
                metrics.record(labels.0, labels.1, code, started.elapsed());
            }
            .in_current_span(),
        );
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    /// Authentication, authorization, readiness, the snapshot's handle and the secrets, in
    /// upstream's order.
    async fn resolve(
        &self,
        token: &str,
        plan: &Plan,
    ) -> Result<(Resolved, HashMap<String, String>), Status> {
        let user = self.authenticate(token).await?;
        self.authorize(&user, &plan.namespace).await?;
        if !*self.ready.borrow() {
            tracing::error!(driver = %self.settings.driver_name, "{}", messages::DRIVER_NOT_READY);
            return Err(Status::unavailable(messages::DRIVER_NOT_READY));
        }
        let snapshot = self
            .volume_snapshot(&plan.namespace, &plan.snapshot_name)
            .await?;
        let content_name = plan::bound_content(&snapshot, &plan.snapshot_name)?;
        let resolved = self.content(&content_name, &plan.snapshot_name).await?;
        plan::check_driver(&resolved, &plan.snapshot_name, &self.settings.driver_name)?;
        let secrets = self.snapshotter_secrets(&snapshot, &resolved).await?;
        Ok((resolved, secrets))
    }

    async fn audience(&self) -> Result<String, String> {
        if !self.settings.audience.is_empty() {
            return Ok(self.settings.audience.clone());
        }
        let driver = &self.settings.driver_name;
        Api::<SnapshotMetadataService>::all(self.client.clone())
            .get(driver)
            .await
            .map(|service| service.spec.audience)
            .map_err(|error| {
                let error = GoApiError(&error);
                tracing::error!(%driver, %error, "{}", messages::FAILED_TO_FIND_CR);
                format!("{} '{driver}': {error}", messages::FAILED_TO_FIND_CR)
            })
    }

    async fn authenticate(&self, token: &str) -> Result<UserInfo, Status> {
        let failed = |error: String| {
            Status::internal(format!("{}: {error}", messages::FAILED_TO_AUTHENTICATE))
        };
        let audience = self.audience().await.map_err(failed)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![audience.clone()]),
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| {
                let error = GoApiError(&error).to_string();
                tracing::error!(%audience, %error, "TokenReviews.Create");
                failed(error)
            })?;
        plan::authenticated_user(answer.status.as_ref(), &audience).ok_or_else(|| {
            tracing::error!("{}", messages::UNAUTHENTICATED);
            Status::unauthenticated(messages::UNAUTHENTICATED)
        })
    }

    async fn authorize(&self, user: &UserInfo, namespace: &str) -> Result<(), Status> {
        let review = SubjectAccessReview {
            spec: plan::access_review(user, namespace),
            ..SubjectAccessReview::default()
        };
        let username = user.username.as_deref().unwrap_or_default();
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| {
                let error = GoApiError(&error).to_string();
                tracing::error!(user = username, %error, "SubjectAccessReviews.Create");
                Status::internal(format!("{}: {error}", messages::FAILED_TO_AUTHORIZE))
            })?;
        plan::authorization(answer.status.as_ref()).inspect_err(|_| {
            tracing::error!(user = username, "{}", messages::PERMISSION_DENIED);
        })
    }

    async fn volume_snapshot(&self, namespace: &str, name: &str) -> Result<VolumeSnapshot, Status> {
        let snapshot = Api::<VolumeSnapshot>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|error| {
                let error = GoApiError(&error);
                tracing::error!(%error, "failed to get VolumeSnapshot");
                Status::unavailable(format!(
                    "failed to get VolumeSnapshot '{namespace}/{name}': {error}"
                ))
            })?;
        Ok(snapshot)
    }

    async fn content(&self, name: &str, snapshot_name: &str) -> Result<Resolved, Status> {
        let content = Api::<VolumeSnapshotContent>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|error| {
                let error = GoApiError(&error);
                tracing::error!(content = name, %error, "failed to get VolumeSnapshotContent");
                Status::unavailable(format!(
                    "failed to get VolumeSnapshotContent '{name}': {error}"
                ))
            })?;
        plan::content_handle(&content, name).inspect_err(|status| {
            tracing::error!(
                content = name,
                snapshot = snapshot_name,
                "{}",
                status.message()
            );
        })
    }

    async fn snapshotter_secrets(
        &self,
        snapshot: &VolumeSnapshot,
        resolved: &Resolved,
    ) -> Result<HashMap<String, String>, Status> {
        let classes = Api::<VolumeSnapshotClass>::all(self.client.clone());
        let class = match plan::class_choice(snapshot) {
            ClassChoice::Named(name) => classes.get(&name).await.map_err(|error| {
                let error = GoApiError(&error);
                tracing::error!(class = %name, %error, "failed to get VolumeSnapshotClass");
                Status::unavailable(format!(
                    "failed to get VolumeSnapshotClass '{name}': {error}"
                ))
            })?,
            ClassChoice::DefaultOfDriver => {
                let list = classes
                    .list(&ListParams::default())
                    .await
                    .map_err(|error| {
                        let error = GoApiError(&error);
                        tracing::error!(%error, "failed to list VolumeSnapshotClasses");
                        Status::unavailable(format!(
                            "failed to list VolumeSnapshotClasses: {error}"
                        ))
                    })?;
                plan::default_class(&list.items, &resolved.driver)?.clone()
            }
        };
        let Some(secret) = plan::snapshotter_secret(&class, resolved, snapshot)? else {
            return Ok(HashMap::new());
        };
        csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &secret)
            .await
            .map(|data| data.into_inner())
            .map_err(|error| {
                tracing::error!(%error, "{}", messages::FAILED_TO_GET_CREDENTIALS);
                Status::unavailable(format!("{}: {error}", messages::FAILED_TO_GET_CREDENTIALS))
            })
    }
}

/// What a request past its max streaming duration ends with: the status grpc-go gives a call
/// whose context expired, which upstream passes on.
fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("context deadline exceeded")
}

/// Relays the driver's messages to the client until the driver ends the stream, fails, the
/// deadline passes or the client goes away; returns the request's final code. Dropping
/// `stream` on return cancels the driver's side.
async fn relay<C, A>(
    mut stream: Streaming<C>,
    sender: &mpsc::Sender<Result<A, Status>>,
    convert: fn(C) -> A,
    deadline: Instant,
) -> Code {
    let mut responses = 0_u64;
    loop {
        let next = tokio::select! {
            () = sender.closed() => None,
            next = timeout_at(deadline, stream.message()) => Some(next),
        };
        let outcome = match next {
            None => Err(Code::Cancelled),
            Some(Ok(Ok(Some(message)))) => {
                responses += 1;
                match timeout_at(deadline, sender.send(Ok(convert(message)))).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => Err(Code::Cancelled),
                    Err(_) => Ok(deadline_exceeded()),
                }
            }
            Some(Ok(Ok(None))) => {
                tracing::debug!(responses, "stream EOF");
                return Code::Ok;
            }
            Some(Ok(Err(status))) => Ok(plan::pass_or_wrap(
                status,
                Code::Internal,
                messages::FAILED_CSI_DRIVER_RESPONSE,
            )),
            Some(Err(_)) => Ok(deadline_exceeded()),
        };
        return match outcome {
            Err(code) => {
                tracing::info!(
                    responses,
                    "{}: the client went away",
                    messages::FAILED_TO_SEND_RESPONSE
                );
                code
            }
            Ok(status) => {
                tracing::error!(
                    responses,
                    code = ?status.code(),
                    message = status.message(),
                    "{}",
                    messages::FAILED_CSI_DRIVER_RESPONSE
                );
                let code = status.code();
                // The client may be gone too; then there is no one left to tell.
                let _ = sender.send(Err(status)).await;
                code
            }
        };
    }
}
