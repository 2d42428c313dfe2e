//! Copies that keep holes, and a budget on the bytes they write. A volume's file may be sparse
//! (a 2 GiB file holding 8 KiB): copied byte for byte, every zero of its holes would be read
//! and written, and a clone, snapshot or restore would take the whole 2 GiB of the state
//! filesystem. Here only the extents that hold data are read (`SEEK_DATA`/`SEEK_HOLE`), and
//! a stream of bytes (a file inside a tar archive) is written without its zero blocks.
//!
//! The [`Budget`] is the new volume's capacity: a copy that would write more than it is
//! refused as soon as it does (`ErrorKind::QuotaExceeded`), before the state filesystem pays
//! for the excess.

use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// The block a stream is written in: a run of zeros this long and aligned becomes a hole.
const BLOCK: usize = 4096;

/// Bytes a copy may still write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    left: u64,
}

impl Budget {
    pub fn new(bytes: u64) -> Self {
        Self { left: bytes }
    }

    /// Takes `bytes` from the budget, or refuses when it has not that much left.
    pub fn spend(&mut self, bytes: u64) -> io::Result<()> {
        self.left = self.left.checked_sub(bytes).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::QuotaExceeded,
                "the data is larger than the volume's capacity",
            )
        })?;
        Ok(())
    }
}

/// The ranges of the first `length` bytes of `file` that hold data, in order; the rest are
/// holes. A file system without hole reporting answers one range, the whole file.
pub fn data_extents(file: &File, length: u64) -> io::Result<Vec<Range<u64>>> {
    let mut extents = Vec::new();
    let mut offset = 0;
    while let Some(extent) = next_data_extent(file, offset, length)? {
        offset = extent.end;
        extents.push(extent);
    }
    Ok(extents)
}

/// The first range of `file` holding data at or after `offset`, cut at `length` (the part
/// at `offset` when `offset` lies in data); `None` when only holes follow.
pub fn next_data_extent(file: &File, offset: u64, length: u64) -> io::Result<Option<Range<u64>>> {
    if offset >= length {
        return Ok(None);
    }
    let data = match rustix::fs::seek(file, SeekFrom::Data(offset)) {
        Ok(data) => data,
        // No data after `offset`: the rest is a hole.
        Err(Errno::NXIO) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    if data >= length {
        return Ok(None);
    }
    let hole = rustix::fs::seek(file, SeekFrom::Hole(data))?.min(length);
    Ok(Some(data..hole))
}

/// Copies the first `length` bytes of `from` into `to` (sized to `length`), only the extents
/// that hold data. The source may shrink meanwhile (a tenant's file): what is gone reads as a
/// hole.
pub fn copy(from: &File, to: &File, length: u64, budget: &mut Budget) -> io::Result<()> {
    to.set_len(length)?;
    for extent in data_extents(from, length)? {
        budget.spend(extent.end - extent.start)?;
        let (mut read_at, mut write_at) = (extent.start, extent.start);
        while read_at < extent.end {
            let chunk = usize::try_from(extent.end - read_at).unwrap_or(usize::MAX);
            let copied = rustix::fs::copy_file_range(
                from,
                Some(&mut read_at),
                to,
                Some(&mut write_at),
                chunk,
            )?;
            if copied == 0 {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Writes the stream `from` into the empty file `to`, leaving a hole for every aligned block
/// of zeros; returns the bytes the stream held.
pub fn write_stream(from: &mut dyn Read, to: &File, budget: &mut Budget) -> io::Result<u64> {
    let length = write_at(from, to, 0, budget)?;
    to.set_len(length)?;
    Ok(length)
}

/// Writes the extents of a file of `size` bytes into the empty file `to`: `from` holds their
/// bytes one after another (as a sparse archive entry does).
pub fn write_extents(
    from: &mut dyn Read,
    to: &File,
    extents: &[Range<u64>],
    size: u64,
    budget: &mut Budget,
) -> io::Result<()> {
    for extent in extents {
        let length = extent.end - extent.start;
        let written = write_at(&mut from.take(length), to, extent.start, budget)?;
        if written != length {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{written} of the {length} bytes at offset {}", extent.start),
            ));
        }
    }
    to.set_len(size)
}

/// Writes the stream `from` into `to` from offset `start` on, blocks of zeros left out;
/// returns the bytes the stream held.
fn write_at(from: &mut dyn Read, to: &File, start: u64, budget: &mut Budget) -> io::Result<u64> {
    let mut buffer = vec![0; 16 * BLOCK];
    let mut offset = start;
    loop {
        let filled = fill(from, &mut buffer)?;
        if filled == 0 {
            break;
        }
        let mut blocks = buffer[..filled].chunks(BLOCK).peekable();
        let mut at = offset;
        while let Some(block) = blocks.next() {
            if is_zero(block) {
                at += block.len() as u64;
                continue;
            }
            // A run of blocks holding data, written at once.
            let run_start = at;
            let mut run = block.len();
            while let Some(next) = blocks.next_if(|next| !is_zero(next)) {
                run += next.len();
            }
            let begin = usize::try_from(run_start - offset).map_err(io::Error::other)?;
            budget.spend(run as u64)?;
            to.write_all_at(&buffer[begin..begin + run], run_start)?;
            at = run_start + run as u64;
        }
        offset += filled as u64;
    }
    Ok(offset - start)
}

/// Reads until `buffer` is full or the stream ends; returns how much was read.
fn fill(from: &mut dyn Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match from.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// A slice comparison (memcmp): gigabytes of a hole's zeros pass here.
fn is_zero(block: &[u8]) -> bool {
    static ZEROS: [u8; BLOCK] = [0; BLOCK];
    block == &ZEROS[..block.len()]
}

/// Reads the given extents of a file one after another, each exactly as long as it is
/// listed: a file that shrank meanwhile reads as zeros where its data went. What an archive
/// declares it holds, it then holds.
#[derive(Debug)]
pub struct Extents<'a> {
    file: &'a File,
    extents: std::slice::Iter<'a, Range<u64>>,
    current: Range<u64>,
}

impl<'a> Extents<'a> {
    pub fn new(file: &'a File, extents: &'a [Range<u64>]) -> Self {
        Self {
            file,
            extents: extents.iter(),
            current: 0..0,
        }
    }
}

impl Read for Extents<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.extents.next() {
                Some(next) => self.current = next.clone(),
                None => return Ok(0),
            }
        }
        let want = usize::try_from(self.current.end - self.current.start)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        let read = match self.file.read_at(&mut buffer[..want], self.current.start)? {
            0 => {
                buffer[..want].fill(0);
                want
            }
            read => read,
        };
        self.current.start += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const MIB: u64 = 1 << 20;

    /// A sparse file of `length` bytes holding `pieces`.
    fn sparse_file(dir: &std::path::Path, length: u64, pieces: &[(u64, &[u8])]) -> File {
        let path = dir.join("source");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        file.set_len(length).unwrap();
        for (at, bytes) in pieces {
            file.write_all_at(bytes, *at).unwrap();
        }
        file
    }

    fn allocated(file: &File) -> u64 {
        file.metadata().unwrap().blocks() * 512
    }

    fn read_all(file: &File) -> Vec<u8> {
        let mut bytes = vec![0; usize::try_from(file.metadata().unwrap().len()).unwrap()];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    #[test]
    fn a_budget_refuses_what_it_has_not() {
        let mut budget = Budget::new(10);
        budget.spend(4).unwrap();
        budget.spend(6).unwrap();
        let refused = budget.spend(1).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::QuotaExceeded);
        assert_eq!(budget, Budget::new(0));
    }

    #[test]
    fn copies_keep_data_and_holes_and_stay_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let pieces: [(u64, &[u8]); 3] =
            [(0, b"head"), (40 * MIB, b"middle"), (64 * MIB - 4, b"tail")];
        let source = sparse_file(dir.path(), 64 * MIB, &pieces);
        let target = File::create(dir.path().join("copy")).unwrap();
        let mut budget = Budget::new(MIB);
        copy(&source, &target, 64 * MIB, &mut budget).unwrap();
        let target = File::open(dir.path().join("copy")).unwrap();
        assert_eq!(read_all(&target), read_all(&source));
        assert!(
            allocated(&target) < MIB,
            "{} bytes on disk",
            allocated(&target)
        );

        let refused = File::create(dir.path().join("refused")).unwrap();
        let error = copy(&source, &refused, 64 * MIB, &mut Budget::new(4096)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::QuotaExceeded);
    }

    #[test]
    fn a_stream_is_written_without_its_zero_blocks() {
        let dir = tempfile::tempdir().unwrap();
        // Zeros, data straddling a block boundary, zeros, a short dense tail.
        let mut stream = vec![0u8; 32 * MIB as usize];
        stream[5 * BLOCK - 3..5 * BLOCK + 3].copy_from_slice(b"across");
        stream.extend(b"end");
        let target = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("written"))
            .unwrap();
        let mut budget = Budget::new(2 * BLOCK as u64 + 3);
        let length = write_stream(&mut stream.as_slice(), &target, &mut budget).unwrap();
        assert_eq!(length, stream.len() as u64);
        assert_eq!(read_all(&target), stream);
        assert!(
            allocated(&target) <= 4 * BLOCK as u64,
            "{}",
            allocated(&target)
        );
        assert_eq!(
            budget,
            Budget::new(0),
            "two data blocks and the 3-byte tail"
        );

        let dense = vec![1u8; 2 * BLOCK];
        let refused = File::create(dir.path().join("refused")).unwrap();
        let error = write_stream(
            &mut dense.as_slice(),
            &refused,
            &mut Budget::new(BLOCK as u64),
        )
        .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::QuotaExceeded);
    }

    #[test]
    fn extents_read_as_listed_even_when_the_file_shrank() {
        let dir = tempfile::tempdir().unwrap();
        let source = sparse_file(dir.path(), 3 * MIB, &[(0, b"abc"), (2 * MIB, b"xyz")]);
        let extents = data_extents(&source, 3 * MIB).unwrap();
        assert_eq!(extents.len(), 2, "{extents:?}");
        let listed: u64 = extents.iter().map(|e| e.end - e.start).sum();
        source.set_len(MIB).unwrap();
        let mut read = Vec::new();
        Extents::new(&source, &extents)
            .read_to_end(&mut read)
            .unwrap();
        assert_eq!(read.len() as u64, listed);
        assert_eq!(&read[..3], b"abc");
        assert!(read[read.len() - 4096..].iter().all(|b| *b == 0));
    }
}
