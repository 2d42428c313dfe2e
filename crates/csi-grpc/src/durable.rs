//! Replacing a small file so that a crash or a power cut leaves either the old or the new
//! content, never a torn or lost one: the reference driver's state and node-podmon's inventory.

use std::io;
use std::path::Path;

/// Writes `bytes` to `path` through `<path>.tmp`: the temporary file is fsynced, renamed over
/// `path`, and the directory fsynced (else a power cut can lose the rename). Creates the
/// directory when missing.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_on(&mut SystemDisk, path, bytes)
}

fn replace_on(disk: &mut impl Disk, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = Path::new(&temp);
    disk.create_dir_all(dir)?;
    disk.write_synced(temp, bytes)?;
    disk.rename(temp, path)?;
    disk.sync_dir(dir)
}

/// The filesystem steps of [`replace`], apart so a test can see their order.
trait Disk {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()>;
    /// Creates (or truncates) `path` with `bytes` and fsyncs it.
    fn write_synced(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()>;
}

struct SystemDisk;

impl Disk for SystemDisk {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn write_synced(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::File::create(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a [`Disk`] was asked to do, in order.
    #[derive(Default)]
    struct Recorded(Vec<String>);

    impl Disk for Recorded {
        fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
            self.0.push(format!("mkdir {}", dir.display()));
            Ok(())
        }

        fn write_synced(&mut self, path: &Path, _: &[u8]) -> io::Result<()> {
            self.0.push(format!("write+fsync {}", path.display()));
            Ok(())
        }

        fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
            self.0
                .push(format!("rename {} {}", from.display(), to.display()));
            Ok(())
        }

        fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
            self.0.push(format!("fsync {}", dir.display()));
            Ok(())
        }
    }

    #[test]
    fn the_file_is_fsynced_before_the_rename_and_its_directory_after() {
        let mut disk = Recorded::default();
        replace_on(&mut disk, Path::new("/state/podmon.json"), b"{}").unwrap();
        assert_eq!(
            disk.0,
            [
                "mkdir /state",
                "write+fsync /state/podmon.json.tmp",
                "rename /state/podmon.json.tmp /state/podmon.json",
                "fsync /state",
            ]
        );
    }

    #[test]
    fn the_new_content_replaces_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        replace(&path, b"old").unwrap();
        replace(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!dir.path().join("sub/state.json.tmp").exists());
    }
}
