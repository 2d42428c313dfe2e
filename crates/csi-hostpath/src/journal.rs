//! The bytes of the state file, `state.log`: a header line with the file's generation, a line
//! with the whole state as of that generation (the base), then one line per committed change,
//! each the rows it changed. A change is committed once its line, newline included, is on
//! disk (appended and fdatasynced), so a change costs the rows it touched whatever the number
//! of volumes. When the changes outgrow the base, the writer compacts: the file is replaced
//! whole (atomically, see `csi_grpc::durable`) by a new header, one generation up, and a
//! base holding everything. A last line without its newline is a write a crash interrupted,
//! never acknowledged: it is ignored, and cut off before the next append. So is a last line
//! holding NUL bytes: after a power loss a file system may keep the page with the newline and
//! lose an earlier one of the same append, which then reads as zeros (JSON never holds a NUL).
//! Any other line that does not parse is corruption: the file is refused, never overwritten.
//!
//! Why a journal, and not the alternatives (issue 24):
//! - The whole state rewritten on every change (this driver before, and upstream's
//!   hostpathplugin) costs O(volumes) per operation: 1.5 s per CreateVolume under 100 callers
//!   at 1000 volumes.
//! - A file per volume would cost a directory fsync on every create and delete (the rename that
//!   makes the file durable), and finding a name or a pool's usage would read every file;
//!   snapshot and group records that change together would need a transaction across files.
//! - An embedded database (redb, sled) is opened by one process at a time, and the instances
//!   sharing a state directory (the controller and each node, as in the chart's DaemonSet) are
//!   separate processes: every call would open the database anew, or one instance would have to
//!   serve the others.
//!
//! A journal keeps one writer at a time across processes (the `flock` the store already held),
//! costs one append and one fdatasync per change whatever the number of volumes, and each
//! process reads only what the others appended since it last looked. The commit itself is
//! serial (about 0.1 ms here); the data work of independent volumes (directories, images,
//! copies) runs outside it, in parallel.

use serde::{Deserialize, Serialize};

use crate::state::{Change, State};

/// Compact once the changes hold more bytes than this, or than the base if that is larger:
/// replacing the file then costs at most as much again as the appends since the last one.
pub const MIN_COMPACTION_BYTES: u64 = 256 * 1024;

/// The longest header line `read_generation` looks at.
pub const HEADER_PREFIX_BYTES: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    generation: u64,
}

/// A state file read from its start.
#[derive(Debug)]
pub struct Parsed {
    pub state: State,
    pub position: Position,
}

/// How much of the state file a reader has applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub generation: u64,
    /// Bytes of the header, the base and the complete change lines applied.
    pub applied: u64,
    /// Bytes of the header and the base.
    pub base: u64,
    /// Whether bytes of an interrupted write follow `applied`.
    pub torn: bool,
}

impl Position {
    /// Whether the changes appended since the base call for a compaction.
    pub fn wants_compaction(&self) -> bool {
        self.applied - self.base > self.base.max(MIN_COMPACTION_BYTES)
    }
}

/// The whole file for `state` at `generation`.
pub fn encode_base(generation: u64, state: &State) -> Result<Vec<u8>, String> {
    let mut bytes = serde_json::to_vec(&Header { generation }).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    serde_json::to_writer(&mut bytes, state).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The line that commits `change`.
pub fn encode_change(change: &Change) -> Result<Vec<u8>, String> {
    let mut bytes = serde_json::to_vec(change).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The generation in the header at the start of a file (`prefix`: its first bytes).
pub fn read_generation(prefix: &[u8]) -> Result<u64, String> {
    let (_, line) = CompleteLines::new(prefix, 0)
        .next()
        .ok_or("no complete header line")?;
    parse_header(line)
}

fn parse_header(line: &[u8]) -> Result<u64, String> {
    let header: Header = serde_json::from_slice(line).map_err(|e| format!("header line: {e}"))?;
    Ok(header.generation)
}

/// Parses a whole file.
pub fn parse(
    bytes: &[u8],
    check_version: impl Fn(&State) -> Result<(), String>,
) -> Result<Parsed, String> {
    let mut lines = CompleteLines::new(bytes, 0);
    let (_, header) = lines.next().ok_or("no header line")?;
    let generation = parse_header(header)?;
    let (base_end, base) = lines.next().ok_or("no base line")?;
    let mut state: State = serde_json::from_slice(base).map_err(|e| format!("base line: {e}"))?;
    check_version(&state)?;
    let base_end = base_end as u64;
    let (applied, torn) = apply_lines(&mut state, lines)?;
    Ok(Parsed {
        state,
        position: Position {
            generation,
            applied: applied.unwrap_or(base_end),
            base: base_end,
            torn,
        },
    })
}

/// Applies the change lines in `tail`, the bytes of the file from `position.applied` on, and
/// moves `position` past them.
pub fn catch_up(state: &mut State, position: &mut Position, tail: &[u8]) -> Result<(), String> {
    let offset = usize::try_from(position.applied).map_err(|e| e.to_string())?;
    let (applied, torn) = apply_lines(state, CompleteLines::new(tail, offset))?;
    if let Some(applied) = applied {
        position.applied = applied;
    }
    position.torn = torn;
    Ok(())
}

/// Applies change lines; returns where the last one ended (if any did) and whether an
/// incomplete line follows.
fn apply_lines(
    state: &mut State,
    mut lines: CompleteLines<'_>,
) -> Result<(Option<u64>, bool), String> {
    let mut applied = None;
    while let Some((end, line)) = lines.next() {
        let change: Change = match serde_json::from_slice(line) {
            Ok(change) => change,
            Err(_) if line.contains(&0) && lines.rest.is_empty() => return Ok((applied, true)),
            Err(e) => return Err(format!("change line ending at byte {end}: {e}")),
        };
        state.apply(change);
        applied = Some(end as u64);
    }
    Ok((applied, lines.torn()))
}

/// The newline-terminated lines of `bytes`, with the offset (from `start`) where each ends.
struct CompleteLines<'a> {
    rest: &'a [u8],
    offset: usize,
}

impl<'a> CompleteLines<'a> {
    fn new(bytes: &'a [u8], start: usize) -> Self {
        Self {
            rest: bytes,
            offset: start,
        }
    }

    fn torn(&self) -> bool {
        !self.rest.is_empty()
    }
}

impl<'a> Iterator for CompleteLines<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let newline = self.rest.iter().position(|b| *b == b'\n')?;
        let line = &self.rest[..newline];
        self.rest = &self.rest[newline + 1..];
        self.offset += newline + 1;
        Some((self.offset, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::volume;

    fn any_version(_: &State) -> Result<(), String> {
        Ok(())
    }

    fn state_with(ids: &[&str]) -> State {
        let mut state = State::default();
        for id in ids {
            state.volumes.insert((*id).into(), volume(id));
        }
        state.commit();
        state
    }

    /// A file at generation 3 with volume a in its base, then b added and a removed.
    fn file() -> (Vec<u8>, State) {
        let mut bytes = encode_base(3, &state_with(&["a"])).unwrap();
        let mut state = state_with(&["a"]);
        state.volumes.insert("b".into(), volume("b"));
        bytes.extend(encode_change(&state.commit()).unwrap());
        state.volumes.remove("a");
        bytes.extend(encode_change(&state.commit()).unwrap());
        (bytes, state)
    }

    #[test]
    fn a_file_reads_back_as_its_base_and_changes() {
        let (bytes, expected) = file();
        let parsed = parse(&bytes, any_version).unwrap();
        assert_eq!(parsed.state, expected);
        assert_eq!(parsed.position.generation, 3);
        assert_eq!(parsed.position.applied, bytes.len() as u64);
        assert!(!parsed.position.torn);
        assert!(parsed.position.base < parsed.position.applied);
        assert_eq!(read_generation(&bytes[..HEADER_PREFIX_BYTES]).unwrap(), 3);
    }

    #[test]
    fn an_interrupted_last_write_is_ignored_anything_else_refused() {
        let (bytes, expected) = file();
        let mut torn = bytes.clone();
        torn.extend(br#"{"volumes":{"c":"#);
        let parsed = parse(&torn, any_version).unwrap();
        assert_eq!(parsed.state, expected);
        assert_eq!(parsed.position.applied, bytes.len() as u64);
        assert!(parsed.position.torn);

        let mut garbage = bytes.clone();
        garbage.extend(b"not json\n");
        let error = parse(&garbage, any_version).unwrap_err();
        assert!(error.contains("change line"), "{error}");

        for broken in [
            &b""[..],
            b"{\"generation\":1}",
            b"{\"generation\":1}\n{\"vers",
        ] {
            assert!(parse(broken, any_version).is_err(), "{broken:?}");
        }
        let refused = parse(&bytes, |_| Err("unsupported version 9".into())).unwrap_err();
        assert!(refused.contains("version 9"), "{refused}");
    }

    #[test]
    fn a_reader_catches_up_on_what_others_appended() {
        let (bytes, expected) = file();
        let base_only = &bytes[..parse(&bytes, any_version).unwrap().position.base as usize];
        let mut reader = parse(base_only, any_version).unwrap();
        assert_eq!(reader.state, state_with(&["a"]));

        let from = reader.position.applied as usize;
        let split = from + 10;
        // Part of a line is there: nothing applied yet, the reader knows a write is under way.
        catch_up(&mut reader.state, &mut reader.position, &bytes[from..split]).unwrap();
        assert_eq!(reader.position.applied as usize, from);
        assert!(reader.position.torn);
        catch_up(&mut reader.state, &mut reader.position, &bytes[from..]).unwrap();
        assert_eq!(reader.state, expected);
        assert_eq!(reader.position.applied, bytes.len() as u64);
        assert!(!reader.position.torn);
    }

    /// A file at generation 1 with five changes, and the state after each line: the base's,
    /// then one per change.
    fn history() -> (Vec<u8>, Vec<(usize, State)>) {
        let mut state = state_with(&["a"]);
        let mut bytes = encode_base(1, &state).unwrap();
        let mut states = vec![(bytes.len(), state.clone())];
        for step in 0..5 {
            let id = format!("v{step}");
            state.volumes.insert(id.clone(), volume(&id));
            if step % 2 == 1 {
                state.volumes.remove("a");
            }
            bytes.extend(encode_change(&state.commit()).unwrap());
            states.push((bytes.len(), state.clone()));
        }
        (bytes, states)
    }

    /// The committed state a file cut at `length` holds: the last one whose line ended there.
    fn committed_at(states: &[(usize, State)], length: usize) -> Option<&State> {
        states
            .iter()
            .rev()
            .find(|(end, _)| *end <= length)
            .map(|(_, state)| state)
    }

    #[test]
    fn a_file_cut_at_any_byte_reads_as_a_prefix_of_its_commits() {
        let (bytes, states) = history();
        for length in 0..=bytes.len() {
            let cut = &bytes[..length];
            match (parse(cut, any_version), committed_at(&states, length)) {
                (Ok(parsed), Some(expected)) => {
                    assert_eq!(&parsed.state, expected, "cut at {length}");
                    assert_eq!(
                        parsed.position.torn,
                        !states.iter().any(|(end, _)| *end == length)
                    );
                }
                (Err(_), None) => {}
                (parsed, expected) => panic!("cut at {length}: {parsed:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_last_line_with_lost_pages_reads_as_the_commits_before_it() {
        let (bytes, states) = history();
        let (last_start, before) = &states[states.len() - 2];
        // Any run of the last line's bytes reads as zeros, its newline kept: a page written
        // after the one before it was lost.
        for start in *last_start..bytes.len() - 1 {
            for zeros in [1, 7, bytes.len() - 1 - start] {
                let mut torn = bytes.clone();
                let end = (start + zeros).min(bytes.len() - 1);
                torn[start..end].fill(0);
                let parsed = parse(&torn, any_version).unwrap();
                assert_eq!(&parsed.state, before, "zeros at {start}..{end}");
                assert_eq!(parsed.position.applied, *last_start as u64);
                assert!(parsed.position.torn);
            }
        }
        // The same damage on an earlier line is corruption.
        let (earlier_start, _) = states[1];
        let mut corrupt = bytes.clone();
        corrupt[earlier_start + 2] = 0;
        let error = parse(&corrupt, any_version).unwrap_err();
        assert!(error.contains("change line"), "{error}");
    }

    #[test]
    fn compaction_once_changes_outgrow_the_base() {
        let position = |base, applied| Position {
            generation: 1,
            applied,
            base,
            torn: false,
        };
        let min = MIN_COMPACTION_BYTES;
        assert!(!position(100, 100 + min).wants_compaction());
        assert!(position(100, 101 + min).wants_compaction());
        assert!(!position(4 * min, 8 * min).wants_compaction());
        assert!(position(4 * min, 8 * min + 1).wants_compaction());
    }
}
