//! Admission on a real Unix socket, with raw clients that greet, or do not.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::grpc_authority::PREFACE;

const WAIT: Duration = Duration::from_secs(5);
/// Long enough for a server that will answer to have answered.
const SILENCE: Duration = Duration::from_millis(500);

/// Serves a router without services within `limits` on a socket of a new directory:
/// admission is all it shows.
fn serve(limits: Limits) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let router = builder().add_routes(tonic::service::Routes::default());
    tokio::spawn(router.serve_with_incoming(incoming_within(listener, limits)));
    (dir, socket)
}

/// A raw client that sends the preface and an empty SETTINGS frame.
async fn greeting_client(socket: &Path) -> UnixStream {
    let mut client = UnixStream::connect(socket).await.unwrap();
    client.write_all(PREFACE).await.unwrap();
    client
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    client
}

/// Whether the server says anything (its SETTINGS) to `client` within `wait`.
async fn answered(client: &mut UnixStream, wait: Duration) -> bool {
    let mut first = [0; 1];
    matches!(
        tokio::time::timeout(wait, client.read(&mut first)).await,
        Ok(Ok(1))
    )
}

#[tokio::test]
async fn connections_past_the_limit_wait_for_a_place() {
    let (_dir, socket) = serve(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let mut first = greeting_client(&socket).await;
    let mut second = greeting_client(&socket).await;
    assert!(answered(&mut first, WAIT).await);
    assert!(answered(&mut second, WAIT).await);
    let mut third = greeting_client(&socket).await;
    assert!(
        !answered(&mut third, SILENCE).await,
        "a third connection was served"
    );
    drop(first);
    assert!(
        answered(&mut third, WAIT).await,
        "the freed place went to the waiting client"
    );
}

#[tokio::test]
async fn a_client_that_never_greets_is_closed_and_its_place_freed() {
    let (_dir, socket) = serve(Limits {
        max_connections: 1,
        greeting_timeout: Duration::from_millis(200),
    });
    let mut silent = UnixStream::connect(&socket).await.unwrap();
    // Half a preface, then nothing.
    silent.write_all(&PREFACE[..10]).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, silent.read_to_end(&mut rest))
        .await
        .expect("the server closes a client that does not greet")
        .ok();
    let mut next = greeting_client(&socket).await;
    assert!(answered(&mut next, WAIT).await, "the place was not freed");
}

#[tokio::test]
async fn a_client_that_greets_in_time_is_served_past_the_deadline() {
    let (_dir, socket) = serve(Limits {
        max_connections: 1,
        greeting_timeout: Duration::from_millis(300),
    });
    let mut client = UnixStream::connect(&socket).await.unwrap();
    client.write_all(&PREFACE[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.write_all(&PREFACE[10..]).await.unwrap();
    client
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    assert!(answered(&mut client, WAIT).await);
    // Well past the deadline, the connection is still served: a PING is answered.
    tokio::time::sleep(Duration::from_millis(600)).await;
    client
        .write_all(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        .await
        .unwrap();
    let mut seen: Vec<u8> = Vec::new();
    let mut chunk = [0; 256];
    while !seen.windows(8).any(|w| w == [1u8, 2, 3, 4, 5, 6, 7, 8]) {
        let n = tokio::time::timeout(WAIT, client.read(&mut chunk))
            .await
            .expect("the PING is answered")
            .unwrap();
        assert!(n > 0, "the connection was closed");
        seen.extend(&chunk[..n]);
    }
}
