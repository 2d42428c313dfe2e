//! A gRPC proxy in front of the reference driver's socket: it records every CSI request (to
//! check what a sidecar sent, secrets included), can make the driver look unavailable (to
//! prove a sidecar reports it and recovers), can make it answer CreateVolume with less
//! capacity than it made (to prove a sidecar deletes a volume it must not keep) and can make
//! it look like a driver that cannot expand volumes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use csi_proto::csi::v1::{self as csi, controller_service_capability, plugin_capability};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2 as client;
use hyper::server::conn::http2 as server;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

/// One recorded call: the gRPC path (`/csi.v1.Controller/CreateVolume`) and its message.
#[derive(Clone, Debug)]
pub struct Call {
    pub path: String,
    pub message: Bytes,
    /// Failed by the proxy ([`CsiProxy::fail_with`]), never reached the driver.
    pub failed: bool,
}

struct Shared {
    calls: Mutex<Vec<Call>>,
    /// While set, every call fails with this gRPC status code and message.
    failure: Mutex<Option<(tonic::Code, String)>>,
    /// Calls whose path ends with this are answered only after this delay (the driver has
    /// done the work; the caller does not know yet).
    delay: Mutex<Option<(String, std::time::Duration)>>,
    /// Calls whose path ends with this are answered only once it is cleared.
    hold: tokio::sync::watch::Sender<Option<String>>,
    /// While set, CreateVolume answers report a volume of 1 byte.
    shrink: Mutex<bool>,
    /// While set, the capability answers leave out volume expansion.
    hide_expansion: Mutex<bool>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            calls: Mutex::default(),
            failure: Mutex::default(),
            delay: Mutex::default(),
            hold: tokio::sync::watch::Sender::new(None),
            shrink: Mutex::default(),
            hide_expansion: Mutex::default(),
        }
    }
}

/// The proxy; dropping it stops it.
pub struct CsiProxy {
    pub socket: PathBuf,
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

impl CsiProxy {
    /// Serves `socket`, forwarding to the driver at `driver`.
    pub fn start(socket: &Path, driver: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("the proxy socket");
        let shared = Arc::new(Shared::default());
        let mut tasks = JoinSet::new();
        let state = shared.clone();
        let driver = driver.to_path_buf();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, driver.clone(), state.clone()));
            }
        });
        Self {
            socket: socket.to_path_buf(),
            shared,
            _tasks: tasks,
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    /// The CreateVolume requests so far.
    pub fn create_volume_requests(&self) -> Vec<csi_proto::csi::v1::CreateVolumeRequest> {
        self.requests("CreateVolume")
    }

    /// The DeleteVolume requests so far (those failed by the proxy too).
    pub fn delete_volume_requests(&self) -> Vec<csi_proto::csi::v1::DeleteVolumeRequest> {
        self.requests("DeleteVolume")
    }

    /// The CreateSnapshot requests so far.
    pub fn create_snapshot_requests(&self) -> Vec<csi_proto::csi::v1::CreateSnapshotRequest> {
        self.requests("CreateSnapshot")
    }

    /// The DeleteSnapshot requests so far.
    pub fn delete_snapshot_requests(&self) -> Vec<csi_proto::csi::v1::DeleteSnapshotRequest> {
        self.requests("DeleteSnapshot")
    }

    fn requests<M: Message + Default>(&self, method: &str) -> Vec<M> {
        let suffix = format!("/{method}");
        self.calls()
            .into_iter()
            .filter(|c| c.path.ends_with(&suffix))
            .filter_map(|c| M::decode(c.message).ok())
            .collect()
    }

    /// How many calls of `method` (`ControllerPublishVolume`) reached the driver.
    pub fn forwarded(&self, method: &str) -> usize {
        let suffix = format!("/{method}");
        self.calls()
            .iter()
            .filter(|c| !c.failed && c.path.ends_with(&suffix))
            .count()
    }

    /// Holds the driver's answers to `method` for `delay` (`None`: answer at once).
    pub fn delay_responses(&self, delay: Option<(&str, std::time::Duration)>) {
        *lock(&self.shared.delay) = delay.map(|(method, delay)| (format!("/{method}"), delay));
    }

    /// Holds the driver's answers to `method` until [`CsiProxy::release_responses`] (the driver
    /// has done the work; the caller waits).
    pub fn hold_responses(&self, method: &str) {
        self.shared.hold.send_replace(Some(format!("/{method}")));
    }

    /// Lets held answers through.
    pub fn release_responses(&self) {
        self.shared.hold.send_replace(None);
    }

    /// Makes the driver's CreateVolume answers say the volume has 1 byte (`false`: as made).
    pub fn shrink_created_volumes(&self, shrink: bool) {
        *lock(&self.shared.shrink) = shrink;
    }

    /// Makes the driver look unable to expand volumes (`false`: as it is): its capability
    /// answers leave out the plugin capability VolumeExpansion and the controller EXPAND_VOLUME,
    /// and the proxy answers NodeGetCapabilities itself with no capability (the controller
    /// instance it fronts serves no node service; a sidecar asks a driver that cannot expand on
    /// the controller whether it expands on the node).
    pub fn hide_expansion(&self, hide: bool) {
        *lock(&self.shared.hide_expansion) = hide;
    }

    /// Makes every call fail with `code` (`None`: forward again).
    pub fn fail_with(&self, failure: Option<(tonic::Code, &str)>) {
        *lock(&self.shared.failure) = failure.map(|(code, message)| (code, message.to_string()));
    }
}

impl std::fmt::Debug for CsiProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiProxy")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Response = http::Response<http_body_util::combinators::BoxBody<Bytes, hyper::Error>>;

async fn serve(stream: UnixStream, driver: PathBuf, shared: Arc<Shared>) {
    let Ok(upstream) = UnixStream::connect(&driver).await else {
        return;
    };
    let Ok((sender, connection)) = client::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(upstream))
        .await
    else {
        return;
    };
    tokio::spawn(connection);
    let service = service_fn(move |request: http::Request<Incoming>| {
        let mut sender = sender.clone();
        let shared = shared.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes();
            let path = parts.uri.path().to_string();
            // A gRPC message: 1 byte compression flag, 4 bytes length, then the message.
            let message = body
                .get(5..)
                .map(Bytes::copy_from_slice)
                .unwrap_or_default();
            let failure = lock(&shared.failure).clone();
            lock(&shared.calls).push(Call {
                path: path.clone(),
                message,
                failed: failure.is_some(),
            });
            if let Some((code, text)) = failure {
                return Ok::<Response, hyper::Error>(status_only(code, &text));
            }
            if *lock(&shared.hide_expansion) && path.ends_with("/NodeGetCapabilities") {
                return Ok(answered(&csi::NodeGetCapabilitiesResponse::default()));
            }
            let forwarded = http::Request::from_parts(parts, Full::new(body));
            let response = sender.send_request(forwarded).await?;
            let delay = lock(&shared.delay)
                .clone()
                .filter(|(suffix, _)| path.ends_with(suffix.as_str()));
            if let Some((_, delay)) = delay {
                tokio::time::sleep(delay).await;
            }
            let mut hold = shared.hold.subscribe();
            let _ = hold
                .wait_for(|held| !held.as_ref().is_some_and(|m| path.ends_with(m.as_str())))
                .await;
            if *lock(&shared.shrink) && path.ends_with("/CreateVolume") {
                return rewritten(response, |answer: &mut csi::CreateVolumeResponse| {
                    if let Some(volume) = answer.volume.as_mut() {
                        volume.capacity_bytes = 1;
                    }
                })
                .await;
            }
            if *lock(&shared.hide_expansion) {
                return without_expansion(&path, response).await;
            }
            Ok(response.map(|b| b.boxed()))
        }
    });
    let _ = server::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The driver's answer with volume expansion left out, if it is a capability answer.
async fn without_expansion(
    path: &str,
    response: http::Response<Incoming>,
) -> Result<Response, hyper::Error> {
    use controller_service_capability::rpc::Type as ControllerRpc;
    let method = path.rsplit('/').next().unwrap_or_default();
    match method {
        "GetPluginCapabilities" => {
            rewritten(
                response,
                |answer: &mut csi::GetPluginCapabilitiesResponse| {
                    answer.capabilities.retain(|c| {
                        !matches!(c.r#type, Some(plugin_capability::Type::VolumeExpansion(_)))
                    });
                },
            )
            .await
        }
        "ControllerGetCapabilities" => {
            rewritten(
                response,
                |answer: &mut csi::ControllerGetCapabilitiesResponse| {
                    answer.capabilities.retain(|c| match &c.r#type {
                        Some(controller_service_capability::Type::Rpc(rpc)) => {
                            rpc.r#type != ControllerRpc::ExpandVolume as i32
                        }
                        None => true,
                    });
                },
            )
            .await
        }
        _ => Ok(response.map(|b| b.boxed())),
    }
}

/// The driver's answer with its message changed by `edit`; the status trailers kept (an error
/// answer has no message and passes unchanged).
async fn rewritten<M: Message + Default>(
    response: http::Response<Incoming>,
    edit: impl FnOnce(&mut M),
) -> Result<Response, hyper::Error> {
    let (parts, body) = response.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    let mut bytes = collected.to_bytes();
    let answer = bytes
        .get(5..)
        .filter(|message| !message.is_empty())
        .and_then(|message| M::decode(message).ok());
    if let Some(mut answer) = answer {
        edit(&mut answer);
        bytes = framed(&answer);
    }
    let body = Full::new(bytes)
        .map_err(|never| match never {})
        .with_trailers(async move { trailers.map(Ok) })
        .boxed();
    Ok(http::Response::from_parts(parts, body))
}

/// A successful gRPC answer with `message`, made by the proxy.
fn answered(message: &impl Message) -> Response {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let body = Full::new(framed(message))
        .map_err(|never| match never {})
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(body)
        .expect("a valid response")
}

/// A gRPC message as it travels: no compression, its length, then the message.
fn framed(message: &impl Message) -> Bytes {
    let message = message.encode_to_vec();
    let length = u32::try_from(message.len()).expect("a small message");
    let mut framed = vec![0];
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// A gRPC "trailers-only" error response.
fn status_only(code: tonic::Code, message: &str) -> Response {
    let empty = Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed();
    http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("grpc-status", (code as i32).to_string())
        .header("grpc-message", percent_encoded(message))
        .body(empty)
        .expect("a valid response")
}

/// grpc-message encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encoded(message: &str) -> String {
    message
        .bytes()
        .map(|b| match b {
            b'%' => "%25".to_string(),
            0x20..=0x7e => char::from(b).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
