//! The node's mount table as this process sees it — which paths are mount points — and
//! unmounting. The reference driver, the simulated kubelet and podmon's node mode all need it.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Mount points currently in this process's mount namespace.
pub fn mount_points() -> io::Result<Vec<PathBuf>> {
    Ok(mount_table("self")?
        .into_iter()
        .map(|mount| mount.mount_point)
        .collect())
}

/// One line of a mount table (`/proc/<pid>/mountinfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem: the same in every mount namespace.
    pub device: String,
    /// The directory of the filesystem that is mounted (a bind mount's source, relative to the
    /// filesystem's root): also the same in every mount namespace.
    pub root: PathBuf,
    /// Where it is mounted, in the namespace of the table.
    pub mount_point: PathBuf,
}

/// The mount table of the mount namespace of process `pid` (`"self"`: this process).
pub fn mount_table(pid: &str) -> io::Result<Vec<Mount>> {
    // Bytes, not text: a path may be any bytes but NUL, and one path that is not UTF-8 must
    // neither hide the table nor be read as another path.
    let table = fs::read(format!("/proc/{pid}/mountinfo"))?;
    Ok(parse_mount_table(&table))
}

/// The mounts of a mount table's text (`/proc/<pid>/mountinfo`); lines too short to be one
/// are skipped.
pub fn parse_mount_table(table: &[u8]) -> Vec<Mount> {
    table
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let mut fields = line.split(|b| *b == b' ').skip(2);
            let device = String::from_utf8_lossy(fields.next()?).into_owned();
            let root = unescape_mountinfo(fields.next()?);
            let mount_point = unescape_mountinfo(fields.next()?);
            Some(Mount {
                device,
                root,
                mount_point,
            })
        })
        .collect()
}

/// The kernel escapes space, tab, newline and backslash in mountinfo paths as `\ooo` (three
/// octal digits); anything else after a backslash is no escape it makes, and stays as it is.
fn unescape_mountinfo(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&first, tail)) = rest.split_first() {
        match (first, tail) {
            (b'\\', [a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', ..]) => {
                out.push((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'));
                rest = &tail[3..];
            }
            _ => {
                out.push(first);
                rest = tail;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// True when `path` itself is a mount point (not merely inside one).
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(mount_points()?.iter().any(|p| p == path))
}

/// Mount points at or under `root`, deepest first (the order to unmount them in).
pub fn mount_points_under(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = mount_points()?
        .into_iter()
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    Ok(found)
}

/// Unmounts every mount stacked on `target`, lazily when it is busy.
pub fn unmount_all(target: &Path) -> io::Result<()> {
    while is_mount_point(target)? {
        unmount_top(target)?;
    }
    Ok(())
}

/// Unmounts the topmost mount on `target`, lazily when it is busy.
pub fn unmount_top(target: &Path) -> io::Result<()> {
    use rustix::mount::{UnmountFlags, unmount};
    match unmount(target, UnmountFlags::NOFOLLOW) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => Ok(unmount(
            target,
            UnmountFlags::DETACH | UnmountFlags::NOFOLLOW,
        )?),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_lines() {
        let table = b"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw\n\
                      37 36 8:1 /data/vol\\040a /var/lib/kubelet/pods/p/mount rw - ext4 /dev/sda1 rw\n\
                      38 36 8:1 /data/\xff /mnt/\xfe\\377 rw - ext4 /dev/sda1 rw\n\
                      garbage\n";
        assert_eq!(
            parse_mount_table(table),
            [
                Mount {
                    device: "98:0".into(),
                    root: "/mnt1".into(),
                    mount_point: "/mnt/parent".into()
                },
                Mount {
                    device: "8:1".into(),
                    root: "/data/vol a".into(),
                    mount_point: "/var/lib/kubelet/pods/p/mount".into()
                },
                // Paths that are not UTF-8 are the kernel's bytes, not replacement characters.
                Mount {
                    device: "8:1".into(),
                    root: PathBuf::from(OsString::from_vec(b"/data/\xff".to_vec())),
                    mount_point: PathBuf::from(OsString::from_vec(b"/mnt/\xfe\xff".to_vec())),
                },
            ]
        );
    }

    #[test]
    fn mountinfo_escapes() {
        for (field, path) in [
            (&br"/a\040b"[..], &b"/a b"[..]),
            (br"/tab\011x", b"/tab\tx"),
            (br"/nl\012", b"/nl\n"),
            (br"/back\134slash", br"/back\slash"),
            (b"/plain", b"/plain"),
            (br"/end\04", br"/end\04"),
            (br"\\040", br"\ "),
            // No escape the kernel makes, kept as they are: digits past 7, or a code past one
            // byte, overflowed the octal arithmetic (a panic, or a wrapped byte in release).
            (br"/x\999", br"/x\999"),
            (br"/x\777", br"/x\777"),
            (br"/x\400", br"/x\400"),
            (br"/x\08", br"/x\08"),
            (br"/x\377", b"/x\xff"),
        ] {
            assert_eq!(
                unescape_mountinfo(field).into_os_string().into_vec(),
                path,
                "{}",
                String::from_utf8_lossy(field)
            );
        }
    }

    #[test]
    fn the_root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        assert!(!mount_points_under(Path::new("/")).unwrap().is_empty());
    }
}
