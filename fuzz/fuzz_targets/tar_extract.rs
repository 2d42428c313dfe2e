//! Restores of directory volumes (`csi_hostpath::tree::extract`): an archive unpacked into a
//! fresh directory. Properties: no panic; nothing appears beside the target directory or
//! beside its parent; and a restored tree, snapshotted (`tree::archive`) and restored again,
//! snapshots the same: the same entries, types, modes, owners, file mtimes, link targets,
//! data and sparse maps.
#![no_main]

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use csi_hostpath::sparse::Budget;
use csi_hostpath::tree::{archive, extract};
use libfuzzer_sys::fuzz_target;

/// What the restore of a volume writes at most, per restore.
const BUDGET: u64 = 1 << 20;

/// Gives every directory under `dir` its owner's permissions back, so it can be removed
/// whatever modes the archive set.
fn make_removable(dir: &Path) {
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            make_removable(&entry.path());
        }
    }
}

/// One archive entry as a restore sees it: path, type, mode, owner, a file's mtime, link
/// target, PAX records and data. Directories' and other entries' mtimes are not restored.
type Summary = (
    Vec<u8>,
    u8,
    u32,
    u64,
    u64,
    Option<u64>,
    Option<Vec<u8>>,
    Vec<Vec<u8>>,
    Vec<u8>,
);

/// The entries of a snapshot, by path (the walk lists a directory in no set order).
fn entries(snapshot: &[u8]) -> Vec<Summary> {
    let mut archive = tar::Archive::new(snapshot);
    let mut summaries: Vec<Summary> = archive
        .entries()
        .expect("a snapshot")
        .map(|entry| {
            let mut entry = entry.expect("a snapshot's entry");
            let header = entry.header().clone();
            let kind = header.entry_type();
            let pax = entry
                .pax_extensions()
                .expect("a snapshot's PAX records")
                .map(|records| {
                    records
                        .map(|r| r.expect("a PAX record").key_bytes().to_vec())
                        .collect()
                })
                .unwrap_or_default();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("a snapshot's data");
            (
                entry.path_bytes().into_owned(),
                kind.as_byte(),
                header.mode().expect("a mode"),
                header.uid().expect("a uid"),
                header.gid().expect("a gid"),
                kind.is_file().then(|| header.mtime().expect("an mtime")),
                entry.link_name_bytes().map(|link| link.into_owned()),
                pax,
                data,
            )
        })
        .collect();
    summaries.sort();
    summaries
}

/// Restores `snapshot` into `scratch`/volumes/volume and checks nothing landed beside it.
fn restore(snapshot: &[u8], scratch: &Path) -> (std::io::Result<()>, std::path::PathBuf) {
    let parent = scratch.join("volumes");
    let target = parent.join("volume");
    let restored = extract(snapshot, &target, &mut Budget::new(BUDGET));
    for (dir, only) in [(scratch, "volumes"), (parent.as_path(), "volume")] {
        let beside: Vec<_> = fs::read_dir(dir)
            .expect("a scratch directory")
            .map(|entry| entry.expect("an entry").file_name())
            .filter(|name| name != only)
            .collect();
        assert!(
            beside.is_empty(),
            "the archive wrote outside the volume: {beside:?}"
        );
    }
    (restored, target)
}

fuzz_target!(|input: &[u8]| {
    let first = tempfile::tempdir().expect("a scratch directory");
    let (restored, volume) = restore(input, first.path());
    if restored.is_ok() {
        let snapshot = archive(&volume, Vec::new()).expect("a restored volume snapshots");
        let second = tempfile::tempdir().expect("a scratch directory");
        let (restored, again) = restore(&snapshot, second.path());
        restored.expect("a snapshot restores");
        let resnapshot = archive(&again, Vec::new()).expect("a restored volume snapshots");
        assert_eq!(entries(&snapshot), entries(&resnapshot));
        make_removable(&again);
    }
    make_removable(&volume);
});
