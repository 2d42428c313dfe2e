//! Staging and target paths are named by whoever calls the node service (the kubelet, or
//! anyone who reaches the socket), and what lies under the allowed roots can be changed by
//! others. Below its allowed root such a path is resolved by the node plugin itself, refusing
//! every symbolic link (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or where a
//! kernel or seccomp profile lacks it, a walk of `O_NOFOLLOW` opens); what is
//! missing is created the same way, one component at a time, and a file is created only when
//! absent, never truncated. A mount goes onto the file that resolution opened, through its
//! `/proc/self/fd` link, so a symlink swapped in after the check is not followed either. The
//! allowed root itself is the operator's, and may be a symlink.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

use crate::error::DriverError;
use crate::options::MountOptions;

/// A staging or target path, with the allowed root it lies under.
#[derive(Debug, Clone)]
pub struct NodePath {
    field: &'static str,
    root: PathBuf,
    path: PathBuf,
}

impl NodePath {
    /// `path` (absolute, normalized, without `..`) under `root`. A root that is a symbolic link
    /// (a kubelet directory moved to another disk) is taken as where it leads: the mount table
    /// names that place, not the link.
    pub fn new(field: &'static str, root: &Path, path: &Path) -> Self {
        let relative = path.strip_prefix(root).unwrap_or(Path::new(""));
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let path = if relative.as_os_str().is_empty() {
            root.clone()
        } else {
            root.join(relative)
        };
        Self { field, root, path }
    }

    /// The path, below the allowed root's real place.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn relative(&self) -> &Path {
        self.path.strip_prefix(&self.root).unwrap_or(Path::new(""))
    }

    /// Refuses the path when it names the allowed root itself, or when a symbolic link is in
    /// it below the root; `Ok` when it is free of them (whether it exists or not).
    pub fn check(&self) -> Result<(), DriverError> {
        if self.relative().as_os_str().is_empty() {
            return Err(self.not_allowed("is an allowed root itself"));
        }
        self.open().map(drop)
    }

    /// The path opened (`O_PATH`), or `None` when it does not exist.
    pub fn open(&self) -> Result<Option<OwnedFd>, DriverError> {
        match self.resolve(self.relative(), OFlags::PATH, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) => Ok(None),
            Err(errno) => Err(self.failed("resolving", errno)),
        }
    }

    /// Creates the missing directories of the path, the path itself included.
    pub fn create_dir_all(&self) -> Result<(), DriverError> {
        self.create_dirs(self.relative())
    }

    /// Creates the path as an empty regular file (and its missing parents) unless it exists;
    /// an existing file is left as it is.
    pub fn create_file(&self) -> Result<(), DriverError> {
        let relative = self.relative();
        if let Some(parent) = relative.parent() {
            self.create_dirs(parent)?;
        }
        self.resolve(
            relative,
            OFlags::CREATE | OFlags::RDONLY,
            Mode::from_raw_mode(0o640),
        )
        .map(drop)
        .map_err(|errno| self.failed("creating", errno))
    }

    /// Bind-mounts `source` onto the path (which must exist), with `options` (see
    /// [`crate::options`]). A mount whose options cannot be applied is taken away again.
    pub fn bind_from(&self, source: &Path, options: &MountOptions) -> Result<(), DriverError> {
        let at = self.existing()?;
        rustix::mount::mount_bind(source, fd_path(&at))
            .map_err(|errno| self.failed("bind-mounting onto", errno))?;
        if !options.ask_anything() {
            return Ok(());
        }
        let applied = self.apply(options);
        if applied.is_err()
            && let Ok(root) = self.existing()
        {
            let _ = rustix::mount::unmount(fd_path(&root), UnmountFlags::DETACH);
        }
        applied
    }

    /// Applies `options` to the mount at the path (again: a crash between
    /// [`Self::bind_from`]'s bind mount and this remount leaves the mount without them).
    pub fn apply(&self, options: &MountOptions) -> Result<(), DriverError> {
        // Opened anew: a file opened before the mount is the one under it, not its root.
        let root = self.existing()?;
        crate::mounts::remount(&fd_path(&root), options).map_err(|error| {
            let errno = Errno::from_io_error(&error).unwrap_or(Errno::IO);
            self.failed("applying the mount flags to", errno)
        })
    }

    fn existing(&self) -> Result<OwnedFd, DriverError> {
        self.open()?
            .ok_or_else(|| self.failed("opening", Errno::NOENT))
    }

    fn create_dirs(&self, relative: &Path) -> Result<(), DriverError> {
        let mut parent = PathBuf::new();
        for component in relative.components() {
            let Component::Normal(name) = component else {
                continue;
            };
            let dir = self
                .resolve(&parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                .map_err(|errno| self.failed("creating", errno))?;
            match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o750)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => return Err(self.failed("creating", errno)),
            }
            parent.push(name);
        }
        // What exists now must be a directory reached without a symlink.
        self.resolve(relative, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .map(drop)
            .map_err(|errno| self.failed("creating", errno))
    }

    /// `relative` opened beneath the root without following a symbolic link anywhere.
    fn resolve(&self, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let root = rustix::fs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        match rustix::fs::openat2(
            &root,
            relative,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            // A kernel before 5.6, or a seccomp profile without openat2.
            Err(Errno::NOSYS | Errno::PERM) => walk(root, relative, flags, mode),
            resolved => resolved,
        }
    }

    fn not_allowed(&self, why: &str) -> DriverError {
        DriverError::PathNotAllowed {
            field: self.field,
            path: self.path.clone(),
            why: why.to_string(),
        }
    }

    /// A symbolic link (`ELOOP`) or an escape from the root (`EXDEV`) is the caller's fault;
    /// anything else is the node's.
    fn failed(&self, action: &str, errno: Errno) -> DriverError {
        match errno {
            Errno::LOOP | Errno::XDEV => self.not_allowed("passes through a symbolic link"),
            Errno::NOTDIR => self.not_allowed("passes through something that is not a directory"),
            errno => DriverError::io(
                format!("{action} {}", self.path.display()),
                std::io::Error::from_raw_os_error(errno.raw_os_error()),
            ),
        }
    }
}

/// What `openat2` with `RESOLVE_NO_SYMLINKS` does, one component at a time: each opened
/// without following a symbolic link (`O_NOFOLLOW`) and refused (`ELOOP`) when it is one.
/// `relative` is normalized (no `..`: see [`crate::rules::allowed_path`]), so it stays beneath
/// `root`.
fn walk(root: OwnedFd, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let names: Vec<&OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return rustix::fs::openat(&root, ".", flags | OFlags::CLOEXEC, mode);
    };
    let mut dir = root;
    for name in parents {
        let next = rustix::fs::openat(
            &dir,
            *name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        match rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&next)?.st_mode) {
            rustix::fs::FileType::Directory => dir = next,
            rustix::fs::FileType::Symlink => return Err(Errno::LOOP),
            _ => return Err(Errno::NOTDIR),
        }
    }
    let opened = rustix::fs::openat(
        &dir,
        *last,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    // O_PATH | O_NOFOLLOW opens a symbolic link itself.
    if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&opened)?.st_mode)
        == rustix::fs::FileType::Symlink
    {
        return Err(Errno::LOOP);
    }
    Ok(opened)
}

/// The `/proc/self/fd` link of `fd`: a path that reaches exactly the file opened.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    Path::new("/proc/self/fd").join(OsStr::new(&fd.as_raw_fd().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk that stands in for openat2 where it is missing refuses what openat2 refuses.
    #[test]
    fn the_walk_refuses_symlinks_at_every_depth() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/file"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("a/file"), root.join("a/file-link")).unwrap();
        let open_root =
            || rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let walked = |relative: &str, flags: OFlags| {
            walk(
                open_root(),
                Path::new(relative),
                flags,
                Mode::from_raw_mode(0o600),
            )
            .map(drop)
        };
        let rows = [
            ("a/b", OFlags::PATH, Ok(())),
            ("a/file", OFlags::PATH, Ok(())),
            ("", OFlags::PATH, Ok(())),
            ("missing/x", OFlags::PATH, Err(Errno::NOENT)),
            ("link", OFlags::PATH, Err(Errno::LOOP)),
            ("link/b", OFlags::PATH, Err(Errno::LOOP)),
            ("a/file-link", OFlags::PATH, Err(Errno::LOOP)),
            (
                "a/file-link",
                OFlags::CREATE | OFlags::RDONLY,
                Err(Errno::LOOP),
            ),
            ("a/file/x", OFlags::PATH, Err(Errno::NOTDIR)),
            ("a/new", OFlags::CREATE | OFlags::RDONLY, Ok(())),
        ];
        for (relative, flags, want) in rows {
            assert_eq!(walked(relative, flags), want, "{relative}");
        }
        assert_eq!(
            std::fs::read(root.join("a/file")).unwrap(),
            b"x",
            "never truncated"
        );
        assert!(root.join("a/new").is_file());
    }
}
