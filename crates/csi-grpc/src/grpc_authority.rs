//! gRPC over Unix sockets for every real client: an HTTP/2 `:authority` that is a socket path
//! or empty, served like `localhost`.
//!
//! gRPC clients dialling a Unix socket put what they dialled into `:authority`: the kubelet of
//! Kubernetes before 1.26 (grpc-go v1.27 in 1.19) sends the socket path, and so do grpc-java,
//! Python's grpcio and csc; others send an empty one. h2, under tonic, turns `:authority` into
//! an `http::uri::Authority` and resets the stream with PROTOCOL_ERROR when that fails (its
//! `server::Peer::convert_poll_message`), so such a client never reaches our services. No h2
//! release accepts it, so [`AuthorityStream`] sits between the accepted socket and tonic: it
//! follows the client's frames, decodes each header block, and where `:authority` is not a
//! valid URI authority serves the request with `localhost` (what tonic's own clients send).
//! The other direction, every frame but HEADERS/CONTINUATION, and header blocks that need no
//! change pass untouched; frame payloads go from the socket into h2's buffer directly.
//!
//! Once a block has been rewritten, the server's HPACK dynamic table no longer follows the
//! client's, so from then on every block is re-encoded without it: static-table references and
//! literals "without indexing" ("never indexed" kept as received), no dynamic-table size
//! updates (the re-encoded blocks never refer to the dynamic table). The decoder mirrors the
//! client's table to understand later blocks that refer to earlier ones.
//!
//! HPACK is ours (`hpack`, `huffman`), not a crate: h2's codec is private, `hpack` 0.3 and
//! `httlib-hpack` 0.1 are unmaintained, and `loona-hpack` (once `fluke-hpack`, a fork of
//! `hpack`) would add a second `thiserror` major and hands decoded fields over without their
//! "never indexed" flag, which an intermediary must keep (RFC 7541 §6.2.3). A decoder is small,
//! and the Huffman code is canonical, so its table is only which octets have which code length
//! (checked against RFC 7541's examples and against blocks from Python's `hpack`).
//!
//! The same machinery dials the other way ([`AuthorityStream::client`]): every request a
//! client sends carries a chosen `:authority` on the wire, as the real kubelet's do; kube-sim's
//! kubelet dials so (`conn::connect_as_kubelet`).

mod frames;
mod hpack;
mod huffman;

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use frames::{AuthorityRewrite, FrameRewriter};
pub use frames::{FrameError, FrameType, PREFACE};

/// How much is read from the socket at once while a frame header or header block is parsed.
const READ_CHUNK: usize = 8 * 1024;

/// The half of the connection that carries the client's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientHalf {
    /// Server side: what we read.
    Read,
    /// Client side: what we write.
    Write,
}

/// A connection whose client-to-server frames have their `:authority` rewritten.
#[derive(Debug)]
pub struct AuthorityStream<S> {
    inner: S,
    client_half: ClientHalf,
    rewriter: FrameRewriter,
    /// Bytes of the client's half not processed yet (an incomplete frame header or block).
    input: BytesMut,
    /// Processed bytes waiting to go on.
    output: VecDeque<Bytes>,
    /// For log lines.
    socket: Arc<Path>,
}

impl<S> AuthorityStream<S> {
    /// The server side of an accepted connection: an `:authority` h2 would refuse is served as
    /// `localhost`.
    pub fn server(inner: S, socket: Arc<Path>) -> Self {
        Self::new(inner, ClientHalf::Read, AuthorityRewrite::Repair, socket)
    }

    /// The client side of a connection: every request carries `authority`.
    pub fn client(inner: S, socket: Arc<Path>, authority: Bytes) -> Self {
        Self::new(
            inner,
            ClientHalf::Write,
            AuthorityRewrite::Replace(authority),
            socket,
        )
    }

    fn new(
        inner: S,
        client_half: ClientHalf,
        rewrite: AuthorityRewrite,
        socket: Arc<Path>,
    ) -> Self {
        Self {
            inner,
            client_half,
            rewriter: FrameRewriter::new(rewrite),
            input: BytesMut::new(),
            output: VecDeque::new(),
            socket,
        }
    }

    fn fail(&self, error: FrameError) -> io::Error {
        tracing::warn!(socket = %self.socket.display(), %error, "closing the gRPC connection");
        io::Error::new(io::ErrorKind::InvalidData, error)
    }

    fn process(&mut self) -> io::Result<()> {
        self.rewriter
            .process(&mut self.input, &mut self.output)
            .map_err(|error| self.fail(error))
    }

    fn end_of_input(&self) -> io::Result<()> {
        self.rewriter
            .finish(&self.input)
            .map_err(|error| self.fail(error))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AuthorityStream<S> {
    /// Writes out everything processed.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(front) = self.output.front_mut() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, front))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            front.advance(n);
            if front.is_empty() {
                self.output.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for AuthorityStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.client_half != ClientHalf::Read {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            let before = buf.remaining();
            while buf.remaining() > 0
                && let Some(front) = this.output.front_mut()
            {
                let n = front.len().min(buf.remaining());
                buf.put_slice(&front.split_to(n));
                if front.is_empty() {
                    this.output.pop_front();
                }
            }
            if buf.remaining() < before || before == 0 {
                return Poll::Ready(Ok(()));
            }
            if !this.input.is_empty() {
                this.process()?;
                if !this.output.is_empty() {
                    continue;
                }
            }
            let direct = this.rewriter.passthrough();
            if direct > 0 && this.input.is_empty() {
                // A payload that passes unchanged: from the socket into the caller's buffer.
                let n = {
                    let room = buf.initialize_unfilled_to(direct.min(buf.remaining()));
                    let mut limited = ReadBuf::new(room);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut limited))?;
                    limited.filled().len()
                };
                if n == 0 {
                    return Poll::Ready(this.end_of_input());
                }
                buf.advance(n);
                this.rewriter.passed(n);
                return Poll::Ready(Ok(()));
            }
            let filled = this.input.len();
            this.input.resize(filled + READ_CHUNK, 0);
            let mut chunk = ReadBuf::new(&mut this.input[filled..]);
            let read = Pin::new(&mut this.inner).poll_read(cx, &mut chunk);
            let n = chunk.filled().len();
            this.input.truncate(filled + n);
            ready!(read)?;
            if n == 0 {
                return Poll::Ready(this.end_of_input());
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for AuthorityStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.client_half != ClientHalf::Write {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        ready!(this.poll_drain(cx))?;
        let direct = this.rewriter.passthrough();
        if direct > 0 && this.input.is_empty() {
            let n =
                ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..direct.min(buf.len())]))?;
            this.rewriter.passed(n);
            return Poll::Ready(Ok(n));
        }
        this.input.extend_from_slice(buf);
        this.process()?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.client_half != ClientHalf::Write {
            return Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
        self.poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        self.client_half != ClientHalf::Write && self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
