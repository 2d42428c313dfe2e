//! A tenant's directory tree, read and rebuilt as root without trusting its names. Every entry
//! is reached from its parent directory's descriptor with `O_PATH | O_NOFOLLOW`, and its type
//! is taken from that handle, never from the directory listing: a name the tenant swaps for a
//! symlink while we work is met as that symlink and copied as one, and a directory swapped
//! away mid-walk leaves us inside the one we opened. FIFOs, sockets and devices are never
//! opened (a FIFO blocks its reader until a writer comes; a device node may name any of the
//! host's disks): FIFOs are rebuilt as FIFOs, sockets and devices are left out.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, Stat, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use crate::sparse::{self, Budget};

/// What a node is, as far as copying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    /// Sockets and device nodes: never opened, never copied.
    Other,
}

/// Owner, permission bits and modification time, carried over to a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
}

/// One entry of a tree, held by an `O_PATH` descriptor: the file itself is not opened.
#[derive(Debug)]
pub struct Node {
    fd: OwnedFd,
    stat: Stat,
}

impl Node {
    /// Opens `name` in `dir` without following a symlink there.
    pub fn open(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<Self> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        Ok(Self { fd, stat })
    }

    pub fn kind(&self) -> Kind {
        match FileType::from_raw_mode(self.stat.st_mode) {
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            _ => Kind::Other,
        }
    }

    /// What a symlink points to, as text.
    pub fn link_target(&self) -> io::Result<CString> {
        Ok(rustix::fs::readlinkat(&self.fd, c"", Vec::new())?)
    }

    pub fn size(&self) -> u64 {
        u64::try_from(self.stat.st_size).unwrap_or(0)
    }

    pub fn modified(&self) -> SystemTime {
        let nanos = u32::try_from(self.stat.st_mtime_nsec).unwrap_or(0);
        u64::try_from(self.stat.st_mtime)
            .map_or(UNIX_EPOCH, |secs| UNIX_EPOCH + Duration::new(secs, nanos))
    }

    pub fn meta(&self) -> Meta {
        Meta {
            mode: self.stat.st_mode & 0o7777,
            uid: self.stat.st_uid,
            gid: self.stat.st_gid,
            mtime: self.stat.st_mtime,
        }
    }

    /// The contents of a regular file, reopened through `/proc/self/fd`: that reaches this very
    /// inode whatever has become of its name since.
    pub fn read(&self) -> io::Result<File> {
        if self.kind() != Kind::File {
            return Err(io::Error::other("only regular files are read"));
        }
        let file = File::open(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))?;
        let reopened = rustix::fs::fstat(&file)?;
        if (reopened.st_dev, reopened.st_ino) != (self.stat.st_dev, self.stat.st_ino) {
            return Err(io::Error::other("/proc/self/fd reopened another file"));
        }
        Ok(file)
    }

    fn names(&self) -> io::Result<Vec<CString>> {
        let dir = rustix::fs::openat(
            &self.fd,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for entry in Dir::new(dir)? {
            let name = entry?.file_name().to_owned();
            if name.as_bytes() != b"." && name.as_bytes() != b".." {
                names.push(name);
            }
        }
        Ok(names)
    }
}

/// What a walk does with the nodes it meets.
pub trait Visit {
    /// Every node, a directory before its entries; `name` is empty for the root.
    fn enter(&mut self, name: &CStr, node: &Node) -> io::Result<()>;
    /// After the last entry of a directory.
    fn leave(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Walks the tree at `root` (which may be a single file) depth first.
pub fn walk(root: &Path, visit: &mut dyn Visit) -> io::Result<()> {
    let root = Node::open(CWD, root)?;
    visit.enter(c"", &root)?;
    if root.kind() != Kind::Dir {
        return Ok(());
    }
    // A stack of its own, not recursion: a tenant's tree may be deeper than a thread's stack.
    let mut stack = vec![(root.names()?, root)];
    while let Some((names, dir)) = stack.last_mut() {
        let Some(name) = names.pop() else {
            stack.pop();
            visit.leave()?;
            continue;
        };
        let node = match Node::open(&dir.fd, name.as_c_str()) {
            // Removed by the tenant since the listing.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            node => node?,
        };
        visit.enter(&name, &node)?;
        if node.kind() == Kind::Dir {
            stack.push((node.names()?, node));
        }
    }
    Ok(())
}

/// Calls `each` with every node under `root`, the root first.
pub fn each_node(root: &Path, each: impl FnMut(&Node)) -> io::Result<()> {
    struct Each<F>(F);
    impl<F: FnMut(&Node)> Visit for Each<F> {
        fn enter(&mut self, _name: &CStr, node: &Node) -> io::Result<()> {
            (self.0)(node);
            Ok(())
        }
    }
    walk(root, &mut Each(each))
}

/// Copies the tree at `source` to a new directory `target`, its files' holes kept, writing
/// no more data than `budget`.
pub fn copy(source: &Path, target: &Path, budget: &mut Budget) -> io::Result<()> {
    walk(source, &mut Copier::new(target, budget))
}

/// The visitor of [`copy`].
struct Copier<'a> {
    target: &'a Path,
    budget: &'a mut Budget,
    /// The target directory of each source directory entered and not yet left.
    dirs: Vec<OwnedFd>,
}

impl<'a> Copier<'a> {
    fn new(target: &'a Path, budget: &'a mut Budget) -> Self {
        Self {
            target,
            budget,
            dirs: Vec::new(),
        }
    }
}

impl Visit for Copier<'_> {
    fn enter(&mut self, name: &CStr, node: &Node) -> io::Result<()> {
        let meta = node.meta();
        let Some(parent) = self.dirs.last() else {
            std::fs::create_dir_all(self.target)?;
            let root = open_dir(CWD, self.target)?;
            set_owner_and_mode(&root, &meta)?;
            self.dirs.push(root);
            return Ok(());
        };
        let budget = &mut *self.budget;
        let made = match node.kind() {
            Kind::Dir => create(parent, name, Content::Dir, &meta)?,
            Kind::File => {
                let data = FileData::Copy(&node.read()?, node.size());
                create(parent, name, Content::File(data, budget), &meta)?
            }
            Kind::Symlink => create(parent, name, Content::Symlink(&node.link_target()?), &meta)?,
            Kind::Fifo => create(parent, name, Content::Fifo, &meta)?,
            Kind::Other => {
                tracing::debug!(?name, "socket or device node left out of a clone");
                None
            }
        };
        self.dirs.extend(made);
        Ok(())
    }

    fn leave(&mut self) -> io::Result<()> {
        self.dirs.pop();
        Ok(())
    }
}

/// Writes the tree at `source` as a tar archive to `out`, returning `out`.
pub fn archive<W: Write>(source: &Path, out: W) -> io::Result<W> {
    let mut archiver = Archiver::new(out);
    walk(source, &mut archiver)?;
    archiver.builder.into_inner()
}

/// The visitor of [`archive`].
struct Archiver<W: Write> {
    builder: tar::Builder<W>,
    /// Archive path of the directory entered last.
    dir: PathBuf,
}

impl<W: Write> Archiver<W> {
    fn new(out: W) -> Self {
        Self {
            builder: tar::Builder::new(out),
            dir: PathBuf::new(),
        }
    }
}

impl<W: Write> Visit for Archiver<W> {
    fn enter(&mut self, name: &CStr, node: &Node) -> io::Result<()> {
        let path = if name.is_empty() {
            PathBuf::from(".")
        } else {
            self.dir.join(OsStr::from_bytes(name.to_bytes()))
        };
        let meta = node.meta();
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.mode);
        header.set_uid(meta.uid.into());
        header.set_gid(meta.gid.into());
        header.set_mtime(u64::try_from(meta.mtime).unwrap_or(0));
        header.set_size(0);
        match node.kind() {
            Kind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                self.builder.append_data(&mut header, &path, io::empty())?;
                if !name.is_empty() {
                    self.dir = path;
                }
            }
            Kind::File => {
                // Exactly the bytes the header and the map list, whatever the tenant does to
                // the file meanwhile: a longer or shorter body would corrupt the archive.
                let size = node.size();
                let file = node.read()?;
                let extents = sparse::data_extents(&file, size)?;
                let all = 0..size;
                let whole = std::slice::from_ref(&all);
                let stored = if extents == whole {
                    whole
                } else {
                    self.builder.append_pax_extensions(
                        sparse_records(&extents, size)
                            .iter()
                            .map(|(key, value)| (*key, value.as_bytes())),
                    )?;
                    &extents[..]
                };
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(stored.iter().map(|e| e.end - e.start).sum());
                let body = sparse::Extents::new(&file, stored);
                self.builder.append_data(&mut header, &path, body)?;
            }
            Kind::Symlink => {
                header.set_entry_type(tar::EntryType::Symlink);
                let to = node.link_target()?;
                self.builder.append_link(
                    &mut header,
                    &path,
                    Path::new(OsStr::from_bytes(to.as_bytes())),
                )?;
            }
            Kind::Fifo => {
                header.set_entry_type(tar::EntryType::Fifo);
                self.builder.append_data(&mut header, &path, io::empty())?;
            }
            Kind::Other => {
                tracing::debug!(path = %path.display(), "socket or device node left out of a snapshot");
            }
        }
        Ok(())
    }

    fn leave(&mut self) -> io::Result<()> {
        self.dir.pop();
        Ok(())
    }
}

/// The PAX keys of a sparse file (GNU tar's format 0.1): its size, and where the data the
/// entry holds goes, as "offset,length,offset,length…". The entry holds only those bytes.
const SPARSE_SIZE: &str = "GNU.sparse.size";
const SPARSE_MAP: &str = "GNU.sparse.map";

/// The PAX records that describe a file of `size` bytes holding data at `extents`.
fn sparse_records(extents: &[Range<u64>], size: u64) -> [(&'static str, String); 2] {
    let map: Vec<String> = extents
        .iter()
        .map(|e| format!("{},{}", e.start, e.end - e.start))
        .collect();
    [(SPARSE_SIZE, size.to_string()), (SPARSE_MAP, map.join(","))]
}

/// The size and data extents an entry's PAX records describe, if it is a sparse file. The map
/// must list ordered, disjoint extents inside the size whose lengths add up to the `stored`
/// bytes of the entry.
fn sparse_map(entry: &mut tar::Entry<'_, impl Read>) -> io::Result<Option<(u64, Vec<Range<u64>>)>> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    let stored = entry.header().size()?;
    let Some(records) = entry.pax_extensions()? else {
        return Ok(None);
    };
    let (mut size, mut map) = (None, None);
    for record in records {
        let record = record?;
        match record.key() {
            Ok(SPARSE_SIZE) => size = Some(record.value_bytes().to_vec()),
            Ok(SPARSE_MAP) => map = Some(record.value_bytes().to_vec()),
            _ => {}
        }
    }
    let (Some(size), Some(map)) = (size, map) else {
        return Ok(None);
    };
    let number = |text: &[u8]| {
        std::str::from_utf8(text)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| {
                invalid(format!(
                    "sparse map number {:?}",
                    String::from_utf8_lossy(text)
                ))
            })
    };
    let size = number(&size)?;
    let numbers = map
        .split(|b| *b == b',')
        .filter(|text| !text.is_empty())
        .map(number)
        .collect::<io::Result<Vec<u64>>>()?;
    if numbers.len() % 2 != 0 {
        return Err(invalid("sparse map with an offset and no length".into()));
    }
    let mut extents = Vec::with_capacity(numbers.len() / 2);
    let (mut end, mut total) = (0u64, 0u64);
    for pair in numbers.chunks_exact(2) {
        let (offset, length) = (pair[0], pair[1]);
        let extent_end = offset.checked_add(length).filter(|e| *e <= size);
        match extent_end {
            Some(extent_end) if offset >= end => {
                extents.push(offset..extent_end);
                end = extent_end;
                total += length;
            }
            _ => {
                return Err(invalid(format!(
                    "sparse map extent {offset},{length} out of order or past {size}"
                )));
            }
        }
    }
    if total != stored {
        return Err(invalid(format!(
            "sparse map lists {total} bytes, the entry holds {stored}"
        )));
    }
    Ok(Some((size, extents)))
}

/// Unpacks a tar archive into the directory `target` (created if needed), its files' zero
/// blocks left as holes, writing no more data than `budget`. Entries must stay inside it: an
/// absolute path or `..` is refused, and every directory on the way to an entry is opened
/// without following symlinks, so a symlink an earlier entry made is never written through.
pub fn extract(archive: impl Read, target: &Path, budget: &mut Budget) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    let root = open_dir(CWD, target)?;
    for entry in tar::Archive::new(archive).entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let names = names_inside(&path)?;
        let header = entry.header();
        let kind = header.entry_type();
        let meta = Meta {
            mode: header.mode()? & 0o7777,
            uid: u32::try_from(header.uid()?).map_err(io::Error::other)?,
            gid: u32::try_from(header.gid()?).map_err(io::Error::other)?,
            mtime: i64::try_from(header.mtime()?).map_err(io::Error::other)?,
        };
        let link = entry
            .link_name_bytes()
            .map(|target| CString::new(target.into_owned()))
            .transpose()?;
        let Some((leaf, parents)) = names.split_last() else {
            if kind.is_dir() {
                set_owner_and_mode(&root, &meta)?;
            }
            continue;
        };
        let parent = parents
            .iter()
            .try_fold(open_dir(&root, c".")?, |dir, name| open_dir(&dir, name))?;
        let content = match kind {
            tar::EntryType::Directory => Content::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                match sparse_map(&mut entry)? {
                    Some((size, extents)) => {
                        Content::File(FileData::Extents(&mut entry, extents, size), budget)
                    }
                    None => Content::File(FileData::Stream(&mut entry), budget),
                }
            }
            tar::EntryType::Symlink => match &link {
                Some(to) => Content::Symlink(to),
                None => {
                    return Err(io::Error::other(format!(
                        "symlink {} has no target",
                        path.display()
                    )));
                }
            },
            tar::EntryType::Fifo => Content::Fifo,
            other => {
                tracing::debug!(path = %path.display(), ?other, "archive entry of this type left out");
                continue;
            }
        };
        create(&parent, leaf, content, &meta)?;
    }
    Ok(())
}

/// The names leading from the archive's root to `path`; an error if `path` leaves it.
fn names_inside(path: &Path) -> io::Result<Vec<CString>> {
    path.components()
        .filter(|c| *c != Component::CurDir)
        .map(|component| match component {
            Component::Normal(name) => Ok(CString::new(name.as_bytes())?),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("archive entry {} leaves the volume", path.display()),
            )),
        })
        .collect()
}

/// What [`create`] makes.
enum Content<'a> {
    Dir,
    File(FileData<'a>, &'a mut Budget),
    Symlink(&'a CStr),
    Fifo,
}

/// Where a regular file's bytes come from.
enum FileData<'a> {
    /// The first bytes of a file (this many), holes kept.
    Copy(&'a File, u64),
    /// A stream, zero blocks left as holes.
    Stream(&'a mut dyn Read),
    /// A stream of the data extents of a sparse file of this size.
    Extents(&'a mut dyn Read, Vec<Range<u64>>, u64),
}

impl FileData<'_> {
    fn write_into(self, file: &File, budget: &mut Budget) -> io::Result<()> {
        match self {
            Self::Copy(from, length) => sparse::copy(from, file, length, budget),
            Self::Stream(from) => sparse::write_stream(from, file, budget).map(drop),
            Self::Extents(from, extents, size) => {
                sparse::write_extents(from, file, &extents, size, budget)
            }
        }
    }
}

/// Creates `name` in `parent` with `meta`, returning a created directory's descriptor. An
/// existing directory of that name is kept; anything else there is replaced (a later archive
/// entry wins), never written through.
fn create(
    parent: &OwnedFd,
    name: &CStr,
    content: Content<'_>,
    meta: &Meta,
) -> io::Result<Option<OwnedFd>> {
    let mode = Mode::from_raw_mode(meta.mode);
    let (uid, gid) = (Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)));
    match content {
        Content::Dir => {
            match rustix::fs::mkdirat(parent, name, Mode::RWXU) {
                Err(Errno::EXIST) => {}
                made => made?,
            }
            let dir = open_dir(parent, name)?;
            set_owner_and_mode(&dir, meta)?;
            return Ok(Some(dir));
        }
        Content::File(data, budget) => {
            let file = File::from(replacing(parent, name, || {
                rustix::fs::openat(
                    parent,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::RUSR | Mode::WUSR,
                )
            })?);
            data.write_into(&file, budget)?;
            // A file of a copy never carries set-user-ID or set-group-ID: a tenant's clone or
            // restore must not hand out a program that runs as its owner.
            let plain = Meta {
                mode: meta.mode & !(SET_USER_ID | SET_GROUP_ID),
                ..*meta
            };
            set_owner_and_mode(&file, &plain)?;
            let mtime = Timespec {
                tv_sec: meta.mtime,
                tv_nsec: 0,
            };
            rustix::fs::futimens(
                &file,
                &Timestamps {
                    last_access: mtime,
                    last_modification: mtime,
                },
            )?;
        }
        Content::Symlink(to) => {
            replacing(parent, name, || rustix::fs::symlinkat(to, parent, name))?;
            rustix::fs::chownat(parent, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Content::Fifo => {
            replacing(parent, name, || {
                rustix::fs::mknodat(parent, name, FileType::Fifo, mode, 0)
            })?;
            rustix::fs::chownat(parent, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
            // The mode mknod gave went through the umask.
            rustix::fs::chmodat(parent, name, mode, AtFlags::empty())?;
        }
    }
    Ok(None)
}

/// Runs `make`, and once more after unlinking `name` if something of that name was there.
fn replacing<T>(
    parent: &OwnedFd,
    name: &CStr,
    make: impl Fn() -> rustix::io::Result<T>,
) -> io::Result<T> {
    match make() {
        Err(Errno::EXIST) => {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
            Ok(make()?)
        }
        made => Ok(made?),
    }
}

fn open_dir(parent: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

const SET_USER_ID: u32 = 0o4000;
const SET_GROUP_ID: u32 = 0o2000;

/// Owner first: a change of owner clears set-user-ID bits the mode may carry.
fn set_owner_and_mode(fd: impl AsFd, meta: &Meta) -> io::Result<()> {
    let fd = fd.as_fd();
    rustix::fs::fchown(
        fd,
        Some(Uid::from_raw(meta.uid)),
        Some(Gid::from_raw(meta.gid)),
    )?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::rc::Rc;

    /// A visitor that lets the test change the tree as the walk reaches each node.
    struct Meddling<V, F> {
        inner: V,
        meddle: F,
    }

    impl<V: Visit, F: FnMut(&CStr)> Visit for Meddling<V, F> {
        fn enter(&mut self, name: &CStr, node: &Node) -> io::Result<()> {
            (self.meddle)(name);
            self.inner.enter(name, node)
        }

        fn leave(&mut self) -> io::Result<()> {
            self.inner.leave()
        }
    }

    /// A source volume of files `a` and `b` and a directory `d` holding `f`, and, outside it, a
    /// host file and a host directory the tenant would like to read.
    fn tenant_tree(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (source, secret, host) = (dir.join("vol"), dir.join("secret"), dir.join("host"));
        fs::create_dir_all(source.join("d")).unwrap();
        for file in ["a", "b", "d/f"] {
            fs::write(source.join(file), b"mine").unwrap();
        }
        fs::write(&secret, b"host secret").unwrap();
        fs::create_dir(&host).unwrap();
        fs::write(host.join("token"), b"host secret").unwrap();
        (source, secret, host)
    }

    /// Swaps names for symlinks out of the volume as the walk goes: the first of `a`/`b` it
    /// enters (already opened) and the other one (listed, not yet opened) become symlinks to
    /// the host file, and `d` (opened, not yet listed) becomes a symlink to the host directory.
    /// Returns which of `a`/`b` was entered first.
    fn swapping(
        source: &Path,
        secret: &Path,
        host: &Path,
        first: &Rc<Cell<Option<&'static str>>>,
    ) -> impl FnMut(&CStr) {
        let (source, secret, host) = (source.to_owned(), secret.to_owned(), host.to_owned());
        let first = first.clone();
        move |name: &CStr| {
            let swap = |name: &str, to: &Path| {
                let path = source.join(name);
                fs::rename(&path, source.join(format!(".{name}.away"))).unwrap();
                symlink(to, &path).unwrap();
            };
            match name.to_bytes() {
                b"d" => swap("d", &host),
                b"a" | b"b" if first.get().is_none() => {
                    let (this, other) = if name.to_bytes() == b"a" {
                        ("a", "b")
                    } else {
                        ("b", "a")
                    };
                    swap(this, &secret);
                    swap(other, &secret);
                    first.set(Some(this));
                }
                _ => {}
            }
        }
    }

    /// The copy holds what each node was when the walk opened it, and symlinks as symlinks:
    /// nothing of the host.
    fn assert_nothing_followed(copy: &Path, first: &str, secret: &Path) {
        let other = if first == "a" { "b" } else { "a" };
        assert_eq!(
            fs::read(copy.join(first)).unwrap(),
            b"mine",
            "opened before its swap"
        );
        assert!(fs::symlink_metadata(copy.join(other)).unwrap().is_symlink());
        assert_eq!(fs::read_link(copy.join(other)).unwrap(), secret);
        assert!(fs::symlink_metadata(copy.join("d")).unwrap().is_dir());
        assert_eq!(fs::read(copy.join("d/f")).unwrap(), b"mine");
        assert!(
            !copy.join("d/token").exists(),
            "the host directory was followed"
        );
    }

    #[test]
    fn names_swapped_for_symlinks_mid_copy_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (source, secret, host) = tenant_tree(dir.path());
        let first = Rc::new(Cell::new(None));
        let target = dir.path().join("clone");
        walk(
            &source,
            &mut Meddling {
                inner: Copier::new(&target, &mut Budget::new(u64::MAX)),
                meddle: swapping(&source, &secret, &host, &first),
            },
        )
        .unwrap();
        let first = first.get().expect("a or b was copied");
        assert_nothing_followed(&target, first, &secret);
    }

    #[test]
    fn names_swapped_for_symlinks_mid_snapshot_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (source, secret, host) = tenant_tree(dir.path());
        let first = Rc::new(Cell::new(None));
        let mut archiver = Meddling {
            inner: Archiver::new(Vec::new()),
            meddle: swapping(&source, &secret, &host, &first),
        };
        walk(&source, &mut archiver).unwrap();
        let archive = archiver.inner.builder.into_inner().unwrap();
        let target = dir.path().join("restored");
        extract(archive.as_slice(), &target, &mut Budget::new(u64::MAX)).unwrap();
        let first = first.get().expect("a or b was archived");
        assert_nothing_followed(&target, first, &secret);
    }

    #[test]
    fn a_node_is_what_its_handle_says_not_what_its_name_became() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"mine").unwrap();
        fs::write(dir.path().join("secret"), b"host secret").unwrap();
        let parent = open_dir(CWD, dir.path()).unwrap();
        let file = Node::open(&parent, "file").unwrap();
        fs::remove_file(dir.path().join("file")).unwrap();
        symlink(dir.path().join("secret"), dir.path().join("file")).unwrap();
        let mut text = String::new();
        file.read().unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "mine", "read from the inode that was opened");

        let link = Node::open(&parent, "file").unwrap();
        let target = CString::new(dir.path().join("secret").as_os_str().as_bytes()).unwrap();
        assert_eq!(link.kind(), Kind::Symlink);
        assert_eq!(link.link_target().unwrap(), target);
        assert!(link.read().is_err(), "a symlink is never read through");
    }

    #[test]
    fn modes_and_owners_are_carried_over() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("vol");
        fs::create_dir_all(source.join("d")).unwrap();
        fs::write(source.join("d/f"), b"x").unwrap();
        fs::set_permissions(source.join("d/f"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::set_permissions(source.join("d"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::write(source.join("d/tool"), b"#!/bin/sh").unwrap();
        fs::set_permissions(source.join("d/tool"), fs::Permissions::from_mode(0o6755)).unwrap();
        let cloned = dir.path().join("clone");
        copy(&source, &cloned, &mut Budget::new(u64::MAX)).unwrap();
        let restored = dir.path().join("restored");
        let archived = archive(&source, Vec::new()).unwrap();
        extract(archived.as_slice(), &restored, &mut Budget::new(u64::MAX)).unwrap();
        for copy in [&cloned, &restored] {
            // Set-user-ID and set-group-ID are dropped from files.
            for (path, mode) in [("d", 0o750), ("d/f", 0o640), ("d/tool", 0o755)] {
                let meta = fs::metadata(copy.join(path)).unwrap();
                let want = fs::metadata(source.join(path)).unwrap();
                assert_eq!(meta.mode() & 0o7777, mode, "{}", copy.join(path).display());
                assert_eq!((meta.uid(), meta.gid()), (want.uid(), want.gid()));
            }
        }
    }

    /// An archive of one regular entry `f` holding `body`, after PAX records `records`.
    fn with_records(records: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_pax_extensions(records.iter().map(|(k, v)| (*k, v.as_bytes())))
            .unwrap();
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(body.len() as u64);
        builder.append_data(&mut header, "f", body).unwrap();
        builder.into_inner().unwrap()
    }

    #[test]
    fn sparse_maps_are_checked_before_anything_is_written() {
        /// The file made (length, bytes at 4096), or the refusal's words.
        type Outcome = Result<(u64, &'static [u8]), &'static str>;
        // Map, body, outcome.
        let table: [(&str, &[u8], Outcome); 9] = [
            ("0,2,4096,3", b"abcde", Ok((10_000, b"cde"))),
            ("", b"", Ok((10_000, b""))),
            ("0,2,4096", b"ab", Err("offset and no length")),
            ("4096,3,0,2", b"cdeab", Err("out of order")),
            ("0,2,1,2", b"abcd", Err("out of order")),
            ("9999,2", b"ab", Err("past 10000")),
            ("18446744073709551615,2", b"ab", Err("out of order or past")),
            ("0,2", b"abc", Err("lists 2 bytes, the entry holds 3")),
            ("0,-2", b"", Err("sparse map number")),
        ];
        for (map, body, expected) in table {
            let dir = tempfile::tempdir().unwrap();
            let archived = with_records(&[(SPARSE_SIZE, "10000"), (SPARSE_MAP, map)], body);
            let target = dir.path().join("t");
            let extracted = extract(archived.as_slice(), &target, &mut Budget::new(u64::MAX));
            match expected {
                Ok((length, at_4096)) => {
                    extracted.unwrap_or_else(|e| panic!("{map}: {e}"));
                    let bytes = fs::read(target.join("f")).unwrap();
                    assert_eq!(bytes.len() as u64, length, "{map}");
                    assert_eq!(&bytes[4096..4096 + at_4096.len()], at_4096, "{map}");
                }
                Err(words) => {
                    let error = extracted.expect_err(map);
                    assert!(error.to_string().contains(words), "{map}: {error}");
                    assert!(!target.join("f").exists(), "{map}: a file was made");
                }
            }
        }
    }

    #[test]
    fn a_file_of_many_extents_is_archived_sparse_and_restored_whole() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("vol");
        fs::create_dir(&source).unwrap();
        let file = File::create(source.join("f")).unwrap();
        file.set_len(64 << 20).unwrap();
        for piece in 0..30u8 {
            file.write_all_at(&[piece + 1; 100], u64::from(piece) * (2 << 20) + 5)
                .unwrap();
        }
        drop(file);
        let archived = archive(&source, Vec::new()).unwrap();
        assert!(
            archived.len() < 1 << 20,
            "archive of {} bytes",
            archived.len()
        );
        let restored = dir.path().join("restored");
        extract(archived.as_slice(), &restored, &mut Budget::new(u64::MAX)).unwrap();
        assert_eq!(
            fs::read(restored.join("f")).unwrap(),
            fs::read(source.join("f")).unwrap()
        );
        assert!(fs::metadata(restored.join("f")).unwrap().blocks() * 512 < 1 << 20);
    }
}
