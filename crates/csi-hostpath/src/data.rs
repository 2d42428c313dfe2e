//! Volume and snapshot data on disk: directories for filesystem volumes without fsType, sparse
//! image files for block and ext4 volumes, tar archives and image copies for snapshots. Writes that must survive a
//! crash go to a temporary name first and are renamed into place. A filesystem volume's tree
//! belongs to a tenant who may change it while we read it: it is only read through [`tree`].

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::export;
use crate::sparse::{self, Budget};
use crate::state::Layout;
use crate::tree;

/// Creates an empty volume (any partial leftover from a crashed attempt is replaced).
pub fn create_empty(path: &Path, layout: Layout, size: u64) -> io::Result<()> {
    remove(path)?;
    if layout == Layout::Directory {
        return fs::create_dir_all(path);
    }
    let file = File::create(path)?;
    file.set_len(size)?;
    if layout == Layout::Ext4Image {
        export::format(path)?;
    }
    file.sync_all()
}

/// Creates a volume of `size` bytes as a copy of another volume's data. A directory volume
/// holding more data than `size` is refused (`ErrorKind::QuotaExceeded`): its capacity binds
/// the copy as it binds an image's.
pub fn clone_volume(source: &Path, path: &Path, layout: Layout, size: u64) -> io::Result<()> {
    remove(path)?;
    match layout {
        Layout::Directory => tree::copy(source, path, &mut Budget::new(size)),
        Layout::Image | Layout::Ext4Image => copy_image(source, path, size),
    }
}

/// Creates a volume of `size` bytes from a snapshot's data; a directory snapshot holding more
/// data than `size` is refused (`ErrorKind::QuotaExceeded`).
pub fn restore(snapshot: &Path, path: &Path, layout: Layout, size: u64) -> io::Result<()> {
    remove(path)?;
    match layout {
        Layout::Directory => tree::extract(File::open(snapshot)?, path, &mut Budget::new(size)),
        Layout::Image | Layout::Ext4Image => copy_image(snapshot, path, size),
    }
}

/// Takes a snapshot of a volume's data: a directory is archived, an image copied.
pub fn snapshot(volume: &Path, snapshot: &Path, layout: Layout) -> io::Result<()> {
    let temp = temporary(snapshot);
    match layout {
        Layout::Directory => tree::archive(volume, File::create(&temp)?)?.sync_all()?,
        Layout::Image | Layout::Ext4Image => copy_sparse(volume, &temp)?.sync_all()?,
    }
    fs::rename(&temp, snapshot)
}

/// Grows an image (a directory has nothing to grow; an ext4 filesystem grows on the node).
pub fn expand(path: &Path, layout: Layout, size: u64) -> io::Result<()> {
    if layout.is_image() {
        let file = fs::OpenOptions::new().write(true).open(path)?;
        if file.metadata()?.len() < size {
            file.set_len(size)?;
        }
    }
    Ok(())
}

/// Removes a volume's or snapshot's data; absent data is fine.
pub fn remove(path: &Path) -> io::Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(error) => Err(error),
    };
    match result {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes a snapshot's data and the partial copy an interrupted snapshot left beside it.
pub fn remove_snapshot(path: &Path) -> io::Result<()> {
    remove(&temporary(path))?;
    remove(path)
}

/// Bytes and inodes used under `path`.
pub fn usage(path: &Path) -> io::Result<(u64, u64)> {
    let (mut bytes, mut inodes) = (0, 0);
    tree::each_node(path, |node| {
        if node.kind() == tree::Kind::File {
            bytes += node.size();
        }
        inodes += 1;
    })?;
    Ok((bytes, inodes))
}

/// The latest modification time of anything under `path` (or of the file itself).
pub fn last_write(path: &Path) -> io::Result<SystemTime> {
    let mut latest = SystemTime::UNIX_EPOCH;
    tree::each_node(path, |node| latest = latest.max(node.modified()))?;
    Ok(latest)
}

fn copy_image(source: &Path, target: &Path, size: u64) -> io::Result<()> {
    let file = copy_sparse(source, target)?;
    if file.metadata()?.len() < size {
        file.set_len(size)?;
    }
    file.sync_all()
}

/// Copies an image file, its holes kept (see [`sparse`]): a 10 GiB block volume that holds a
/// few MiB costs a few MiB. Returns the copy, not yet synced.
fn copy_sparse(source: &Path, target: &Path) -> io::Result<File> {
    let from = File::open(source)?;
    let length = from.metadata()?.len();
    let to = File::create(target)?;
    // An image is never larger than its own length: the budget cannot run out.
    sparse::copy(&from, &to, length, &mut Budget::new(length))?;
    Ok(to)
}

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filesystem_volume_snapshot_restore_and_clone() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        create_empty(&volume, Layout::Directory, 0).unwrap();
        fs::create_dir(volume.join("sub")).unwrap();
        fs::write(volume.join("sub/file"), b"hello").unwrap();
        let snap = dir.path().join("snap.tar");
        snapshot(&volume, &snap, Layout::Directory).unwrap();
        assert!(!dir.path().join("snap.tar.partial").exists());

        let restored = dir.path().join("restored");
        restore(&snap, &restored, Layout::Directory, 1 << 20).unwrap();
        assert_eq!(fs::read(restored.join("sub/file")).unwrap(), b"hello");

        let cloned = dir.path().join("cloned");
        clone_volume(&volume, &cloned, Layout::Directory, 1 << 20).unwrap();
        assert_eq!(fs::read(cloned.join("sub/file")).unwrap(), b"hello");
        assert_eq!(
            usage(&cloned).unwrap(),
            (5, 3),
            "5 bytes in root, sub and file"
        );

        remove(&cloned).unwrap();
        remove(&cloned).unwrap();
        assert!(!cloned.exists());
    }

    /// Bytes a tree takes on disk.
    fn on_disk(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::symlink_metadata(path).unwrap();
        let below: u64 = if meta.is_dir() {
            fs::read_dir(path)
                .unwrap()
                .map(|entry| on_disk(&entry.unwrap().path()))
                .sum()
        } else {
            0
        };
        meta.blocks() * 512 + below
    }

    #[test]
    fn directory_copies_keep_holes_and_fit_the_capacity() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        const GIB: u64 = 1 << 30;
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        create_empty(&volume, Layout::Directory, 0).unwrap();
        // 2 GiB long, 8 KiB of data: at the start and at the end.
        let big = File::create(volume.join("sparse")).unwrap();
        big.set_len(2 * GIB).unwrap();
        big.write_all_at(&[7; 4096], 0).unwrap();
        big.write_all_at(&[9; 4096], 2 * GIB - 4096).unwrap();
        drop(big);
        fs::write(volume.join("dense"), vec![1; 100_000]).unwrap();

        let snap = dir.path().join("snap.tar");
        snapshot(&volume, &snap, Layout::Directory).unwrap();
        let restored = dir.path().join("restored");
        restore(&snap, &restored, Layout::Directory, GIB).unwrap();
        let cloned = dir.path().join("cloned");
        clone_volume(&volume, &cloned, Layout::Directory, GIB).unwrap();
        assert!(
            fs::metadata(&snap).unwrap().len() < 1 << 20,
            "archive of {} bytes",
            fs::metadata(&snap).unwrap().len()
        );
        for copy in [&restored, &cloned] {
            let file = File::open(copy.join("sparse")).unwrap();
            assert_eq!(file.metadata().unwrap().len(), 2 * GIB);
            let allocated = file.metadata().unwrap().blocks() * 512;
            assert!(
                allocated < 1 << 20,
                "{}: {allocated} bytes on disk",
                copy.display()
            );
            let mut edge = [0; 8];
            file.read_exact_at(&mut edge, 4092).unwrap();
            assert_eq!(edge, [7, 7, 7, 7, 0, 0, 0, 0], "{}", copy.display());
            file.read_exact_at(&mut edge, 2 * GIB - 4100).unwrap();
            assert_eq!(edge, [0, 0, 0, 0, 9, 9, 9, 9], "{}", copy.display());
            assert_eq!(fs::read(copy.join("dense")).unwrap(), vec![1; 100_000]);
        }

        // 108 KiB of data does not fit a 64 KiB volume: refused, nothing beyond it written.
        for (what, made) in [
            (
                "restore",
                restore(
                    &snap,
                    &dir.path().join("small-r"),
                    Layout::Directory,
                    64 << 10,
                ),
            ),
            (
                "clone",
                clone_volume(
                    &volume,
                    &dir.path().join("small-c"),
                    Layout::Directory,
                    64 << 10,
                ),
            ),
        ] {
            let error = made.unwrap_err();
            assert_eq!(
                error.kind(),
                io::ErrorKind::QuotaExceeded,
                "{what}: {error}"
            );
        }
        for small in ["small-r", "small-c"] {
            let used = on_disk(&dir.path().join(small));
            assert!(used <= 80 << 10, "{small}: {used} bytes on disk");
        }
    }

    #[test]
    fn image_copies_keep_data_and_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        const SIZE: u64 = 1 << 30;
        // Data at the start, in the middle and at the very end; holes between.
        let pieces = [
            (0, &b"head"[..]),
            (300 << 20, b"middle"),
            (SIZE - 4, b"tail"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("vol.img");
        create_empty(&image, Layout::Image, SIZE).unwrap();
        let file = fs::OpenOptions::new().write(true).open(&image).unwrap();
        for (at, bytes) in pieces {
            file.write_all_at(bytes, at).unwrap();
        }
        drop(file);
        let snap = dir.path().join("snap.img");
        snapshot(&image, &snap, Layout::Image).unwrap();
        let restored = dir.path().join("restored.img");
        restore(&snap, &restored, Layout::Image, 2 * SIZE).unwrap();
        for copy in [&snap, &restored] {
            let file = File::open(copy).unwrap();
            for (at, bytes) in pieces {
                // The piece and the (zero) bytes just before it.
                let before = 4.min(at);
                let mut read = vec![0xff; bytes.len() + usize::try_from(before).unwrap()];
                file.read_exact_at(&mut read, at - before).unwrap();
                let mut expected = vec![0; usize::try_from(before).unwrap()];
                expected.extend(bytes);
                assert_eq!(read, expected, "{}: at {at}", copy.display());
            }
            let allocated = fs::metadata(copy).unwrap().blocks() * 512;
            assert!(
                allocated < 16 << 20,
                "{}: {allocated} bytes on disk",
                copy.display()
            );
        }
        assert_eq!(fs::metadata(&snap).unwrap().len(), SIZE);
        assert_eq!(fs::metadata(&restored).unwrap().len(), 2 * SIZE);
        let empty = dir.path().join("empty.img");
        create_empty(&empty, Layout::Image, 1 << 20).unwrap();
        let empty_snap = dir.path().join("empty-snap.img");
        snapshot(&empty, &empty_snap, Layout::Image).unwrap();
        assert_eq!(fs::read(&empty_snap).unwrap(), vec![0; 1 << 20]);
    }

    #[test]
    fn block_images_are_sized_copied_and_grown() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("vol.img");
        create_empty(&image, Layout::Image, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&image).unwrap().len(), 1 << 20);
        let snap = dir.path().join("snap.img");
        snapshot(&image, &snap, Layout::Image).unwrap();
        let bigger = dir.path().join("bigger.img");
        restore(&snap, &bigger, Layout::Image, 2 << 20).unwrap();
        assert_eq!(fs::metadata(&bigger).unwrap().len(), 2 << 20);
        expand(&image, Layout::Image, 4 << 20).unwrap();
        assert_eq!(fs::metadata(&image).unwrap().len(), 4 << 20);
        expand(&image, Layout::Image, 1 << 20).unwrap();
        assert_eq!(
            fs::metadata(&image).unwrap().len(),
            4 << 20,
            "never shrinks"
        );
    }

    /// Runs `work` on a thread of its own and fails (rather than hangs) if it is still blocked
    /// on the FIFO at `fifo` after a generous while; the blocked reader is then released so the
    /// test process can end.
    fn without_hanging_on(fifo: &Path, work: impl FnOnce() -> io::Result<()> + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(work()));
        match finished.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(result) => result.unwrap(),
            Err(_) => {
                use std::os::unix::fs::OpenOptionsExt;
                let _ = fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                    .open(fifo);
                panic!("still blocked reading the FIFO {}", fifo.display());
            }
        }
    }

    #[test]
    fn a_fifo_in_a_volume_is_recreated_never_read() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        create_empty(&volume, Layout::Directory, 0).unwrap();
        fs::write(volume.join("file"), b"hello").unwrap();
        let fifo = volume.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (source, cloned) = (volume.clone(), dir.path().join("cloned"));
        let into = cloned.clone();
        without_hanging_on(&fifo, move || {
            clone_volume(&source, &into, Layout::Directory, 1 << 20)
        });
        let (source, snap) = (volume.clone(), dir.path().join("snap.tar"));
        let into = snap.clone();
        without_hanging_on(&fifo, move || snapshot(&source, &into, Layout::Directory));
        let restored = dir.path().join("restored");
        restore(&snap, &restored, Layout::Directory, 1 << 20).unwrap();
        for copy in [&cloned, &restored] {
            assert!(
                fs::symlink_metadata(copy.join("fifo"))
                    .unwrap()
                    .file_type()
                    .is_fifo(),
                "{}",
                copy.display()
            );
            assert_eq!(fs::read(copy.join("file")).unwrap(), b"hello");
        }
    }

    #[test]
    fn a_symlink_out_of_a_volume_is_copied_as_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("state.json");
        fs::write(&secret, b"host secret").unwrap();
        let volume = dir.path().join("vol");
        create_empty(&volume, Layout::Directory, 0).unwrap();
        std::os::unix::fs::symlink(&secret, volume.join("leak")).unwrap();
        std::os::unix::fs::symlink(dir.path(), volume.join("host")).unwrap();
        let cloned = dir.path().join("cloned");
        clone_volume(&volume, &cloned, Layout::Directory, 1 << 20).unwrap();
        let snap = dir.path().join("snap.tar");
        snapshot(&volume, &snap, Layout::Directory).unwrap();
        let restored = dir.path().join("restored");
        restore(&snap, &restored, Layout::Directory, 1 << 20).unwrap();
        for copy in [&cloned, &restored] {
            for (name, target) in [("leak", secret.as_path()), ("host", dir.path())] {
                let link = copy.join(name);
                assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
                assert_eq!(fs::read_link(&link).unwrap(), target);
            }
        }
    }

    /// Name, type, and body (the target of a symlink) of an archive entry.
    type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8]);

    /// An archive whose entry names are written raw, as a hostile archive's could be.
    fn raw_archive(entries: &[RawEntry<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, body) in entries {
            let mut header = tar::Header::new_gnu();
            header.as_old_mut().name[..name.len()].copy_from_slice(name);
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            if *kind == tar::EntryType::Symlink {
                header.as_old_mut().linkname[..body.len()].copy_from_slice(body);
                header.set_size(0);
                header.set_cksum();
                builder.append(&header, io::empty()).unwrap();
            } else {
                header.set_size(body.len() as u64);
                header.set_cksum();
                builder.append(&header, *body).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn restore_refuses_entries_that_leave_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let outside_text = outside.to_str().unwrap().as_bytes().to_vec();
        let absolute = format!("{}/abs", outside.display());
        // Case, entries, and how the restore refuses them.
        let table: [(&str, Vec<RawEntry<'_>>, io::ErrorKind); 3] = [
            (
                "dot-dot",
                vec![(b"../outside/dotdot", tar::EntryType::Regular, b"x")],
                io::ErrorKind::InvalidData,
            ),
            (
                "absolute",
                vec![(absolute.as_bytes(), tar::EntryType::Regular, b"x")],
                io::ErrorKind::InvalidData,
            ),
            (
                "through an extracted symlink",
                vec![
                    (b"link", tar::EntryType::Symlink, &outside_text),
                    (b"link/through", tar::EntryType::Regular, b"x"),
                ],
                // The symlink is opened as a directory without following it.
                io::ErrorKind::NotADirectory,
            ),
        ];
        for (case, entries, refusal) in table {
            let snap = dir.path().join(format!("{case}.tar"));
            fs::write(&snap, raw_archive(&entries)).unwrap();
            let result = restore(
                &snap,
                &dir.path().join(format!("vol-{case}")),
                Layout::Directory,
                1 << 20,
            );
            let error = result.expect_err(case);
            assert_eq!(error.kind(), refusal, "{case}: {error}");
            assert_eq!(
                fs::read_dir(&outside).unwrap().count(),
                0,
                "{case}: wrote outside the volume"
            );
        }
    }
}
