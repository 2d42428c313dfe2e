//! Volume and snapshot data on disk: directories for filesystem volumes, sparse image files
//! for block volumes, tar archives and image copies for snapshots. Writes that must survive a
//! crash go to a temporary name first and are renamed into place.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::state::AccessType;

/// Creates an empty volume (any partial leftover from a crashed attempt is replaced).
pub fn create_empty(path: &Path, access_type: AccessType, size: u64) -> io::Result<()> {
    remove(path)?;
    match access_type {
        AccessType::Mount => fs::create_dir_all(path),
        AccessType::Block => {
            let file = File::create(path)?;
            file.set_len(size)?;
            file.sync_all()
        }
    }
}

/// Creates a volume as a copy of another volume's data.
pub fn clone_volume(
    source: &Path,
    path: &Path,
    access_type: AccessType,
    size: u64,
) -> io::Result<()> {
    remove(path)?;
    match access_type {
        AccessType::Mount => copy_dir(source, path),
        AccessType::Block => copy_image(source, path, size),
    }
}

/// Creates a volume from a snapshot's data.
pub fn restore(snapshot: &Path, path: &Path, access_type: AccessType, size: u64) -> io::Result<()> {
    remove(path)?;
    match access_type {
        AccessType::Mount => {
            fs::create_dir_all(path)?;
            tar::Archive::new(File::open(snapshot)?).unpack(path)
        }
        AccessType::Block => copy_image(snapshot, path, size),
    }
}

/// Takes a snapshot of a volume's data: archived for filesystems, copied for block.
pub fn snapshot(volume: &Path, snapshot: &Path, access_type: AccessType) -> io::Result<()> {
    let temp = temporary(snapshot);
    match access_type {
        AccessType::Mount => {
            let mut builder = tar::Builder::new(File::create(&temp)?);
            builder.follow_symlinks(false);
            builder.append_dir_all(".", volume)?;
            builder.into_inner()?.sync_all()?;
        }
        AccessType::Block => {
            fs::copy(volume, &temp)?;
            File::open(&temp)?.sync_all()?;
        }
    }
    fs::rename(&temp, snapshot)
}

/// Grows a block image (filesystem volumes are directories: nothing to grow).
pub fn expand(path: &Path, access_type: AccessType, size: u64) -> io::Result<()> {
    if access_type == AccessType::Block {
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

/// Bytes and inodes used under `path`.
pub fn usage(path: &Path) -> io::Result<(u64, u64)> {
    let mut bytes = 0;
    let mut inodes = 1;
    walk(path, &mut |meta| {
        if meta.is_file() {
            bytes += meta.len();
        }
        inodes += 1;
    })?;
    Ok((bytes, inodes))
}

/// The latest modification time of anything under `path` (or of the file itself).
pub fn last_write(path: &Path) -> io::Result<SystemTime> {
    let mut latest = fs::metadata(path)?.modified()?;
    walk(path, &mut |meta| {
        if let Ok(modified) = meta.modified() {
            latest = latest.max(modified);
        }
    })?;
    Ok(latest)
}

fn walk(path: &Path, visit: &mut dyn FnMut(&fs::Metadata)) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        visit(&meta);
        if meta.is_dir() {
            walk(&entry.path(), visit)?;
        }
    }
    Ok(())
}

fn copy_dir(source: &Path, target: &Path) -> io::Result<()> {
    fs::create_dir_all(target)?;
    for entry in fs::read_dir(source)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = target.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &to)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
        } else {
            fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

fn copy_image(source: &Path, target: &Path, size: u64) -> io::Result<()> {
    fs::copy(source, target)?;
    let file = fs::OpenOptions::new().write(true).open(target)?;
    if file.metadata()?.len() < size {
        file.set_len(size)?;
    }
    file.sync_all()
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
        create_empty(&volume, AccessType::Mount, 0).unwrap();
        fs::create_dir(volume.join("sub")).unwrap();
        fs::write(volume.join("sub/file"), b"hello").unwrap();
        let snap = dir.path().join("snap.tar");
        snapshot(&volume, &snap, AccessType::Mount).unwrap();
        assert!(!dir.path().join("snap.tar.partial").exists());

        let restored = dir.path().join("restored");
        restore(&snap, &restored, AccessType::Mount, 0).unwrap();
        assert_eq!(fs::read(restored.join("sub/file")).unwrap(), b"hello");

        let cloned = dir.path().join("cloned");
        clone_volume(&volume, &cloned, AccessType::Mount, 0).unwrap();
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

    #[test]
    fn block_images_are_sized_copied_and_grown() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("vol.img");
        create_empty(&image, AccessType::Block, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&image).unwrap().len(), 1 << 20);
        let snap = dir.path().join("snap.img");
        snapshot(&image, &snap, AccessType::Block).unwrap();
        let bigger = dir.path().join("bigger.img");
        restore(&snap, &bigger, AccessType::Block, 2 << 20).unwrap();
        assert_eq!(fs::metadata(&bigger).unwrap().len(), 2 << 20);
        expand(&image, AccessType::Block, 4 << 20).unwrap();
        assert_eq!(fs::metadata(&image).unwrap().len(), 4 << 20);
        expand(&image, AccessType::Block, 1 << 20).unwrap();
        assert_eq!(
            fs::metadata(&image).unwrap().len(),
            4 << 20,
            "never shrinks"
        );
    }
}
