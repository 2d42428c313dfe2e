//! The frame rewriter on byte streams made here or by another HPACK implementation.

use super::*;
use crate::grpc_authority::hpack::{Decoder, Field};

const PATH: &str = "/var/lib/kubelet/plugins/hostpath.csi-suite.io/csi.sock";

const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;

fn hex(text: &str) -> Vec<u8> {
    hex::decode(text).unwrap()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    FrameHeader {
        length: payload.len(),
        kind,
        flags,
        stream,
    }
    .put(&mut out);
    out.extend_from_slice(payload);
    out.to_vec()
}

/// A request header block as tonic sends it, with `authority` as a plain literal.
fn request(authority: &str) -> Vec<u8> {
    let mut block = Vec::new();
    hpack::encode(
        &[
            Field::new(":method", "POST"),
            Field::new(":scheme", "http"),
            Field::new(":path", "/csi.v1.Identity/GetPluginInfo"),
            Field::new(":authority", authority.to_string()),
            Field::new("content-type", "application/grpc"),
            Field::new("te", "trailers"),
        ],
        &mut block,
    );
    block
}

fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    [PREFACE.to_vec(), frames.concat()].concat()
}

/// Runs `input` through a rewriter at once and byte by byte; both must agree.
fn rewrite(rewrite: AuthorityRewrite, input: &[u8]) -> Result<Vec<u8>, FrameError> {
    let whole = feed(rewrite.clone(), [input])?;
    let bytewise = feed(rewrite, input.chunks(1))?;
    assert_eq!(whole, bytewise, "fed whole and byte by byte");
    Ok(whole)
}

fn feed<'a>(
    rewrite: AuthorityRewrite,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<u8>, FrameError> {
    let mut rewriter = FrameRewriter::new(rewrite);
    let (mut input, mut output) = (BytesMut::new(), VecDeque::new());
    for chunk in chunks {
        input.extend_from_slice(chunk);
        rewriter.process(&mut input, &mut output)?;
    }
    rewriter.finish(&input)?;
    Ok(output.into_iter().flat_map(|b| b.to_vec()).collect())
}

/// The frames after the preface: (type, flags, stream, payload).
fn frames(connection: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut rest = connection.strip_prefix(PREFACE).unwrap();
    let mut frames = Vec::new();
    while let Some(header) = FrameHeader::parse(rest) {
        let end = FRAME_HEADER_LEN + header.length;
        frames.push((
            header.kind,
            header.flags,
            header.stream,
            rest[FRAME_HEADER_LEN..end].to_vec(),
        ));
        rest = &rest[end..];
    }
    assert!(rest.is_empty(), "trailing bytes");
    frames
}

/// The header lists the server decodes, in order, with one decoder as h2 keeps one.
fn header_lists(connection: &[u8]) -> Vec<Vec<Field>> {
    let mut decoder = Decoder::default();
    let mut lists = Vec::new();
    let mut block = Vec::new();
    for (kind, flags, _, payload) in frames(connection) {
        match kind {
            HEADERS => {
                assert_eq!(flags & PADDED, 0, "re-encoded frames carry no padding");
                let skip = if flags & PRIORITY != 0 {
                    PRIORITY_LEN
                } else {
                    0
                };
                block = payload[skip..].to_vec();
            }
            CONTINUATION => block.extend_from_slice(&payload),
            _ => continue,
        }
        if flags & END_HEADERS != 0 {
            lists.push(decoder.decode(&block).unwrap());
        }
    }
    lists
}

fn authorities(connection: &[u8]) -> Vec<String> {
    header_lists(connection)
        .iter()
        .flat_map(|list| list.iter().filter(|f| f.name == ":authority"))
        .map(|f| String::from_utf8(f.value.to_vec()).unwrap())
        .collect()
}

#[test]
fn a_path_authority_is_served_as_localhost_and_the_rest_passes() {
    let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
    let data = frame(DATA, END_STREAM, 1, b"\0\0\0\0\0");
    let input = connection(&[
        settings.clone(),
        frame(HEADERS, END_HEADERS, 1, &request(PATH)),
        data.clone(),
    ]);
    let output = rewrite(AuthorityRewrite::Repair, &input).unwrap();
    assert_eq!(authorities(&output), ["localhost"]);
    let frames = frames(&output);
    assert_eq!(frames[0], (SETTINGS, 0, 0, settings[9..].to_vec()));
    assert_eq!(
        (frames[1].0, frames[1].1, frames[1].2),
        (HEADERS, END_HEADERS, 1)
    );
    assert_eq!(frames[2], (DATA, END_STREAM, 1, data[9..].to_vec()));
    assert_eq!(
        header_lists(&output)[0][2],
        Field::new(":path", "/csi.v1.Identity/GetPluginInfo")
    );
}

#[test]
fn an_empty_authority_is_served_as_localhost() {
    let input = connection(&[frame(HEADERS, END_HEADERS | END_STREAM, 3, &request(""))]);
    let output = rewrite(AuthorityRewrite::Repair, &input).unwrap();
    assert_eq!(authorities(&output), ["localhost"]);
    assert_eq!(frames(&output)[0].1, END_HEADERS | END_STREAM);
}

#[test]
fn a_valid_authority_passes_byte_for_byte() {
    // Incremental indexing, as h2's client sends it: later blocks refer to the server's table,
    // which must then stay the client's.
    let mut indexed = vec![0x83, 0x86, 0x44, 0x02, b'/', b'a', 0x41, 0x09];
    indexed.extend_from_slice(b"localhost");
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &indexed),
        frame(HEADERS, END_HEADERS, 3, &[0x83, 0x86, 0xbf, 0xbe]),
        frame(DATA, END_STREAM, 3, b"payload"),
    ]);
    assert_eq!(rewrite(AuthorityRewrite::Repair, &input).unwrap(), input);
}

#[test]
fn a_block_split_across_continuation_frames() {
    let block = request(PATH);
    let (a, rest) = block.split_at(10);
    let (b, c) = rest.split_at(30);
    let input = connection(&[
        frame(HEADERS, END_STREAM, 1, a),
        frame(CONTINUATION, 0, 1, b),
        frame(CONTINUATION, END_HEADERS, 1, c),
    ]);
    let output = rewrite(AuthorityRewrite::Repair, &input).unwrap();
    assert_eq!(authorities(&output), ["localhost"]);
    let frames = frames(&output);
    assert_eq!(frames.len(), 1, "re-encoded into one frame");
    assert_eq!(frames[0].1, END_STREAM | END_HEADERS);
}

#[test]
fn padding_is_dropped_and_priority_kept() {
    // Exclusive dependency on stream 7, weight 200; 4 bytes of padding.
    let priority = [0x80, 0, 0, 7, 200];
    let payload = [&[4][..], &priority, &request(PATH), &[0; 4]].concat();
    let input = connection(&[frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &payload)]);
    let output = rewrite(AuthorityRewrite::Repair, &input).unwrap();
    assert_eq!(authorities(&output), ["localhost"]);
    let (_, flags, _, payload) = &frames(&output)[0];
    assert_eq!(*flags, END_HEADERS | PRIORITY);
    assert_eq!(&payload[..PRIORITY_LEN], &priority);
}

/// Blocks from Python's `hpack` (an independent encoder): Huffman-coded strings, every field
/// indexed, the second request referring to the path authority through the dynamic table, and
/// a third after a table size update, with a valid authority.
#[test]
fn dynamic_table_references_to_a_path_authority() {
    let blocks = [
        "83864492608832fdc2be93c856349e42e22a725529ff41a763b8ec628346c75b632d054b15d16cc6a90c4e7426b1a675c8832c8b4c92ae63b04419741c9d7f5f8b1d75d0620d263d4c4d65647a8a9acac8b4c7602b89d5c34082497f864d833505b11f",
        "83864494608832fdc2be93c856349e42ee48e62f13d16d25c2c1c0bf",
        "3fe10183864490608832fdc2be490b524c9f4c6bb0f1974186a0e41d139d095f8b1d75d0620d263d4c4d65647a8a9acac8b4c7602b89d5c34082497f864d833505b11f",
    ];
    let input = connection(
        &blocks
            .iter()
            .enumerate()
            .map(|(i, block)| frame(HEADERS, END_HEADERS, 2 * i as u32 + 1, &hex(block)))
            .collect::<Vec<_>>(),
    );
    let output = rewrite(AuthorityRewrite::Repair, &input).unwrap();
    assert_eq!(authorities(&output), ["localhost"; 3]);
    let lists = header_lists(&output);
    assert_eq!(
        lists[1][2],
        Field::new(":path", "/csi.v1.Node/NodeStageVolume")
    );
    assert_eq!(lists[2][2], Field::new(":path", "/csi.v1.Identity/Probe"));
    assert_eq!(lists[2][5], Field::new("user-agent", "grpc-go/1.27.1"));
    for (_, _, _, payload) in frames(&output) {
        assert_ne!(
            payload[0] & 0xe0,
            0x20,
            "no dynamic table size update goes on"
        );
    }
}

#[test]
fn a_block_that_grows_is_split_into_frames_within_the_limit() {
    let mut block = Vec::new();
    hpack::encode(
        &[
            Field::new(":method", "POST"),
            Field::new(":authority", PATH),
            Field::new("x-metadata", "m".repeat(2 * MAX_FRAME_SIZE)),
        ],
        &mut block,
    );
    let input = connection(
        &block
            .chunks(MAX_FRAME_SIZE)
            .enumerate()
            .map(|(i, chunk)| {
                let (kind, last) = (
                    if i == 0 { HEADERS } else { CONTINUATION },
                    (i + 1) * MAX_FRAME_SIZE >= block.len(),
                );
                frame(kind, if last { END_HEADERS } else { 0 }, 1, chunk)
            })
            .collect::<Vec<_>>(),
    );
    let output = feed(AuthorityRewrite::Repair, [input.as_slice()]).unwrap();
    let frames = frames(&output);
    assert_eq!(frames.len(), 3);
    assert!(frames.iter().all(|f| f.3.len() <= MAX_FRAME_SIZE));
    let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        kinds,
        [(HEADERS, 0), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
    );
    let lists = header_lists(&output);
    assert_eq!(lists[0][1], Field::new(":authority", "localhost"));
    assert_eq!(lists[0][2].value.len(), 2 * MAX_FRAME_SIZE);
}

#[test]
fn the_client_side_sends_the_chosen_authority() {
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &request("localhost")),
        frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"),
    ]);
    let output = rewrite(
        AuthorityRewrite::Replace(Bytes::from_static(PATH.as_bytes())),
        &input,
    )
    .unwrap();
    assert_eq!(authorities(&output), [PATH]);
    let on_the_wire = output.windows(PATH.len()).any(|w| w == PATH.as_bytes());
    assert!(on_the_wire, "the path is a plain literal on the wire");
}

#[test]
fn garbage_and_broken_framing_are_errors() {
    let headers = |flags, stream, payload: &[u8]| frame(HEADERS, flags, stream, payload);
    let block = request(PATH);
    let cases: Vec<(Vec<u8>, FrameError)> = vec![
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            FrameError::Preface,
        ),
        (
            b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n".to_vec(),
            FrameError::Preface,
        ),
        (PREFACE[..10].to_vec(), FrameError::Truncated),
        (
            connection(&[frame(SETTINGS, 0, 0, &[0; 6])[..12].to_vec()]),
            FrameError::Truncated,
        ),
        (
            connection(&[headers(END_HEADERS, 1, &block)[..20].to_vec()]),
            FrameError::Truncated,
        ),
        (connection(&[headers(0, 1, &block)]), FrameError::Truncated),
        (
            connection(&[frame(CONTINUATION, END_HEADERS, 1, &block)]),
            FrameError::UnexpectedContinuation { stream: 1 },
        ),
        (
            connection(&[headers(0, 1, &block[..5]), frame(DATA, 0, 1, b"x")]),
            FrameError::ExpectedContinuation {
                stream: 1,
                kind: FrameType(DATA),
                got: 1,
            },
        ),
        (
            connection(&[
                headers(0, 1, &block[..5]),
                frame(CONTINUATION, END_HEADERS, 3, &block[5..]),
            ]),
            FrameError::ExpectedContinuation {
                stream: 1,
                kind: FrameType(CONTINUATION),
                got: 3,
            },
        ),
        (
            connection(&[headers(END_HEADERS, 0, &block)]),
            FrameError::StreamZero {
                kind: FrameType(HEADERS),
            },
        ),
        (
            connection(&[headers(END_HEADERS | PADDED, 1, &[9, 0x82])]),
            FrameError::Padding { length: 2 },
        ),
        (
            connection(&[headers(END_HEADERS | PRIORITY, 1, &[0, 0, 0])]),
            FrameError::Padding { length: 3 },
        ),
        (
            connection(&[headers(END_HEADERS, 1, &vec![0x82; MAX_FRAME_SIZE + 1])]),
            FrameError::FrameTooLarge {
                kind: FrameType(HEADERS),
                length: MAX_FRAME_SIZE + 1,
            },
        ),
        (
            connection(&[headers(
                END_HEADERS,
                1,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            )]),
            FrameError::Hpack(HpackError::IntegerOverflow),
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(
            feed(AuthorityRewrite::Repair, [input.as_slice()]),
            Err(expected.clone()),
            "{input:02x?}"
        );
        assert_eq!(
            feed(AuthorityRewrite::Repair, input.chunks(1)),
            Err(expected)
        );
    }
}

#[test]
fn errors_name_frames_as_the_rfc_does() {
    let error = FrameError::ExpectedContinuation {
        stream: 1,
        kind: FrameType(DATA),
        got: 1,
    };
    assert_eq!(
        error.to_string(),
        "the header block of stream 1 must continue with CONTINUATION, not DATA on stream 1"
    );
    assert_eq!(FrameType(0x42).to_string(), "type-0x42");
}
