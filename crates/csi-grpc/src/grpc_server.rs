//! The gRPC server of every Unix socket of the suite (the driver's, the registrar's, COSI's):
//! tonic's server with HTTP/2 keepalive, fed by [`incoming`], which admits connections within
//! limits so that no client, broken or hostile, exhausts the server.
//!
//! - At most [`Limits::max_connections`] connections are served at once. Past that, accepting
//!   waits until one closes: further clients queue in the socket's backlog instead of costing
//!   a descriptor and a task each (a server out of descriptors fails everyone).
//! - A client must send the HTTP/2 connection preface within [`Limits::greeting_timeout`] of
//!   being accepted, or it is closed: a connection that says nothing would hold its place for
//!   ever.
//! - Once greeted, a connection stays as long as its peer answers the server's keepalive pings
//!   ([`builder`]). Healthy idle clients stay: upstream's sidecars exit when their driver
//!   connection drops (csi-lib-utils' `ExitOnConnectionLoss`), so no idle timeout closes them.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use crate::grpc_authority::{AuthorityStream, PREFACE};

/// How often the server pings a connection, and how long it waits for the answer before it
/// closes it: a peer that died without closing its socket is let go within a minute and a half.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What [`incoming`] admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub greeting_timeout: Duration,
}

impl Default for Limits {
    /// Far above the handful of clients a socket has (the kubelet, a few sidecars), far below
    /// a container's usual 1024 open files.
    fn default() -> Self {
        Self {
            max_connections: 256,
            greeting_timeout: Duration::from_secs(10),
        }
    }
}

/// Tonic's server with HTTP/2 keepalive: a connection whose peer stops answering pings is
/// closed.
pub fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// The connections `listener` accepts within the default [`Limits`], each behind
/// [`AuthorityStream::server`]: what every gRPC server on a Unix socket passes to tonic's
/// `serve_with_incoming[_shutdown]`.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityStream<Admitted>>> + Send + 'static {
    incoming_within(listener, Limits::default())
}

/// The connections `listener` accepts within `limits`.
pub fn incoming_within(
    listener: UnixListener,
    limits: Limits,
) -> impl Stream<Item = io::Result<AuthorityStream<Admitted>>> + Send + 'static {
    let socket: Arc<Path> = listener
        .local_addr()
        .ok()
        .and_then(|address| address.as_pathname().map(Arc::from))
        .unwrap_or_else(|| Arc::from(Path::new("")));
    let places = Arc::new(Semaphore::new(limits.max_connections));
    futures::stream::unfold(
        (listener, places, socket),
        move |(listener, places, socket)| async move {
            let Ok(place) = places.clone().acquire_owned().await else {
                return None;
            };
            let accepted = listener.accept().await.map(|(stream, _)| {
                let admitted = Admitted::new(stream, place, limits.greeting_timeout);
                AuthorityStream::server(admitted, socket.clone())
            });
            Some((accepted, (listener, places, socket)))
        },
    )
}

/// An accepted connection: holds its place among the connections served until it is dropped,
/// and fails its reads once the greeting is overdue.
#[derive(Debug)]
pub struct Admitted {
    stream: UnixStream,
    _place: OwnedSemaphorePermit,
    /// Until the preface has arrived: bytes of it still to come, and the deadline.
    greeting: Option<(usize, Pin<Box<Sleep>>)>,
}

impl Admitted {
    fn new(stream: UnixStream, place: OwnedSemaphorePermit, timeout: Duration) -> Self {
        Self {
            stream,
            _place: place,
            greeting: Some((PREFACE.len(), Box::pin(tokio::time::sleep(timeout)))),
        }
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some((missing, deadline)) = &mut this.greeting {
            let arrived = buf.filled().len() - before;
            if arrived >= *missing {
                this.greeting = None;
            } else {
                *missing -= arrived;
                if read.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent no HTTP/2 connection preface in time",
                    )));
                }
            }
        }
        read
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Admitted {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests;
