//! The mount table (`csi_grpc::mounts::parse_mount_table`), as `/proc/<pid>/mountinfo`
//! gives it. Properties: no panic on any text; and paths escaped as the kernel escapes them
//! (space, tab, newline and backslash as three octal digits) come back as they were.
#![no_main]

use std::os::unix::ffi::OsStrExt;

use csi_grpc::mounts::parse_mount_table;
use libfuzzer_sys::fuzz_target;

/// The kernel's `mangle` of a path in mountinfo (`seq_path_root` with " \t\n\\").
fn escape(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for &byte in path {
        match byte {
            b' ' | b'\t' | b'\n' | b'\\' => out.extend(format!("\\{byte:03o}").bytes()),
            _ => out.push(byte),
        }
    }
    out
}

fuzz_target!(|input: &[u8]| {
    let mounts = parse_mount_table(input);
    assert!(mounts.len() <= input.split(|b| *b == b'\n').count());

    // The input's first two NUL-separated parts as a root and a mount point (a path holds no
    // NUL, and the kernel's paths are never empty).
    let mut parts = input.split(|b| *b == 0).filter(|part| !part.is_empty());
    let (Some(root), Some(mount_point)) = (parts.next(), parts.next()) else {
        return;
    };
    let line = [
        &b"36 35 98:0 "[..],
        &escape(root),
        b" ",
        &escape(mount_point),
        b" rw,noatime master:1 - ext4 /dev/root rw\n",
    ]
    .concat();
    let mounts = parse_mount_table(&line);
    let [mount] = mounts.as_slice() else {
        panic!("one line, {} mounts", mounts.len());
    };
    assert_eq!(mount.device, "98:0");
    assert_eq!(mount.root.as_os_str().as_bytes(), root);
    assert_eq!(mount.mount_point.as_os_str().as_bytes(), mount_point);
});
