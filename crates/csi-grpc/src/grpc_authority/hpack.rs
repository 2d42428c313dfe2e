//! HPACK (RFC 7541): a decoder that mirrors the peer encoder's dynamic table, and a stateless
//! encoder whose header blocks never use or change the receiver's dynamic table.

use std::collections::VecDeque;

use bytes::Bytes;

use super::huffman::{self, HuffmanError};

/// The dynamic table size every HPACK context starts with (SETTINGS_HEADER_TABLE_SIZE default).
const INITIAL_TABLE_SIZE: usize = 4096;

/// The largest dynamic table a peer may ask for. Its size updates never reach the server (the
/// re-encoded blocks drop them), so this bound is only about the memory of the mirror table.
const MAX_TABLE_SIZE: usize = 64 * 1024;

/// The largest header list one block may decode to (sizes counted as RFC 9113 §6.5.2 counts
/// them), as large as the largest block collected (`frames::MAX_HEADER_BLOCK`). Our servers
/// (hyper's default) take 16 KiB; the bound is about what re-encoding writes out: one-byte
/// references to a 4 KiB dynamic-table entry would turn a 1 MiB block into 4 GiB.
const MAX_HEADER_LIST_SIZE: usize = 1 << 20;

/// Per-entry overhead counted in the table size (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// RFC 7541 Appendix A; index 1 is the first entry.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field representation")]
    Truncated,
    #[error("integer does not fit the decoder's limits")]
    IntegerOverflow,
    #[error("header table index {0} does not exist")]
    InvalidIndex(usize),
    #[error("dynamic table size update to {size} bytes exceeds the limit of {MAX_TABLE_SIZE}")]
    TableSizeTooLarge { size: usize },
    #[error("dynamic table size update after the first header field")]
    LateTableSizeUpdate,
    #[error("header block decodes to a header list of more than {MAX_HEADER_LIST_SIZE} bytes")]
    HeaderListTooLarge,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
}

/// One decoded header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as "never indexed": an intermediary must forward it the same way (RFC 7541 §6.2.3).
    pub never_indexed: bool,
}

impl Field {
    pub fn new(name: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            never_indexed: false,
        }
    }

    fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// The decoding context of one direction of one connection.
#[derive(Debug)]
pub struct Decoder {
    /// Newest entry first: dynamic index 62 is `entries[0]`.
    entries: VecDeque<Field>,
    size: usize,
    max_size: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max_size: INITIAL_TABLE_SIZE,
        }
    }
}

impl Decoder {
    /// Decodes one complete header block, updating the dynamic table as the encoder did.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut list_size = 0;
        let mut input = Input { block, at: 0 };
        while let Some(first) = input.peek() {
            let field = if first & 0x80 != 0 {
                let index = input.integer(7)?;
                self.entry(index)?
            } else if first & 0x40 != 0 {
                let field = self.literal(&mut input, 6, false)?;
                self.insert(field.clone());
                field
            } else if first & 0x20 != 0 {
                if !fields.is_empty() {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let size = input.integer(5)?;
                if size > MAX_TABLE_SIZE {
                    return Err(HpackError::TableSizeTooLarge { size });
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                let never_indexed = first & 0x10 != 0;
                self.literal(&mut input, 4, never_indexed)?
            };
            list_size += field.size();
            if list_size > MAX_HEADER_LIST_SIZE {
                return Err(HpackError::HeaderListTooLarge);
            }
            fields.push(field);
        }
        Ok(fields)
    }

    fn entry(&self, index: usize) -> Result<Field, HpackError> {
        match index {
            1..=61 => {
                let (name, value) = STATIC_TABLE[index - 1];
                Ok(Field::new(name, value))
            }
            _ => index
                .checked_sub(STATIC_TABLE.len() + 1)
                .and_then(|i| self.entries.get(i))
                .cloned()
                .ok_or(HpackError::InvalidIndex(index)),
        }
    }

    /// A literal field whose name is indexed (prefix integer > 0) or follows as a string.
    fn literal(
        &self,
        input: &mut Input,
        prefix: u8,
        never_indexed: bool,
    ) -> Result<Field, HpackError> {
        let name = match input.integer(prefix)? {
            0 => input.string()?,
            index => self.entry(index)?.name,
        };
        let value = input.string()?;
        Ok(Field {
            name,
            value,
            never_indexed,
        })
    }

    fn insert(&mut self, field: Field) {
        let size = field.size();
        self.evict(size);
        // An entry larger than the table empties it and is not added (RFC 7541 §4.4).
        if size <= self.max_size {
            self.size += size;
            self.entries.push_front(field);
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit (or the table is empty).
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.entries.pop_back() {
                Some(evicted) => self.size -= evicted.size(),
                None => break,
            }
        }
    }
}

struct Input<'a> {
    block: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn peek(&self) -> Option<u8> {
        self.block.get(self.at).copied()
    }

    fn next(&mut self) -> Result<u8, HpackError> {
        let byte = self.peek().ok_or(HpackError::Truncated)?;
        self.at += 1;
        Ok(byte)
    }

    /// An integer with an N-bit prefix (RFC 7541 §5.1), bounded well within `usize`.
    fn integer(&mut self, prefix: u8) -> Result<usize, HpackError> {
        let mask = (1u8 << prefix) - 1;
        let mut value = usize::from(self.next()? & mask);
        if value < usize::from(mask) {
            return Ok(value);
        }
        for shift in (0..28).step_by(7) {
            let byte = self.next()?;
            value += usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HpackError::IntegerOverflow)
    }

    /// A string literal (RFC 7541 §5.2), Huffman-coded or not.
    fn string(&mut self) -> Result<Bytes, HpackError> {
        let huffman = self.peek().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let length = self.integer(7)?;
        let end = self
            .at
            .checked_add(length)
            .filter(|end| *end <= self.block.len())
            .ok_or(HpackError::Truncated)?;
        let raw = &self.block[self.at..end];
        self.at = end;
        Ok(if huffman {
            Bytes::from(huffman::decode(raw)?)
        } else {
            Bytes::copy_from_slice(raw)
        })
    }
}

/// Encodes `fields` without touching any dynamic table: static-table references where a field
/// or its name is in the static table, literals "without indexing" (or "never indexed", as
/// received) otherwise, strings as they are.
pub fn encode(fields: &[Field], block: &mut Vec<u8>) {
    for field in fields {
        let static_index = |value_too: bool| {
            STATIC_TABLE
                .iter()
                .position(|(name, value)| {
                    name.as_bytes() == field.name && (!value_too || value.as_bytes() == field.value)
                })
                .map(|i| i + 1)
        };
        if !field.never_indexed
            && let Some(index) = static_index(true)
        {
            integer(block, 0x80, 7, index);
            continue;
        }
        let representation = if field.never_indexed { 0x10 } else { 0x00 };
        match static_index(false) {
            Some(index) => integer(block, representation, 4, index),
            None => {
                block.push(representation);
                string(block, &field.name);
            }
        }
        string(block, &field.value);
    }
}

fn integer(block: &mut Vec<u8>, representation: u8, prefix: u8, mut value: usize) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        block.push(representation | value as u8);
        return;
    }
    block.push(representation | mask as u8);
    value -= mask;
    while value >= 0x80 {
        block.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    block.push(value as u8);
}

fn string(block: &mut Vec<u8>, text: &[u8]) {
    integer(block, 0x00, 7, text.len());
    block.extend_from_slice(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        hex::decode(text.replace([' ', '\n'], "")).unwrap()
    }

    fn fields(list: &[(&'static str, &'static str)]) -> Vec<Field> {
        list.iter().map(|(n, v)| Field::new(*n, *v)).collect()
    }

    fn table(decoder: &Decoder) -> (Vec<Field>, usize) {
        (decoder.entries.iter().cloned().collect(), decoder.size)
    }

    /// RFC 7541 C.3 (plain literals) and C.4 (the same requests Huffman-coded): three requests
    /// of one connection, each referring to entries the previous ones added.
    #[test]
    fn requests_of_rfc_7541_appendix_c() {
        let first = fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]);
        let second = [first.clone(), fields(&[("cache-control", "no-cache")])].concat();
        let third = fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]);
        for blocks in [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ] {
            let mut decoder = Decoder::default();
            assert_eq!(decoder.decode(&hex(blocks[0])).unwrap(), first);
            assert_eq!(decoder.decode(&hex(blocks[1])).unwrap(), second);
            assert_eq!(decoder.decode(&hex(blocks[2])).unwrap(), third);
            assert_eq!(
                table(&decoder),
                (
                    fields(&[
                        ("custom-key", "custom-value"),
                        ("cache-control", "no-cache"),
                        (":authority", "www.example.com"),
                    ]),
                    164
                )
            );
        }
    }

    /// RFC 7541 C.5: responses with a 256-byte table, so entries are evicted.
    #[test]
    fn eviction_of_rfc_7541_appendix_c5() {
        let mut decoder = Decoder::default();
        decoder.decode(&[0x3f, 0xe1, 0x01]).unwrap();
        assert_eq!(decoder.max_size, 256);
        decoder
            .decode(&hex(
                "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
                 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
                 6c65 2e63 6f6d",
            ))
            .unwrap();
        assert_eq!(table(&decoder).1, 222);
        let second = decoder.decode(&hex("4803 3330 37c1 c0bf")).unwrap();
        assert_eq!(second[0], Field::new(":status", "307"));
        assert_eq!(second[3], Field::new("location", "https://www.example.com"));
        let (entries, size) = table(&decoder);
        assert_eq!(size, 222);
        assert_eq!(entries[0], Field::new(":status", "307"));
        assert_eq!(entries.len(), 4);
    }

    #[test]
    fn never_indexed_fields_stay_never_indexed() {
        // RFC 7541 C.2.3: password: secret, never indexed.
        let block = hex("1008 7061 7373 776f 7264 0673 6563 7265 74");
        let decoded = Decoder::default().decode(&block).unwrap();
        assert!(decoded[0].never_indexed);
        let mut encoded = Vec::new();
        encode(&decoded, &mut encoded);
        assert_eq!(encoded, block);
    }

    #[test]
    fn the_encoder_is_stateless() {
        let list = vec![
            Field::new(":method", "POST"),
            Field::new(":scheme", "http"),
            Field::new(":path", "/csi.v1.Identity/GetPluginInfo"),
            Field::new(":authority", "localhost"),
            Field::new("content-type", "application/grpc"),
            Field::new("te", "trailers"),
            Field::new("x-long", "v".repeat(300)),
            Field {
                never_indexed: true,
                ..Field::new(":method", "POST")
            },
        ];
        let mut block = Vec::new();
        encode(&list, &mut block);
        // :method POST and :scheme http are static entries; :path is a static name.
        assert_eq!(&block[..3], &[0x83, 0x86, 0x04]);
        let mut decoder = Decoder::default();
        assert_eq!(decoder.decode(&block).unwrap(), list);
        assert_eq!(decoder.decode(&block).unwrap(), list);
        assert_eq!(table(&decoder), (Vec::new(), 0));
    }

    #[test]
    fn malformed_blocks_are_errors() {
        for (block, error) in [
            (vec![0x80], HpackError::InvalidIndex(0)),
            (vec![0xbe], HpackError::InvalidIndex(62)),
            (vec![0x41], HpackError::Truncated),
            (vec![0x41, 0x05, b'a'], HpackError::Truncated),
            (vec![0x00, 0x7f], HpackError::Truncated),
            (
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                HpackError::IntegerOverflow,
            ),
            (vec![0x82, 0x20], HpackError::LateTableSizeUpdate),
            (
                vec![0x3f, 0xe2, 0xff, 0x03],
                HpackError::TableSizeTooLarge { size: 65_537 },
            ),
            (
                vec![0x41, 0x81, 0x00],
                HpackError::Huffman(HuffmanError::Padding),
            ),
            // A 4 KiB entry, then 300 one-byte references to it: 1.2 MiB of fields.
            (
                [
                    &[0x40, 0x01, b'x', 0x7f, 0xa1, 0x1e][..],
                    &[b'v'; 4000],
                    &[0xbe; 300],
                ]
                .concat(),
                HpackError::HeaderListTooLarge,
            ),
        ] {
            assert_eq!(
                Decoder::default().decode(&block),
                Err(error),
                "{block:02x?}"
            );
        }
    }

    #[test]
    fn integers_round_trip_across_prefix_boundaries() {
        for prefix in [4, 5, 6, 7] {
            for value in [
                0,
                1,
                14,
                15,
                16,
                30,
                31,
                62,
                63,
                126,
                127,
                128,
                1337,
                1 << 20,
            ] {
                let mut block = Vec::new();
                integer(&mut block, 0, prefix, value);
                let mut input = Input {
                    block: &block,
                    at: 0,
                };
                assert_eq!(input.integer(prefix), Ok(value), "{value} / {prefix}");
                assert_eq!(input.at, block.len());
            }
        }
    }
}
