//! Real clients' `:authority` on our Unix sockets: the kubelet before Kubernetes 1.26 (grpc-go)
//! sends the socket path, some clients an empty one, and h2 alone resets such a stream with
//! PROTOCOL_ERROR. Here a client that writes its HTTP/2 frames by hand calls the reference
//! driver's CSI socket (GetPluginInfo, NodeGetInfo) and the registrar binary's registration
//! socket (GetInfo) with a path authority, an empty one, and a path that grpc-go's way of
//! encoding (incremental indexing, Huffman) puts in the dynamic table for the next request to
//! refer to.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use csi_hostpath::local::LocalCluster;
use csi_proto::csi::v1 as csi;
use csi_proto::pluginregistration::{InfoRequest, PluginInfo};
use kube_sim_harness::{Running, eventually, free_address};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use common::registrar;

const DRIVER: &str = "authority.test.io";
const NODE: &str = "node-a";

/// What the kubelet of Kubernetes 1.19 sends as `:authority` to a registration socket.
const KUBELET_AUTHORITY: &str = "/var/lib/kubelet/plugins_registry/hostpath.csi-suite.io-reg.sock";
/// The same, Huffman-coded (RFC 7541 Appendix B; made with Python's `hpack`).
const KUBELET_AUTHORITY_HUFFMAN: &str =
    "63b8ec628346c75b632d054b15d16cc6a91158598c84d9e989ce84d634ceb9106591699255cc75ac2ccba0e4eb";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// How a client encodes `:authority`.
#[derive(Clone, Copy, Debug)]
enum Authority {
    /// A plain literal: the socket path.
    Path,
    /// A plain literal: empty.
    Empty,
    /// grpc-go's encoding: the first request adds the Huffman-coded path to the dynamic table
    /// (incremental indexing), later ones refer to that entry (index 62).
    Indexed,
}

impl Authority {
    fn field(self, first_request: bool) -> Vec<u8> {
        match (self, first_request) {
            // Literal without indexing, name from static entry 1 (:authority).
            (Self::Path, _) => [&[0x01][..], &string(KUBELET_AUTHORITY)].concat(),
            (Self::Empty, _) => vec![0x01, 0x00],
            (Self::Indexed, true) => {
                let coded = hex::decode(KUBELET_AUTHORITY_HUFFMAN).unwrap();
                [&[0x41, 0x80 | coded.len() as u8][..], &coded].concat()
            }
            (Self::Indexed, false) => vec![0x80 | 62],
        }
    }
}

/// A short plain string literal.
fn string(text: &str) -> Vec<u8> {
    assert!(text.len() < 127);
    [&[text.len() as u8][..], text.as_bytes()].concat()
}

/// A literal header field without indexing, with a literal name.
fn literal(name: &str, value: &str) -> Vec<u8> {
    [&[0x00][..], &string(name), &string(value)].concat()
}

/// A gRPC request header block: `:method POST` and `:scheme http` from the static table.
fn request_block(path: &str, authority: Vec<u8>) -> Vec<u8> {
    [
        vec![0x83, 0x86],
        literal(":path", path),
        authority,
        literal("content-type", "application/grpc"),
        literal("te", "trailers"),
    ]
    .concat()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = (payload.len() as u32).to_be_bytes();
    [
        &length[1..],
        &[kind, flags][..],
        &stream.to_be_bytes(),
        payload,
    ]
    .concat()
}

/// An HTTP/2 client that writes its frames by hand and decodes no header block.
struct RawClient {
    socket: UnixStream,
    authority: Authority,
    next_stream: u32,
}

impl RawClient {
    async fn connect(path: &Path, authority: Authority) -> Self {
        let mut socket = UnixStream::connect(path).await.unwrap();
        socket
            .write_all(&[PREFACE, &frame(SETTINGS, 0, 0, &[])].concat())
            .await
            .unwrap();
        Self {
            socket,
            authority,
            next_stream: 1,
        }
    }

    /// One unary call; the response message, or what the server said instead.
    async fn call<Resp: Message + Default>(
        &mut self,
        method: &str,
        request: impl Message,
    ) -> Result<Resp, String> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let block = request_block(method, self.authority.field(stream == 1));
        let message = request.encode_to_vec();
        let mut data = vec![0];
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(&message);
        self.socket
            .write_all(
                &[
                    frame(HEADERS, END_HEADERS, stream, &block),
                    frame(DATA, END_STREAM, stream, &data),
                ]
                .concat(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(Duration::from_secs(10), self.response(stream))
            .await
            .map_err(|_| format!("no answer to {method}"))??;
        let message = response
            .get(5..)
            .ok_or_else(|| format!("{method}: no response message"))?;
        Resp::decode(message).map_err(|e| e.to_string())
    }

    /// The DATA of `stream` until the server ends it.
    async fn response(&mut self, stream: u32) -> Result<Vec<u8>, String> {
        let mut data = Vec::new();
        loop {
            let mut header = [0u8; 9];
            self.socket
                .read_exact(&mut header)
                .await
                .map_err(|e| format!("connection closed: {e}"))?;
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let (kind, flags) = (header[3], header[4]);
            let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; length];
            self.socket
                .read_exact(&mut payload)
                .await
                .map_err(|e| e.to_string())?;
            match kind {
                SETTINGS if flags & ACK == 0 => self
                    .socket
                    .write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .map_err(|e| e.to_string())?,
                GOAWAY => return Err(format!("GOAWAY {payload:02x?}")),
                RST_STREAM if id == stream => return Err(format!("RST_STREAM {payload:02x?}")),
                DATA if id == stream => data.extend_from_slice(&payload),
                _ => {}
            }
            if id == stream && flags & END_STREAM != 0 {
                return Ok(data);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn path_and_empty_authorities_are_served_on_the_driver_and_registration_sockets() {
    let root = tempfile::Builder::new()
        .prefix("authority-")
        .tempdir_in("/tmp")
        .unwrap();
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await
    .unwrap();
    let csi_socket = driver.node(NODE).endpoint.path().to_path_buf();
    let registry = root.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let _registrar = Running(registrar(
        &csi_socket,
        &csi_socket,
        &registry,
        free_address(),
        Stdio::null(),
    ));
    let registration_socket: PathBuf = registry.join(format!("{DRIVER}-reg.sock"));
    eventually("the registration socket", || async {
        UnixStream::connect(&registration_socket).await.ok()
    })
    .await;

    for authority in [Authority::Path, Authority::Empty, Authority::Indexed] {
        let mut client = RawClient::connect(&csi_socket, authority).await;
        let info: csi::GetPluginInfoResponse = client
            .call(
                "/csi.v1.Identity/GetPluginInfo",
                csi::GetPluginInfoRequest {},
            )
            .await
            .unwrap_or_else(|e| panic!("GetPluginInfo with {authority:?}: {e}"));
        assert_eq!(info.name, DRIVER);
        let node: csi::NodeGetInfoResponse = client
            .call("/csi.v1.Node/NodeGetInfo", csi::NodeGetInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("NodeGetInfo with {authority:?}: {e}"));
        assert_eq!(node.node_id, NODE);

        let mut client = RawClient::connect(&registration_socket, authority).await;
        for attempt in 0..2 {
            let plugin: PluginInfo = client
                .call("/pluginregistration.Registration/GetInfo", InfoRequest {})
                .await
                .unwrap_or_else(|e| panic!("GetInfo #{attempt} with {authority:?}: {e}"));
            assert_eq!(plugin.name, DRIVER);
            assert_eq!(plugin.endpoint, csi_socket.display().to_string());
        }
    }
    driver.stop().await;
}
