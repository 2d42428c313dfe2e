//! What the lister prints for each message of the metadata stream: upstream's table (one row
//! per block, the record number repeated) or its JSON list of records. Pure.

use std::io::{self, Write};

use csi_proto::snapshotmetadata::{BlockMetadata, BlockMetadataType};

/// One message of the stream (GetMetadataAllocated and GetMetadataDelta answer alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// A `BlockMetadataType` value, kept as sent (an unknown value is shown as its number).
    pub block_metadata_type: i32,
    pub volume_capacity_bytes: i64,
    pub block_metadata: Vec<BlockMetadata>,
}

/// Receives the records in order, then `done` unless the stream failed.
pub trait Emitter {
    /// `number` counts from 1.
    fn record(&mut self, number: usize, record: &Record) -> io::Result<()>;
    fn done(&mut self, records: usize) -> io::Result<()>;
}

const TABLE_HEADER: &str = "Record#   VolCapBytes  BlockMetadataType   ByteOffset     SizeBytes\n\
                            ------- -------------- ----------------- -------------- --------------\n";

/// Upstream's `TableEmitter`: the header before the first record, nothing for no records.
#[derive(Debug)]
pub struct TableEmitter<W: Write>(pub W);

impl<W: Write> Emitter for TableEmitter<W> {
    fn record(&mut self, number: usize, record: &Record) -> io::Result<()> {
        if number == 1 {
            self.0.write_all(TABLE_HEADER.as_bytes())?;
        }
        let kind = type_name(record.block_metadata_type);
        for block in &record.block_metadata {
            writeln!(
                self.0,
                "{number:7} {:14} {kind:>17} {:14} {:14}",
                record.volume_capacity_bytes, block.byte_offset, block.size_bytes
            )?;
        }
        Ok(())
    }

    fn done(&mut self, _records: usize) -> io::Result<()> {
        self.0.flush()
    }
}

/// The enum's name as Go's generated `String()` gives it: the number when unknown.
fn type_name(value: i32) -> String {
    BlockMetadataType::try_from(value)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| value.to_string())
}

/// Upstream's `JSONEmitter`: one JSON list of the records as Go's encoding/json writes them
/// (snake_case keys, the type as its number, zero offsets and sizes left out as `omitempty`
/// leaves them, `null` for a record without blocks), no newline at the end.
#[derive(Debug)]
pub struct JsonEmitter<W: Write>(pub W);

impl<W: Write> Emitter for JsonEmitter<W> {
    fn record(&mut self, number: usize, record: &Record) -> io::Result<()> {
        let blocks = if record.block_metadata.is_empty() {
            serde_json::Value::Null
        } else {
            record
                .block_metadata
                .iter()
                .map(|block| {
                    let mut object = serde_json::Map::new();
                    if block.byte_offset != 0 {
                        object.insert("byte_offset".into(), block.byte_offset.into());
                    }
                    if block.size_bytes != 0 {
                        object.insert("size_bytes".into(), block.size_bytes.into());
                    }
                    serde_json::Value::Object(object)
                })
                .collect()
        };
        // Key order as the Go struct's fields (serde_json's map keeps insertion order only
        // with preserve_order, so the record is written by hand).
        write!(
            self.0,
            "{}{{\"block_metadata_type\":{},\"volume_capacity_bytes\":{},\"block_metadata\":{blocks}}}",
            if number == 1 { "[" } else { "," },
            record.block_metadata_type,
            record.volume_capacity_bytes,
        )
    }

    fn done(&mut self, records: usize) -> io::Result<()> {
        self.0.write_all(if records == 0 { b"[]" } else { b"]" })?;
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte_offset: i64, size_bytes: i64) -> BlockMetadata {
        BlockMetadata {
            byte_offset,
            size_bytes,
        }
    }

    fn records() -> Vec<Record> {
        vec![
            Record {
                block_metadata_type: BlockMetadataType::FixedLength as i32,
                volume_capacity_bytes: 1 << 30,
                block_metadata: vec![block(0, 4096), block(8192, 4096)],
            },
            Record {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: 1 << 30,
                block_metadata: vec![block(1 << 20, 3 << 20)],
            },
            Record {
                block_metadata_type: 7,
                volume_capacity_bytes: 1 << 30,
                block_metadata: vec![],
            },
        ]
    }

    fn emit(emitter: &mut impl Emitter, records: &[Record]) {
        for (i, record) in records.iter().enumerate() {
            emitter.record(i + 1, record).unwrap();
        }
        emitter.done(records.len()).unwrap();
    }

    #[test]
    fn the_table_has_a_row_per_block_as_upstreams() {
        let mut table = TableEmitter(Vec::new());
        emit(&mut table, &records());
        assert_eq!(
            String::from_utf8(table.0).unwrap(),
            "Record#   VolCapBytes  BlockMetadataType   ByteOffset     SizeBytes\n\
             ------- -------------- ----------------- -------------- --------------\n      \
             1     1073741824      FIXED_LENGTH              0           4096\n      \
             1     1073741824      FIXED_LENGTH           8192           4096\n      \
             2     1073741824   VARIABLE_LENGTH        1048576        3145728\n"
        );
        let mut empty = TableEmitter(Vec::new());
        emit(&mut empty, &[]);
        assert!(empty.0.is_empty());
    }

    #[test]
    fn json_is_one_list_as_go_encodes_it() {
        let mut json = JsonEmitter(Vec::new());
        emit(&mut json, &records());
        let text = String::from_utf8(json.0).unwrap();
        assert_eq!(
            text,
            "[{\"block_metadata_type\":1,\"volume_capacity_bytes\":1073741824,\"block_metadata\":[{\"size_bytes\":4096},{\"byte_offset\":8192,\"size_bytes\":4096}]},\
             {\"block_metadata_type\":2,\"volume_capacity_bytes\":1073741824,\"block_metadata\":[{\"byte_offset\":1048576,\"size_bytes\":3145728}]},\
             {\"block_metadata_type\":7,\"volume_capacity_bytes\":1073741824,\"block_metadata\":null}]"
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), 3);
        let mut empty = JsonEmitter(Vec::new());
        emit(&mut empty, &[]);
        assert_eq!(empty.0, b"[]");
    }
}
