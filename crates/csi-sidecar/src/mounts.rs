//! The node's mount table as this process sees it — which paths are mount points — and
//! unmounting. The reference driver, the simulated kubelet and podmon's node mode all need it.

use std::fs;
use std::io;
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
    let table = fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    Ok(parse_mount_table(&table))
}

fn parse_mount_table(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ').skip(2);
            let device = fields.next()?.to_string();
            let root = PathBuf::from(unescape_mountinfo(fields.next()?));
            let mount_point = PathBuf::from(unescape_mountinfo(fields.next()?));
            Some(Mount {
                device,
                root,
                mount_point,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        let table = "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw\n\
                     37 36 8:1 /data/vol\\040a /var/lib/kubelet/pods/p/mount rw - ext4 /dev/sda1 rw\n\
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
            ]
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo(r"/tab\011x"), "/tab\tx");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), r"/end\04");
    }

    #[test]
    fn the_root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        assert!(!mount_points_under(Path::new("/")).unwrap().is_empty());
    }
}
