//! The connection to a CSI driver: wait (bounded) for its Unix socket, one HTTP/2 connection
//! for every call (so its loss is observable, and upstream's "exit on connection loss" can be
//! honoured), and a typed method per RPC that applies the per-call timeout, records
//! `csi_sidecar_operations_seconds`, and logs request and response with secrets redacted.

mod driver;
mod endpoint;
#[cfg(feature = "v1-12")]
mod legacy;
#[cfg(feature = "v1-12")]
pub use legacy::rewire;
mod rpcs;

use std::fmt::Debug;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

pub use driver::{
    DriverInfo, LEGACY_CONTROLLER_VOLUME_CONDITION, LEGACY_NODE_VOLUME_CONDITION,
    PluginCapabilities, Services, StartupOrder, VolumeConditionSupport, controller_capabilities,
    controller_volume_condition, node_capabilities, node_volume_condition,
};
pub use endpoint::{Endpoint, MAX_SOCKET_PATH_BYTES, check_socket_path};

use crate::grpc_authority::AuthorityStream;
use crate::metrics::CsiOperationMetrics;
use csi_kinds::go_duration::format_go_duration;

/// A gRPC error as grpc-go's `status.Error` prints it (`rpc error: code = Canceled desc = …`):
/// the text of upstream's Events and conditions that quote a CSI error.
#[derive(Debug, Clone, Copy)]
pub struct GoStatus<'a>(pub &'a Status);

impl std::fmt::Display for GoStatus<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rpc error: code = {} desc = {}",
            crate::metrics::go_code_name(self.0.code()),
            self.0.message()
        )
    }
}

/// Upstream's connect bound (csi-lib-utils: 30 s, then exit).
pub const DEFAULT_CONNECT_WAIT: Duration = Duration::from_secs(30);

/// Pause between Probe attempts while the driver is not ready (upstream: 1 s).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Where the container runtime shows a terminated container's message (upstream writes the
/// connection-loss reason there).
const TERMINATION_LOG: &str = "/dev/termination-log";

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("malformed CSI endpoint {address:?}: {why}")]
    MalformedEndpoint { address: String, why: &'static str },
    #[error(
        "socket path {path} is {length} bytes long; Unix domain socket paths are limited to 108 bytes including the terminating NUL"
    )]
    SocketPathTooLong { path: PathBuf, length: usize },
    #[error("CSI driver socket {endpoint} not reachable after waiting {waited}: {last_error}")]
    Unreachable {
        endpoint: Endpoint,
        waited: String,
        last_error: String,
    },
    #[error("HTTP/2 handshake with the CSI driver at {endpoint} failed: {source}")]
    Handshake {
        endpoint: Endpoint,
        #[source]
        source: hyper::Error,
    },
    #[error("CSI driver probe failed: {0}")]
    Probe(#[source] Status),
    #[error("{method} failed: {status}")]
    Call {
        method: &'static str,
        #[source]
        status: Status,
    },
    #[error("CSI driver returned an empty name from GetPluginInfo")]
    EmptyDriverName,
}

/// A cloneable handle to the one HTTP/2 connection with the driver; a tonic transport.
#[derive(Clone, Debug)]
pub struct CsiChannel {
    sender: http2::SendRequest<tonic::body::Body>,
}

impl tower::Service<http::Request<tonic::body::Body>> for CsiChannel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // HTTP/2 needs :scheme and :authority; gRPC servers on a Unix socket expect "localhost".
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        if let Ok(uri) = http::Uri::builder()
            .scheme("http")
            .authority("localhost")
            .path_and_query(path)
            .build()
        {
            *request.uri_mut() = uri;
        }
        Box::pin(self.sender.send_request(request))
    }
}

/// A live connection to a CSI driver.
#[derive(Clone, Debug)]
pub struct CsiConnection {
    endpoint: Endpoint,
    /// Declared before the channel, so it is dropped first: the connection's end is then
    /// known to be ours by the time the driver side sees it.
    _released: Arc<Released>,
    channel: CsiChannel,
    metrics: CsiOperationMetrics,
    lost: CancellationToken,
    max_log_length: Option<usize>,
}

/// Marks the connection released when the last [`CsiConnection`] clone goes, so that its end
/// is not logged as the driver's (livenessprobe connects and lets go at every check).
#[derive(Debug)]
struct Released(CancellationToken);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Whether a CSI call that failed with `code` is certainly over at the driver: not cancelled,
/// timed out, unavailable, out of resources or aborted, after which the operation may still
/// run (the sidecars' `isFinalError`, the same list in all of them).
pub fn is_final_error(code: tonic::Code) -> bool {
    use tonic::Code;
    !matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Connects to the driver, waiting up to `wait` for its socket to accept connections.
pub async fn connect(
    endpoint: &Endpoint,
    wait: Duration,
    metrics: CsiOperationMetrics,
) -> Result<CsiConnection, ConnError> {
    let stream = dial(endpoint, wait).await?;
    establish(endpoint, stream, metrics).await
}

/// [`connect`] as the kubelet of Kubernetes before 1.26 dials (grpc-go, the socket path as its
/// target): every request carries the socket path as `:authority`. kube-sim's kubelet dials so,
/// keeping our servers tested against what the real kubelet sends.
pub async fn connect_as_kubelet(
    endpoint: &Endpoint,
    wait: Duration,
    metrics: CsiOperationMetrics,
) -> Result<CsiConnection, ConnError> {
    let stream = dial(endpoint, wait).await?;
    let path = endpoint.path();
    let authority = Bytes::copy_from_slice(path.as_os_str().as_bytes());
    let stream = AuthorityStream::client(stream, Arc::from(path), authority);
    establish(endpoint, stream, metrics).await
}

/// Waits up to `wait` for the socket to accept a connection.
async fn dial(endpoint: &Endpoint, wait: Duration) -> Result<UnixStream, ConnError> {
    let deadline = Instant::now() + wait;
    let mut logged_wait = false;
    loop {
        match UnixStream::connect(endpoint.path()).await {
            Ok(stream) => return Ok(stream),
            Err(error) if Instant::now() >= deadline => {
                return Err(ConnError::Unreachable {
                    endpoint: endpoint.clone(),
                    waited: format_go_duration(wait),
                    last_error: error.to_string(),
                });
            }
            Err(error) => {
                if !logged_wait {
                    tracing::info!(%endpoint, %error, "waiting for the CSI driver socket");
                    logged_wait = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The HTTP/2 handshake, and a task that notices the connection's loss.
async fn establish<S>(
    endpoint: &Endpoint,
    stream: S,
    metrics: CsiOperationMetrics,
) -> Result<CsiConnection, ConnError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ConnError::Handshake {
            endpoint: endpoint.clone(),
            source,
        })?;
    let lost = CancellationToken::new();
    let on_loss = lost.clone();
    let released = CancellationToken::new();
    let ours = released.clone();
    let watched = endpoint.clone();
    tokio::spawn(async move {
        match connection.await {
            Ok(()) if ours.is_cancelled() => {
                tracing::debug!(endpoint = %watched, "closed the connection to the CSI driver");
            }
            Ok(()) => tracing::warn!(endpoint = %watched, "CSI driver closed the connection"),
            Err(error) => {
                tracing::warn!(endpoint = %watched, %error, "connection to the CSI driver failed")
            }
        }
        on_loss.cancel();
    });
    // Debug: a sidecar logs the driver it found once at start; livenessprobe connects at
    // every check.
    tracing::debug!(%endpoint, "connected to the CSI driver");
    Ok(CsiConnection {
        endpoint: endpoint.clone(),
        _released: Arc::new(Released(released)),
        channel: CsiChannel { sender },
        metrics,
        lost,
        max_log_length: None,
    })
}

impl CsiConnection {
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn metrics(&self) -> &CsiOperationMetrics {
        &self.metrics
    }

    /// Truncates logged requests and responses (`--max-grpc-log-length`; `None`: unlimited).
    pub fn with_max_log_length(mut self, max: Option<usize>) -> Self {
        self.max_log_length = max;
        self
    }

    /// Resolves once the connection to the driver is gone.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The raw transport, for services without a typed wrapper here.
    pub fn channel(&self) -> CsiChannel {
        self.channel.clone()
    }

    /// Upstream's `ExitOnConnectionLoss`: when the driver connection is lost, log it, leave the
    /// reason in the termination log, and exit 1 so a restarted sidecar reconnects (and a
    /// standby that can reach its driver takes over leadership).
    pub fn exit_on_loss(&self) {
        let connection = self.clone();
        tokio::spawn(async move {
            connection.lost().await;
            let message = format!(
                "Lost connection to CSI driver at {}, exiting",
                connection.endpoint
            );
            tracing::error!("{message}");
            // Not every environment has a termination log; the log line above is what counts.
            let _ = std::fs::write(TERMINATION_LOG, &message);
            std::process::exit(1);
        });
    }

    /// Upstream's `ProbeForever`: Probe every second until the driver says ready (an absent
    /// `ready` means ready). Timeouts and "not ready" are retried; any other error is final.
    pub async fn probe_until_ready(&self, timeout: Duration) -> Result<(), ConnError> {
        loop {
            match self
                .probe(csi_proto::csi::v1::ProbeRequest {}, timeout)
                .await
            {
                Ok(response) if response.ready.is_none_or(|ready| ready) => {
                    tracing::info!(endpoint = %self.endpoint, "CSI driver is ready");
                    return Ok(());
                }
                Ok(_) => tracing::info!(endpoint = %self.endpoint, "CSI driver is not ready yet"),
                Err(status) if status.code() == Code::DeadlineExceeded => {
                    tracing::warn!(endpoint = %self.endpoint, "CSI driver probe timed out, retrying");
                }
                Err(status) => return Err(ConnError::Probe(status)),
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// One unary call: timeout, metrics, redacted logs. `call` performs the RPC on a client.
    async fn unary<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        request: Req,
        timeout: Duration,
        call: F,
    ) -> Result<Resp, Status>
    where
        Req: Debug,
        Resp: Debug,
        F: FnOnce(CsiChannel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        // `Debug` of every secret-bearing message redacts its secrets (csi-proto).
        tracing::trace!(method, request = %self.clip(&request), "CSI request");
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, call(self.channel.clone(), request)).await
        {
            Ok(result) => result.map(tonic::Response::into_inner),
            // What grpc-go's client reports when its context's deadline passes.
            Err(_) => Err(Status::deadline_exceeded("context deadline exceeded")),
        };
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.metrics.record(method, code, started.elapsed());
        match &result {
            Ok(response) => {
                tracing::trace!(method, response = %self.clip(response), "CSI response");
            }
            Err(status) => {
                tracing::debug!(method, code = ?status.code(), message = status.message(), "CSI call failed");
            }
        }
        result
    }

    fn clip(&self, value: &impl Debug) -> String {
        let text = format!("{value:?}");
        match self.max_log_length {
            Some(max) if text.len() > max => {
                let mut end = max;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}[truncated]", &text[..end])
            }
            _ => text,
        }
    }
}

#[cfg(test)]
mod tests;
