//! Exports of ext4 volumes: the data-layer fence. Each node reaches an ext4 volume only
//! through its own loop device on the volume's image, mounted by the driver at the node's
//! export path; NodeStageVolume bind-mounts that export. Cutting an export ends the node's
//! access at the storage, whatever mount namespaces, bind mounts or open files the node's
//! containers still hold, and without the node's cooperation:
//!
//! 1. `syncfs` makes everything written before the cut durable;
//! 2. `EXT4_IOC_SHUTDOWN` makes every later read or write of that filesystem instance fail
//!    with EIO at the system call, in every mount namespace (it is one superblock);
//! 3. the loop device is shrunk to zero sectors, so no I/O of that instance (delayed
//!    writeback, the superblock written when its last mount finally goes) reaches the image;
//! 4. the export is unmounted lazily and the loop device set to detach on its last close.
//!
//! A later export to another node is a fresh loop device and mount: ext4 replays its journal
//! as after a crash, and the cut instance can never write over it. The export of a node that
//! has let go of the volume (unstaged it) is closed instead: a clean unmount.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::mount::{MountFlags, UnmountFlags};

use crate::driver::Driver;
use crate::error::DriverError;
use crate::mounts;
use crate::state::{Export, Volume};

/// The directory of an export that nodes stage: not the filesystem's root, so a staging
/// mount's root differs from the export's and the kubelet does not count the export among the
/// staging path's references (it refuses to unstage while a mount shares device and root).
/// It also keeps `lost+found` out of the volume.
pub fn volume_root(at: &Path) -> PathBuf {
    at.join("volume")
}

/// A loop device just bound to an image, set to detach itself on its last close and held
/// open until a mount holds it too: should this process die before, nothing stays bound.
#[derive(Debug)]
pub struct Attached {
    /// Its one opener until the mount: closing it detaches an unmounted device.
    _open: File,
    pub device: String,
}

/// Binds a fresh loop device to `image` (see [`Attached`]).
pub fn attach(image: &Path) -> io::Result<Attached> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let mut info = LoopInfo64::zeroed();
    info.flags = LO_FLAGS_AUTOCLEAR;
    // Another process may take the free device first.
    for _ in 0..16 {
        let device = format!("/dev/loop{}", free_loop_number(&control)?);
        let file = OpenOptions::new().read(true).write(true).open(&device)?;
        match configure_loop(&file, &backing, info) {
            Ok(()) => {
                return Ok(Attached {
                    _open: file,
                    device,
                });
            }
            Err(error) if error.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {}
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other(format!(
        "no free loop device for {}",
        image.display()
    )))
}

/// Mounts the ext4 filesystem of `attached` (on `image`) at `at`, with its [`volume_root`].
pub fn mount(attached: &Attached, image: &Path, at: &Path) -> io::Result<()> {
    let device = &attached.device;
    fs::create_dir_all(at)?;
    if let Err(error) = rustix::mount::mount(
        device.as_str(),
        at,
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV,
        None,
    ) {
        return Err(io::Error::other(format!(
            "mounting the ext4 filesystem of {} ({device}) at {}: {error}",
            image.display(),
            at.display()
        )));
    }
    if let Err(error) = fs::create_dir_all(volume_root(at)) {
        let _ = cut(at, device, image);
        return Err(error);
    }
    Ok(())
}

/// Cuts the export of `image` mounted at `at` through `device` (see the module comment).
/// Safe to repeat: a device no longer bound to `image` (cut before, or reused for another
/// image after a restart) is left alone, and so is an export no longer mounted.
pub fn cut(at: &Path, device: &str, image: &Path) -> io::Result<()> {
    if mounts::is_mount_point(at)? {
        let root = File::open(at)?;
        sync(&root, at);
        shut_down(&root)?;
    }
    let bound = bound_to(device, image)?;
    if let Some(loop_device) = &bound {
        revoke_loop(loop_device)?;
    }
    if mounts::is_mount_point(at)? {
        rustix::mount::unmount(at, UnmountFlags::DETACH)?;
    }
    if bound.is_some() {
        // Busy while the node still has mounts: then it detaches on its last close.
        mounts::loop_detach(device)?;
    }
    remove_dir(at)
}

/// Closes the export of a node that has let go of the volume (unstaged it): a clean unmount,
/// so the image needs no journal replay. Anything that still holds the filesystem (the
/// node's record was wrong) gets the cut instead.
pub fn close(at: &Path, device: &str, image: &Path) -> io::Result<()> {
    if mounts::is_mount_point(at)? {
        sync(&File::open(at)?, at);
        match rustix::mount::unmount(at, UnmountFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::BUSY) => return cut(at, device, image),
            Err(error) => return Err(error.into()),
        }
    }
    if let Some(loop_device) = bound_to(device, image)? {
        if still_mounted(device)? {
            tracing::warn!(%device, image = %image.display(), "an export closed as unused is still mounted elsewhere: revoking it");
            revoke_loop(&loop_device)?;
        }
        mounts::loop_detach(device)?;
    }
    remove_dir(at)
}

/// Whether a filesystem on `device` is mounted anywhere (it holds the device exclusively).
fn still_mounted(device: &str) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::EXCL.bits() as i32)
        .open(device)
    {
        Ok(_) => Ok(false),
        Err(error) if error.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
            Ok(true)
        }
        Err(error) => Err(error),
    }
}

fn remove_dir(at: &Path) -> io::Result<()> {
    match fs::remove_dir(at) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Flushes an export's filesystem (before its image is copied), when it is mounted.
pub fn flush(at: &Path) -> io::Result<()> {
    if mounts::is_mount_point(at)? {
        sync(&File::open(at)?, at);
    }
    Ok(())
}

fn sync(root: &File, at: &Path) {
    if let Err(error) = rustix::fs::syncfs(root) {
        tracing::warn!(export = %at.display(), %error, "syncfs of an export failed");
    }
}

/// Grows the ext4 filesystem mounted at `mount` to the size of its device, online.
pub fn resize_filesystem(mount: &Path, device_bytes: u64) -> io::Result<()> {
    let root = File::open(mount)?;
    let block_size = rustix::fs::fstatvfs(&root)?.f_frsize;
    if block_size == 0 {
        return Err(io::Error::other("the filesystem reports a block size of 0"));
    }
    resize(&root, device_bytes / block_size)
}

/// Whether this process may grow a mounted ext4 filesystem (EXT4_IOC_RESIZE_FS needs
/// CAP_SYS_RESOURCE, which containers often lack even as root).
pub fn can_resize_online() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The size in bytes of a block device (a loop device's current capacity).
pub fn device_bytes(device: &str) -> io::Result<u64> {
    let name = Path::new(device)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other(format!("{device} is not a device path")))?;
    let sectors = fs::read_to_string(format!("/sys/block/{name}/size"))?;
    sectors
        .trim()
        .parse::<u64>()
        .map(|s| s * 512)
        .map_err(|e| io::Error::other(format!("size of {device}: {e}")))
}

/// Formats an image as ext4 (the whole image, no blocks reserved for root: a volume's
/// capacity is the tenant's).
pub fn format(image: &Path) -> io::Result<()> {
    let output = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-m", "0", "-E"])
        .arg("lazy_itable_init=1,lazy_journal_init=1")
        .arg(image)
        .output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "mke2fs {}: {}",
            image.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Whether the loop device `device` is bound to `image` (same inode and filesystem): loop
/// numbers are reused, so a device known by its name alone may be another image's by now.
pub fn loop_bound_to(device: &str, image: &Path) -> io::Result<bool> {
    Ok(bound_to(device, image)?.is_some())
}

/// The loop device opened, when it is still bound to `image` (same inode and filesystem).
fn bound_to(device: &str, image: &Path) -> io::Result<Option<File>> {
    let not_there = |error: &io::Error| {
        error.kind() == io::ErrorKind::NotFound
            || error.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error())
    };
    let file = match OpenOptions::new().read(true).open(device) {
        Err(error) if not_there(&error) => return Ok(None),
        other => other?,
    };
    let status = match loop_status(&file) {
        Err(error) if not_there(&error) => return Ok(None),
        other => other?,
    };
    let image = match fs::metadata(image) {
        Err(error) if not_there(&error) => return Ok(None),
        other => other?,
    };
    Ok((status.inode == image.ino() && status.device == image.dev()).then_some(file))
}

/// The kernel's `struct loop_info64` (linux/loop.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    size_limit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

impl LoopInfo64 {
    fn zeroed() -> Self {
        Self {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            size_limit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags: 0,
            file_name: [0; 64],
            crypt_name: [0; 64],
            encrypt_key: [0; 32],
            init: [0; 2],
        }
    }
}

/// The kernel's `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_SET_FD: rustix::ioctl::Opcode = 0x4C00;
const LOOP_SET_STATUS64: rustix::ioctl::Opcode = 0x4C04;
const LOOP_GET_STATUS64: rustix::ioctl::Opcode = 0x4C05;
const LOOP_CONFIGURE: rustix::ioctl::Opcode = 0x4C0A;
const LOOP_CTL_GET_FREE: rustix::ioctl::Opcode = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const EXT4_IOC_SHUTDOWN: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<u32>(b'X', 125);
const EXT4_IOC_RESIZE_FS: rustix::ioctl::Opcode = rustix::ioctl::opcode::write::<u64>(b'f', 16);
/// Shut down without flushing the journal: [`cut`] has synced what came before.
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// Moves the loop device's window past the end of its image: its capacity becomes zero
/// sectors and every I/O through it fails, whoever holds it open.
fn revoke_loop(device: &File) -> io::Result<()> {
    let mut info = loop_status(device)?;
    info.offset = 1 << 62;
    info.size_limit = 0;
    set_loop_status(device, info)
}

/// LOOP_CTL_GET_FREE: no argument; the kernel answers with the device's number.
struct GetFree;

#[allow(unsafe_code)]
// SAFETY: the opcode takes no argument and writes nothing to memory: the number is the
// return value.
unsafe impl rustix::ioctl::Ioctl for GetFree {
    type Output = u32;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> rustix::ioctl::Opcode {
        LOOP_CTL_GET_FREE
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        std::ptr::null_mut()
    }

    unsafe fn output_from_ptr(
        out: rustix::ioctl::IoctlOutput,
        _: *mut std::ffi::c_void,
    ) -> rustix::io::Result<u32> {
        u32::try_from(out).map_err(|_| rustix::io::Errno::RANGE)
    }
}

/// The number of a free loop device (created if none is).
#[allow(unsafe_code)]
fn free_loop_number(control: &File) -> io::Result<u32> {
    // SAFETY: the fd is /dev/loop-control; see `GetFree`.
    Ok(unsafe { rustix::ioctl::ioctl(control, GetFree) }?)
}

/// Binds `device` to `backing` with `info`, in one step (LOOP_CONFIGURE), or where the kernel
/// lacks that (before 5.8) in two.
#[allow(unsafe_code)]
fn configure_loop(device: &File, backing: &File, info: LoopInfo64) -> io::Result<()> {
    let config = LoopConfig {
        fd: u32::try_from(backing.as_raw_fd()).map_err(io::Error::other)?,
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which `LoopConfig` mirrors.
    let configure = unsafe { rustix::ioctl::Setter::<LOOP_CONFIGURE, LoopConfig>::new(config) };
    // SAFETY: the fd is a loop device (the kernel refuses the opcode on anything else).
    match unsafe { rustix::ioctl::ioctl(device, configure) } {
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOTTY) => {
            configure_loop_in_two_steps(device, backing, info)
        }
        configured => Ok(configured?),
    }
}

#[allow(unsafe_code)]
fn configure_loop_in_two_steps(device: &File, backing: &File, info: LoopInfo64) -> io::Result<()> {
    let fd = usize::try_from(backing.as_raw_fd()).map_err(io::Error::other)?;
    // SAFETY: LOOP_SET_FD takes the backing file's descriptor as its integer argument.
    let set_fd = unsafe { rustix::ioctl::IntegerSetter::<LOOP_SET_FD>::new_usize(fd) };
    // SAFETY: the fd is a loop device (the kernel refuses the opcode on anything else).
    unsafe { rustix::ioctl::ioctl(device, set_fd) }?;
    set_loop_status(device, info)
}

#[allow(unsafe_code)]
fn loop_status(device: &impl AsFd) -> io::Result<LoopInfo64> {
    // SAFETY: LOOP_GET_STATUS64 writes a `struct loop_info64`, which `LoopInfo64` mirrors.
    let getter = unsafe { rustix::ioctl::Getter::<LOOP_GET_STATUS64, LoopInfo64>::new() };
    // SAFETY: the fd is a loop device (the kernel refuses the opcode on anything else).
    Ok(unsafe { rustix::ioctl::ioctl(device, getter) }?)
}

#[allow(unsafe_code)]
fn set_loop_status(device: &impl AsFd, info: LoopInfo64) -> io::Result<()> {
    // SAFETY: LOOP_SET_STATUS64 reads a `struct loop_info64`, which `LoopInfo64` mirrors.
    let setter = unsafe { rustix::ioctl::Setter::<LOOP_SET_STATUS64, LoopInfo64>::new(info) };
    // SAFETY: as above; the kernel only reads the struct.
    Ok(unsafe { rustix::ioctl::ioctl(device, setter) }?)
}

#[allow(unsafe_code)]
fn shut_down(root: &impl AsFd) -> io::Result<()> {
    // SAFETY: EXT4_IOC_SHUTDOWN reads a `__u32` of flags through the pointer it is given.
    let setter = unsafe {
        rustix::ioctl::Setter::<EXT4_IOC_SHUTDOWN, u32>::new(EXT4_GOING_FLAGS_NOLOGFLUSH)
    };
    // SAFETY: an fd on an ext4 filesystem (other filesystems refuse the opcode).
    Ok(unsafe { rustix::ioctl::ioctl(root, setter) }?)
}

#[allow(unsafe_code)]
fn resize(root: &impl AsFd, blocks: u64) -> io::Result<()> {
    // SAFETY: EXT4_IOC_RESIZE_FS reads a `__u64` block count through the pointer it is given.
    let setter = unsafe { rustix::ioctl::Setter::<EXT4_IOC_RESIZE_FS, u64>::new(blocks) };
    // SAFETY: an fd on an ext4 filesystem (other filesystems refuse the opcode).
    Ok(unsafe { rustix::ioctl::ioctl(root, setter) }?)
}

impl Driver {
    /// Makes sure `node` has its export of an ext4 volume, recorded and mounted. One recorded
    /// but no longer mounted (the machine restarted) is cut and opened afresh.
    pub fn ensure_export(&self, volume: &Volume, node: &str) -> Result<(), DriverError> {
        let at = self.store.export_path(node, &volume.id);
        let image = self.store.volume_data(&volume.id, volume.layout());
        let failed = |what: &str, e| {
            DriverError::io(format!("{what} volume {} to node {node}", volume.id), e)
        };
        if let Some(export) = volume.exports.get(node) {
            if mounts::is_mount_point(&at).map_err(|e| failed("checking the export of", e))? {
                // A crash may have come between the mount and its volume root.
                return fs::create_dir_all(volume_root(&at)).map_err(|e| failed("exporting", e));
            }
            cut(&at, &export.device, &image).map_err(|e| failed("cutting a stale export of", e))?;
        }
        let attached = attach(&image).map_err(|e| failed("exporting", e))?;
        // Recorded before it is mounted: a crash before the record leaves nothing (the device
        // detaches itself), one after leaves a record the next call finds stale and cuts.
        self.store.update(|state| {
            let Some(v) = state.volumes.get_mut(&volume.id) else {
                return Err(DriverError::not_found("volume", volume.id.as_str()));
            };
            v.exports.insert(
                node.to_string(),
                Export {
                    device: attached.device.clone(),
                },
            );
            Ok(())
        })?;
        mount(&attached, &image, &at).map_err(|e| failed("exporting", e))
    }

    /// Ends `node`'s export of an ext4 volume and forgets it: closed cleanly when the node has
    /// let go of the volume, cut (the fence) while it still has it staged or published.
    pub fn end_export(
        &self,
        volume: &Volume,
        node: &str,
        node_let_go: bool,
    ) -> Result<(), DriverError> {
        let Some(export) = volume.exports.get(node) else {
            return Ok(());
        };
        let at = self.store.export_path(node, &volume.id);
        let image = self.store.volume_data(&volume.id, volume.layout());
        let ended = if node_let_go {
            close(&at, &export.device, &image)
        } else {
            cut(&at, &export.device, &image)
        };
        ended.map_err(|e| {
            DriverError::io(
                format!("ending the export of volume {} to node {node}", volume.id),
                e,
            )
        })?;
        if node_let_go {
            tracing::info!(volume = %volume.id, %node, device = %export.device, "export closed");
        } else {
            tracing::warn!(volume = %volume.id, %node, device = %export.device, "export cut: the node still had the volume, and reaches its data no more");
        }
        self.store.update(|state| {
            if let Some(v) = state.volumes.get_mut(&volume.id) {
                v.exports.remove(node);
            }
            Ok(())
        })
    }

    /// Flushes every export of a volume before its image is copied (clone, snapshot), so the
    /// copy holds what its nodes wrote.
    pub fn flush_exports(&self, id: &str) {
        let Ok(state) = self.store.read() else {
            return;
        };
        for node in state
            .volumes
            .get(id)
            .into_iter()
            .flat_map(|v| v.exports.keys())
        {
            if let Err(error) = flush(&self.store.export_path(node, id)) {
                tracing::warn!(volume = %id, %node, %error, "flushing an export failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_abi() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
        assert_eq!(EXT4_IOC_SHUTDOWN, 0x8004_587D);
        assert_eq!(EXT4_IOC_RESIZE_FS, 0x4008_6610);
    }

    /// A device attached for an export that nothing mounts is gone once its file closes (as
    /// when the driver dies before mounting it), however the kernel had it bound.
    #[test]
    fn an_unmounted_export_device_detaches_itself() {
        if mounts::skip_without_root("an_unmounted_export_device_detaches_itself") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image");
        File::create(&image).unwrap().set_len(1 << 20).unwrap();
        let attached = attach(&image).unwrap();
        let device = attached.device.clone();
        assert!(loop_bound_to(&device, &image).unwrap());
        drop(attached);
        assert!(!loop_bound_to(&device, &image).unwrap(), "{device}");

        // The way of kernels before LOOP_CONFIGURE.
        let control = File::open("/dev/loop-control").unwrap();
        let device = format!("/dev/loop{}", free_loop_number(&control).unwrap());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)
            .unwrap();
        let backing = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        let mut info = LoopInfo64::zeroed();
        info.flags = LO_FLAGS_AUTOCLEAR;
        configure_loop_in_two_steps(&file, &backing, info).unwrap();
        assert!(loop_bound_to(&device, &image).unwrap());
        drop(file);
        assert!(!loop_bound_to(&device, &image).unwrap(), "{device}");
    }
}
