//! The reference driver's state file (`csi_hostpath::journal`): whatever a crash, a power loss
//! or a damaged disk left in `state.log`. Properties: no panic; the position a parse reports
//! lies inside the file, past the base, and at its end unless a torn write follows; the header
//! `read_generation` reads is the one `parse` reads; a reader that parsed the file up to its
//! base and caught up with the rest holds what a reader of the whole file holds; and the
//! state written out again as a base parses back to itself.
#![no_main]

use csi_hostpath::journal::{HEADER_PREFIX_BYTES, catch_up, encode_base, parse, read_generation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|file: &[u8]| {
    let header = read_generation(&file[..file.len().min(HEADER_PREFIX_BYTES)]);
    let Ok(parsed) = parse(file, |_| Ok(())) else {
        return;
    };
    let position = parsed.position;
    let length = file.len() as u64;
    assert!(position.base <= position.applied && position.applied <= length);
    assert_eq!(position.torn, position.applied < length);
    if let Ok(generation) = header {
        assert_eq!(generation, position.generation);
    }

    let base = usize::try_from(position.base).expect("a position in memory");
    let mut early = parse(&file[..base], |_| Ok(())).expect("the file up to its base parses");
    catch_up(&mut early.state, &mut early.position, &file[base..])
        .expect("the rest of a file that parses applies");
    assert_eq!(early.state, parsed.state);
    assert_eq!(early.position, position);

    let rewritten = encode_base(position.generation, &parsed.state).expect("a state encodes");
    let again = parse(&rewritten, |_| Ok(())).expect("a written base parses");
    assert_eq!(again.state, parsed.state);
    assert_eq!(again.position.applied, rewritten.len() as u64);
});
