//! The adapter on real Unix sockets, between tonic's server and clients that send a path.

use std::sync::Mutex;
use std::time::Duration;

use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use csi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::*;
use crate::conn::{CsiConnection, Endpoint, connect, connect_as_kubelet};
use crate::grpc_server::incoming;
use crate::metrics::CsiOperationMetrics;

const DRIVER: &str = "authority.test.io";
const WAIT: Duration = Duration::from_secs(5);

/// Answers GetInfo, and keeps the errors reported to it.
#[derive(Clone, Default)]
struct Plugin {
    reported: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl Registration for Plugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            name: DRIVER.to_string(),
            ..Default::default()
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.reported
            .lock()
            .unwrap()
            .push(request.into_inner().error);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn socket(dir: &tempfile::TempDir) -> (UnixListener, Endpoint) {
    let path = dir.path().join("plugin-reg.sock");
    (
        UnixListener::bind(&path).unwrap(),
        Endpoint::from_path(path).unwrap(),
    )
}

fn serve<I, S>(plugin: Plugin, connections: I)
where
    I: Stream<Item = io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Connected + Send + Unpin + 'static,
{
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(plugin))
            .serve_with_incoming(connections),
    );
}

async fn get_info(connection: &CsiConnection) -> Result<String, Status> {
    let mut request = Request::new(InfoRequest {});
    request.set_timeout(WAIT);
    let info = RegistrationClient::new(connection.channel())
        .get_info(request)
        .await?;
    Ok(info.into_inner().name)
}

#[tokio::test]
async fn h2_alone_resets_a_request_whose_authority_is_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = socket(&dir);
    serve(Plugin::default(), UnixListenerStream::new(listener));
    let kubelet = connect_as_kubelet(&endpoint, WAIT, CsiOperationMetrics::unregistered())
        .await
        .unwrap();
    // What the real kubelet saw: "stream terminated by RST_STREAM with error code:
    // PROTOCOL_ERROR".
    let error = get_info(&kubelet).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Internal);
    let reset = format!("{error:?}");
    assert!(
        reset.contains("Reset(StreamId(1), PROTOCOL_ERROR, Remote)"),
        "{reset}"
    );
}

#[tokio::test]
async fn path_authority_clients_are_served_and_payloads_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = socket(&dir);
    let plugin = Plugin::default();
    serve(plugin.clone(), incoming(listener));
    let kubelet = connect_as_kubelet(&endpoint, WAIT, CsiOperationMetrics::unregistered())
        .await
        .unwrap();
    let sidecar = connect(&endpoint, WAIT, CsiOperationMetrics::unregistered())
        .await
        .unwrap();
    // Messages larger than a frame and than a read: DATA goes through in pieces.
    let long: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    for round in 0..5 {
        for connection in [&kubelet, &sidecar] {
            assert_eq!(get_info(connection).await.unwrap(), DRIVER, "round {round}");
        }
        let mut client = RegistrationClient::new(kubelet.channel());
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: long[..long.len() - round].to_string(),
            })
            .await
            .unwrap();
    }
    let reported = plugin.reported.lock().unwrap().clone();
    assert_eq!(reported.len(), 5);
    for (round, error) in reported.iter().enumerate() {
        assert!(
            *error == long[..long.len() - round],
            "round {round} arrived altered"
        );
    }
}

/// Records what the client sends, before the server-side adapter sees it.
struct Tap {
    inner: UnixStream,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Tap {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        this.seen
            .lock()
            .unwrap()
            .extend_from_slice(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for Tap {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

#[tokio::test]
async fn the_kubelet_connection_carries_the_socket_path_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = socket(&dir);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tapped = seen.clone();
    let socket: Arc<Path> = Arc::from(endpoint.path());
    let accepted = UnixListenerStream::new(listener).map(move |accepted| {
        accepted.map(|inner| {
            let tap = Tap {
                inner,
                seen: tapped.clone(),
            };
            AuthorityStream::server(tap, socket.clone())
        })
    });
    serve(Plugin::default(), accepted);
    let kubelet = connect_as_kubelet(&endpoint, WAIT, CsiOperationMetrics::unregistered())
        .await
        .unwrap();
    assert_eq!(get_info(&kubelet).await.unwrap(), DRIVER);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.starts_with(frames::PREFACE));
    let path = endpoint.path().as_os_str().as_encoded_bytes();
    assert!(
        seen.windows(path.len()).any(|w| w == path),
        "the socket path is not on the wire"
    );
    assert!(!seen.windows(9).any(|w| w == b"localhost"));
}

#[tokio::test]
async fn garbage_closes_that_connection_only() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = socket(&dir);
    serve(Plugin::default(), incoming(listener));
    for garbage in [
        &b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"[..],
        // A valid preface, then a HEADERS frame whose block is not HPACK.
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x02\x01\x04\x00\x00\x00\x01\xff\xff"[..],
    ] {
        let mut raw = UnixStream::connect(endpoint.path()).await.unwrap();
        raw.write_all(garbage).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, raw.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .ok();
    }
    let sidecar = connect(&endpoint, WAIT, CsiOperationMetrics::unregistered())
        .await
        .unwrap();
    assert_eq!(get_info(&sidecar).await.unwrap(), DRIVER);
}
