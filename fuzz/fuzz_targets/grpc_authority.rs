//! The layer in front of every gRPC socket (`csi_grpc::grpc_authority`): what a client
//! writes, read through `AuthorityStream::server` as tonic reads it; and the same bytes
//! written through `AuthorityStream::client`, as our kubelet dials.
//!
//! Input: one byte choosing how many bytes the socket takes per read or write and how large
//! the reader's buffer is, then the bytes the client sends. Properties: no panic; the outcome
//! does not depend on how the bytes arrive (read whole, with one large buffer); what the
//! server receives passes the layer again unchanged (a repaired `:authority` needs no more
//! repair); and a connection the server takes, sent through the client side with `localhost`,
//! reaches a server unchanged.
#![no_main]

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use csi_grpc::grpc_authority::AuthorityStream;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket whose peer has written `data` and closed its end, and that takes at most `per_io`
/// bytes per write into `written`.
struct Socket<'a> {
    data: &'a [u8],
    per_io: usize,
    written: Rc<RefCell<Vec<u8>>>,
}

impl AsyncRead for Socket<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.per_io.min(buf.remaining()).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Socket<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = self.per_io.min(buf.len());
        self.written.borrow_mut().extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Everything the server reads until the end of the connection, or `None` if the layer closes
/// it. The socket never blocks, so neither may the layer.
fn serve(data: &[u8], per_io: usize, buffer: usize) -> Option<Vec<u8>> {
    let socket = Socket {
        data,
        per_io,
        written: Rc::default(),
    };
    let mut stream = AuthorityStream::server(socket, Path::new("fuzz").into());
    let mut cx = Context::from_waker(Waker::noop());
    let mut received = Vec::new();
    let mut chunk = vec![0; buffer];
    loop {
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut stream).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return Some(received),
            Poll::Ready(Ok(())) => received.extend_from_slice(buf.filled()),
            Poll::Ready(Err(_)) => return None,
            Poll::Pending => panic!("the layer waits on a socket that never blocks"),
        }
    }
}

/// What reaches the server when a client writes `data` through the client side, `per_io`
/// bytes at a time, or `None` if the layer refuses it.
fn dial(data: &[u8], per_io: usize) -> Option<Vec<u8>> {
    let written = Rc::default();
    let socket = Socket {
        data: &[],
        per_io,
        written: Rc::clone(&written),
    };
    let authority = Bytes::from_static(b"localhost");
    let mut stream = AuthorityStream::client(socket, Path::new("fuzz").into(), authority);
    let mut cx = Context::from_waker(Waker::noop());
    let mut rest = data;
    while !rest.is_empty() {
        let chunk = &rest[..per_io.min(rest.len())];
        match Pin::new(&mut stream).poll_write(&mut cx, chunk) {
            Poll::Ready(Ok(0)) => panic!("the layer took nothing"),
            Poll::Ready(Ok(n)) => rest = &rest[n..],
            Poll::Ready(Err(_)) => return None,
            Poll::Pending => panic!("the layer waits on a socket that never blocks"),
        }
    }
    match Pin::new(&mut stream).poll_flush(&mut cx) {
        Poll::Ready(result) => result.ok()?,
        Poll::Pending => panic!("the layer waits on a socket that never blocks"),
    }
    drop(stream);
    Rc::into_inner(written).map(RefCell::into_inner)
}

fuzz_target!(|input: &[u8]| {
    let Some((&shape, client)) = input.split_first() else {
        return;
    };
    let per_io = usize::from(shape & 0x0f) + 1;
    let buffer = usize::from(shape >> 4) * 97 + 1;
    let received = serve(client, per_io, buffer);
    let whole = serve(client, usize::MAX, 1 << 16);
    assert_eq!(
        received, whole,
        "the outcome depends on how the bytes arrive"
    );
    let Some(received) = received else {
        return;
    };
    assert_eq!(
        serve(&received, usize::MAX, 1 << 16).as_ref(),
        Some(&received),
        "what the server received changes when it passes again"
    );
    let sent = dial(client, per_io).expect("the client side takes what the server side takes");
    assert_eq!(
        dial(client, usize::MAX).as_ref(),
        Some(&sent),
        "the outcome depends on how the bytes are written"
    );
    assert_eq!(
        serve(&sent, usize::MAX, 1 << 16).as_ref(),
        Some(&sent),
        "what the client side sent changes on the server side"
    );
});
