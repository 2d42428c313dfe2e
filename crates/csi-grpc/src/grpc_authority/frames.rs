//! The client's half of an HTTP/2 connection (RFC 9113 §3.4, §4.1, §6.2, §6.10), header block
//! by header block: the connection preface and every frame other than HEADERS and CONTINUATION
//! pass as they are; a header block is collected whole, decoded, and forwarded either unchanged
//! or, once `:authority` has to change, re-encoded statelessly and split into fresh frames.

use std::collections::VecDeque;
use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use super::hpack::{self, HpackError};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const FRAME_HEADER_LEN: usize = 9;

/// SETTINGS_MAX_FRAME_SIZE's initial value and floor (RFC 9113 §6.5.2): every peer accepts
/// frames this large, and our servers (h2's default) accept no larger, so a larger header
/// frame is refused here as h2 would refuse it.
pub const MAX_FRAME_SIZE: usize = 16_384;

/// Bound of one collected header block (HEADERS + CONTINUATION fragments).
const MAX_HEADER_BLOCK: usize = 64 * MAX_FRAME_SIZE;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Stream dependency (4 bytes) and weight (1 byte) of a HEADERS frame with PRIORITY.
const PRIORITY_LEN: usize = 5;

/// A frame type, named as RFC 9113 names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameType(pub u8);

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 10] = [
            "DATA",
            "HEADERS",
            "PRIORITY",
            "RST_STREAM",
            "SETTINGS",
            "PUSH_PROMISE",
            "PING",
            "GOAWAY",
            "WINDOW_UPDATE",
            "CONTINUATION",
        ];
        match NAMES.get(usize::from(self.0)) {
            Some(name) => f.write_str(name),
            None => write!(f, "type-{:#04x}", self.0),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not an HTTP/2 connection: the client did not send the connection preface")]
    Preface,
    #[error("{kind} frame of {length} bytes exceeds the frame size limit of {MAX_FRAME_SIZE}")]
    FrameTooLarge { kind: FrameType, length: usize },
    #[error("{kind} frame on stream 0")]
    StreamZero { kind: FrameType },
    #[error(
        "the header block of stream {stream} must continue with CONTINUATION, not {kind} on stream {got}"
    )]
    ExpectedContinuation {
        stream: u32,
        kind: FrameType,
        got: u32,
    },
    #[error("CONTINUATION on stream {stream} without a header block to continue")]
    UnexpectedContinuation { stream: u32 },
    #[error("HEADERS frame of {length} bytes is shorter than its padding and priority fields")]
    Padding { length: usize },
    #[error("header block of stream {stream} exceeds {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge { stream: u32 },
    #[error("HPACK: {0}")]
    Hpack(#[from] HpackError),
    #[error("connection closed in the middle of an HTTP/2 frame")]
    Truncated,
}

/// What becomes of a request's `:authority`.
#[derive(Clone, Debug)]
pub enum AuthorityRewrite {
    /// Server side: a value h2 would refuse (not a URI authority: a socket path, empty) is
    /// served as `localhost`; valid ones stay.
    Repair,
    /// Client side: every request carries this value.
    Replace(Bytes),
}

impl AuthorityRewrite {
    fn rewrite(&self, value: &Bytes) -> Option<Bytes> {
        match self {
            // The very check h2 applies to :authority.
            Self::Repair => http::uri::Authority::try_from(value.as_ref())
                .is_err()
                .then(|| Bytes::from_static(b"localhost")),
            Self::Replace(authority) => (value != authority).then(|| authority.clone()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(input: &[u8]) -> Option<Self> {
        let header = input.get(..FRAME_HEADER_LEN)?;
        Some(Self {
            length: u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize,
            kind: header[3],
            flags: header[4],
            stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
        })
    }

    fn put(&self, out: &mut BytesMut) {
        out.put_uint(self.length as u64, 3);
        out.put_u8(self.kind);
        out.put_u8(self.flags);
        out.put_u32(self.stream);
    }
}

#[derive(Debug)]
enum State {
    Preface {
        matched: usize,
    },
    FrameHeader,
    /// Payload bytes of a frame that passes unchanged.
    Forward {
        remaining: usize,
    },
}

/// A header block being collected.
#[derive(Debug)]
struct HeaderBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<Bytes>,
    fragments: BytesMut,
    /// The frames as received, forwarded as they are when nothing needs to change.
    frames: Vec<Bytes>,
}

/// The rewriting state of one connection's client-to-server direction.
#[derive(Debug)]
pub struct FrameRewriter {
    state: State,
    block: Option<HeaderBlock>,
    decoder: hpack::Decoder,
    authority: AuthorityRewrite,
    /// Set by the first rewritten block: the server's dynamic table no longer follows the
    /// client's from then on, so every later block is re-encoded too.
    reencoding: bool,
}

impl FrameRewriter {
    pub fn new(authority: AuthorityRewrite) -> Self {
        Self {
            state: State::Preface { matched: 0 },
            block: None,
            decoder: hpack::Decoder::default(),
            authority,
            reencoding: false,
        }
    }

    /// Consumes every complete unit of `input` (leaving an incomplete one there), queueing
    /// what the server is to receive in `output`.
    pub fn process(
        &mut self,
        input: &mut BytesMut,
        output: &mut VecDeque<Bytes>,
    ) -> Result<(), FrameError> {
        loop {
            match self.state {
                State::Preface { matched } => {
                    let n = (PREFACE.len() - matched).min(input.len());
                    if input[..n] != PREFACE[matched..matched + n] {
                        return Err(FrameError::Preface);
                    }
                    if n == 0 {
                        return Ok(());
                    }
                    output.push_back(input.split_to(n).freeze());
                    self.state = match matched + n {
                        done if done == PREFACE.len() => State::FrameHeader,
                        matched => State::Preface { matched },
                    };
                }
                State::Forward { remaining } => {
                    let n = remaining.min(input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    output.push_back(input.split_to(n).freeze());
                    self.passed(n);
                }
                State::FrameHeader => {
                    let Some(header) = FrameHeader::parse(input) else {
                        return Ok(());
                    };
                    if header.kind != HEADERS && header.kind != CONTINUATION {
                        if let Some(block) = &self.block {
                            return Err(FrameError::ExpectedContinuation {
                                stream: block.stream,
                                kind: FrameType(header.kind),
                                got: header.stream,
                            });
                        }
                        output.push_back(input.split_to(FRAME_HEADER_LEN).freeze());
                        self.state = State::Forward {
                            remaining: header.length,
                        };
                        self.passed(0);
                        continue;
                    }
                    self.check_header_frame(&header)?;
                    if input.len() < FRAME_HEADER_LEN + header.length {
                        return Ok(());
                    }
                    let frame = input.split_to(FRAME_HEADER_LEN + header.length).freeze();
                    self.header_frame(&header, frame, output)?;
                }
            }
        }
    }

    /// Payload bytes that pass unchanged and may go from the socket to the server directly.
    pub fn passthrough(&self) -> usize {
        match self.state {
            State::Forward { remaining } => remaining,
            _ => 0,
        }
    }

    /// Records `n` payload bytes forwarded (at most [`Self::passthrough`]).
    pub fn passed(&mut self, n: usize) {
        if let State::Forward { remaining } = &mut self.state {
            *remaining -= n;
            if *remaining == 0 {
                self.state = State::FrameHeader;
            }
        }
    }

    /// At the end of the client's stream: fine between frames, an error inside one.
    pub fn finish(&self, unprocessed: &[u8]) -> Result<(), FrameError> {
        match self.state {
            State::Preface { matched: 0 } | State::FrameHeader
                if unprocessed.is_empty() && self.block.is_none() =>
            {
                Ok(())
            }
            _ => Err(FrameError::Truncated),
        }
    }

    fn check_header_frame(&self, header: &FrameHeader) -> Result<(), FrameError> {
        let kind = FrameType(header.kind);
        if header.length > MAX_FRAME_SIZE {
            return Err(FrameError::FrameTooLarge {
                kind,
                length: header.length,
            });
        }
        if header.stream == 0 {
            return Err(FrameError::StreamZero { kind });
        }
        match (&self.block, header.kind) {
            (Some(block), _) if header.kind == HEADERS || block.stream != header.stream => {
                Err(FrameError::ExpectedContinuation {
                    stream: block.stream,
                    kind,
                    got: header.stream,
                })
            }
            (None, CONTINUATION) => Err(FrameError::UnexpectedContinuation {
                stream: header.stream,
            }),
            _ => Ok(()),
        }
    }

    fn header_frame(
        &mut self,
        header: &FrameHeader,
        frame: Bytes,
        output: &mut VecDeque<Bytes>,
    ) -> Result<(), FrameError> {
        let payload = frame.slice(FRAME_HEADER_LEN..);
        let (mut block, fragment) = match self.block.take() {
            Some(block) => (block, payload),
            None => {
                let (fragment, priority) = headers_payload(header.flags, payload)?;
                let block = HeaderBlock {
                    stream: header.stream,
                    end_stream: header.flags & END_STREAM != 0,
                    priority,
                    fragments: BytesMut::new(),
                    frames: Vec::new(),
                };
                (block, fragment)
            }
        };
        if block.fragments.len() + fragment.len() > MAX_HEADER_BLOCK {
            return Err(FrameError::HeaderBlockTooLarge {
                stream: block.stream,
            });
        }
        block.fragments.extend_from_slice(&fragment);
        block.frames.push(frame);
        if header.flags & END_HEADERS != 0 {
            self.finish_block(block, output)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    fn finish_block(
        &mut self,
        block: HeaderBlock,
        output: &mut VecDeque<Bytes>,
    ) -> Result<(), FrameError> {
        let mut fields = self.decoder.decode(&block.fragments)?;
        let mut rewritten = false;
        for field in fields.iter_mut().filter(|f| f.name == ":authority") {
            if let Some(value) = self.authority.rewrite(&field.value) {
                if !self.reencoding {
                    tracing::debug!(from = ?field.value, to = ?value, "rewriting the HTTP/2 :authority of this connection");
                }
                field.value = value;
                rewritten = true;
            }
        }
        if !(rewritten || self.reencoding) {
            output.extend(block.frames);
            return Ok(());
        }
        self.reencoding = true;
        let mut encoded = Vec::with_capacity(block.fragments.len() + 64);
        hpack::encode(&fields, &mut encoded);
        output.push_back(header_frames(
            block.stream,
            block.end_stream,
            block.priority,
            &encoded,
        ));
        Ok(())
    }
}

/// The header block fragment and priority fields of a HEADERS payload, padding dropped.
fn headers_payload(flags: u8, payload: Bytes) -> Result<(Bytes, Option<Bytes>), FrameError> {
    let padded = flags & PADDED != 0;
    let pad_length_field = usize::from(padded);
    let fixed = pad_length_field
        + if flags & PRIORITY != 0 {
            PRIORITY_LEN
        } else {
            0
        };
    let padding = if padded {
        payload.first().map_or(0, |pad| usize::from(*pad))
    } else {
        0
    };
    if fixed + padding > payload.len() {
        return Err(FrameError::Padding {
            length: payload.len(),
        });
    }
    let priority = (fixed > pad_length_field).then(|| payload.slice(pad_length_field..fixed));
    Ok((payload.slice(fixed..payload.len() - padding), priority))
}

/// A HEADERS frame and as many CONTINUATION frames as `block` needs, none over the limit.
fn header_frames(stream: u32, end_stream: bool, priority: Option<Bytes>, block: &[u8]) -> Bytes {
    let priority_len = priority.as_ref().map_or(0, Bytes::len);
    let frames = (priority_len + block.len()).div_ceil(MAX_FRAME_SIZE).max(1);
    let mut out = BytesMut::with_capacity(frames * FRAME_HEADER_LEN + priority_len + block.len());
    let (first, mut rest) = block.split_at(block.len().min(MAX_FRAME_SIZE - priority_len));
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    FrameHeader {
        length: priority_len + first.len(),
        kind: HEADERS,
        flags,
        stream,
    }
    .put(&mut out);
    if let Some(priority) = priority {
        out.put(priority);
    }
    out.put_slice(first);
    while !rest.is_empty() {
        let (chunk, remaining) = rest.split_at(rest.len().min(MAX_FRAME_SIZE));
        rest = remaining;
        FrameHeader {
            length: chunk.len(),
            kind: CONTINUATION,
            flags: if rest.is_empty() { END_HEADERS } else { 0 },
            stream,
        }
        .put(&mut out);
        out.put_slice(chunk);
    }
    out.freeze()
}

#[cfg(test)]
mod tests;
