//! The node's OS operations: read-only remounts, unmounts, loop devices, and
//! finding the processes that write under a path (for fencing). Mounts use rustix's safe
//! wrappers of mount(2); loop devices use util-linux `losetup`. Bind mounts onto a request's
//! path are [`crate::beneath`]'s.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::mount::mount_remount;

use crate::options::MountOptions;

pub use csi_grpc::mounts::{is_mount_point, mount_points};

/// True when running with the privileges mounting needs.
pub fn can_mount() -> bool {
    rustix::process::geteuid().is_root()
}

/// For tests that mount for real: true (after saying so) when `test` must be skipped because
/// this process cannot mount. Under `CI=true` it fails instead, since in CI no test may pass
/// without running.
pub fn skip_without_root(test: &str) -> bool {
    if can_mount() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} needs root (real mounts), and CI must run it"
    );
    eprintln!("skipped {test}: real mounts need root");
    true
}

/// Remounts the bind mount at `target` with `options`, keeping the restrictions it has but
/// read-only (see [`MountOptions::remount_flags`]).
pub fn remount(target: &Path, options: &MountOptions) -> io::Result<()> {
    let current = rustix::fs::statvfs(target)?.f_flag;
    mount_remount(target, options.remount_flags(current), "")?;
    Ok(())
}

/// Makes the mount at `target` read-only, its other flags kept.
pub fn remount_read_only(target: &Path) -> io::Result<()> {
    remount(target, &MountOptions::default().read_only_if(true))
}

/// Makes the mount at `target` writable again, its other flags kept.
pub fn remount_read_write(target: &Path) -> io::Result<()> {
    remount(target, &MountOptions::default())
}

pub use csi_grpc::mounts::{unmount_all, unmount_top};

/// Attaches `image` to a loop device, reusing one already attached to it.
pub fn loop_attach(image: &Path) -> io::Result<String> {
    match loop_device_of(image)? {
        Some(device) => Ok(device),
        None => loop_attach_new(image),
    }
}

/// Attaches `image` to a new loop device of its own, even when others are attached to it.
pub fn loop_attach_new(image: &Path) -> io::Result<String> {
    let output = losetup(&["--find", "--show", &image.display().to_string()])?;
    Ok(output.trim().to_string())
}

/// The loop device attached to `image`, if any.
pub fn loop_device_of(image: &Path) -> io::Result<Option<String>> {
    let output = losetup(&["--associated", &image.display().to_string()])?;
    Ok(output
        .lines()
        .next()
        .and_then(|line| line.split(':').next())
        .map(str::to_string)
        .filter(|device| !device.is_empty()))
}

pub fn loop_detach(device: &str) -> io::Result<()> {
    losetup(&["--detach", device]).map(drop)
}

/// Makes the loop device see its image's new size.
pub fn loop_refresh(device: &str) -> io::Result<()> {
    losetup(&["--set-capacity", device]).map(drop)
}

fn losetup(args: &[&str]) -> io::Result<String> {
    let output = Command::new("losetup").args(args).output()?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "losetup {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// The processes that can write to the volume mounted at `paths` (a node's staging and target
/// paths), which a fence must stop:
/// - every process holding a file of the volume open for writing, in any mount namespace: the
///   file is looked up from the process's own root, and it is the volume's when one of its
///   directories is a mount root at `paths` (same device and inode);
/// - every process of another mount namespace (a container) where the volume is mounted
///   somewhere else than at `paths`: a read-only remount of `paths` does not reach that mount,
///   and a writer there may open a file at any moment.
///
/// The namespaces of the host and of this process are spared the second rule: there the volume
/// is mounted only at `paths` (or propagated to the same paths), which the fence remounts
/// read-only. Seeing other containers' processes takes the host's PID namespace.
pub fn writers_under(paths: &[PathBuf]) -> Vec<i32> {
    let Ok(processes) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let volume = Volume::at(paths);
    let own = std::process::id();
    let spared: Vec<PathBuf> = ["self", "1"]
        .iter()
        .filter_map(|pid| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok())
        .collect();
    let mut namespaces: HashMap<PathBuf, bool> = HashMap::new();
    processes
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(own))
        .filter(|pid| {
            volume.written_by(*pid)
                || fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .ok()
                    .filter(|ns| !spared.contains(ns))
                    .is_some_and(|ns| {
                        *namespaces
                            .entry(ns)
                            .or_insert_with(|| volume.mounted_elsewhere_by(*pid))
                    })
        })
        .collect()
}

/// A volume as mounted at a node's staging and target paths.
struct Volume<'a> {
    paths: &'a [PathBuf],
    /// Device and inode of each mount root at `paths`.
    inodes: Vec<(u64, u64)>,
    /// The filesystem directories mounted at `paths`, as `(major:minor, root)`.
    sources: Vec<(String, PathBuf)>,
}

impl<'a> Volume<'a> {
    fn at(paths: &'a [PathBuf]) -> Self {
        let inodes = paths
            .iter()
            .filter_map(|path| fs::metadata(path).ok())
            .map(|meta| (meta.dev(), meta.ino()))
            .collect();
        let sources = csi_grpc::mounts::mount_table("self")
            .unwrap_or_default()
            .into_iter()
            .filter(|mount| paths.contains(&mount.mount_point))
            .map(|mount| (mount.device, mount.root))
            .collect();
        Self {
            paths,
            inodes,
            sources,
        }
    }

    /// Whether `pid` holds a file of the volume open for writing.
    fn written_by(&self, pid: i32) -> bool {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.filter_map(Result::ok).any(|fd| {
            let Ok(target) = fs::read_link(fd.path()) else {
                return false;
            };
            if !target.is_absolute() {
                return false;
            }
            // By device and inode, never by the path's text: in another mount namespace the
            // same path may be another filesystem, and its writers are not the volume's.
            self.contains_in_root_of(pid, &target) && {
                let info = fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .unwrap_or_default();
                open_for_writing(&info)
            }
        })
    }

    /// Whether `path`, as process `pid` sees it, lies under one of the volume's mount roots.
    fn contains_in_root_of(&self, pid: i32, path: &Path) -> bool {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        path.ancestors().skip(1).any(|dir| {
            let seen = root.join(dir.strip_prefix("/").unwrap_or(dir));
            fs::metadata(seen).is_ok_and(|meta| self.inodes.contains(&(meta.dev(), meta.ino())))
        })
    }

    /// Whether the mount namespace of `pid` has the volume (or a directory of it) mounted
    /// anywhere but at `paths`.
    fn mounted_elsewhere_by(&self, pid: i32) -> bool {
        csi_grpc::mounts::mount_table(&pid.to_string())
            .unwrap_or_default()
            .iter()
            .any(|mount| {
                !self.paths.contains(&mount.mount_point)
                    && self.sources.iter().any(|(device, root)| {
                        mount.device == *device && mount.root.starts_with(root)
                    })
            })
    }
}

/// fdinfo's `flags:` field is octal; O_WRONLY is 1 and O_RDWR is 2.
fn open_for_writing(fdinfo: &str) -> bool {
    fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .and_then(|flags| u32::from_str_radix(flags.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 != 0)
}

/// SIGKILL, for writers on a fenced node: their storage is gone.
pub fn kill(pid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_flags() {
        assert!(open_for_writing("pos:\t0\nflags:\t0100001\nmnt_id:\t1\n"));
        assert!(open_for_writing("flags:\t02\n"));
        assert!(!open_for_writing("flags:\t0100000\n"));
        assert!(!open_for_writing(""));
    }

    #[test]
    fn our_own_writer_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec 3>>{} ; sleep 30", path.display()))
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let mut found = false;
        for _ in 0..50 {
            if writers_under(&[dir.path().to_path_buf()]).contains(&pid) {
                found = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        kill(pid);
        let _ = child.wait();
        assert!(found, "the child's writable fd must be found");
    }

    /// A container's writer: its own mount namespace, the volume bind-mounted at its own path,
    /// and a file opened only for each write (so no fd is open most of the time). The fence
    /// finds it through the mount, as it would find a real container.
    #[test]
    fn a_writer_in_another_mount_namespace_is_found() {
        if skip_without_root("a_writer_in_another_mount_namespace_is_found") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, target, inside) = (
            dir.path().join("data"),
            dir.path().join("target"),
            dir.path().join("inside"),
        );
        for d in [&data, &target, &inside] {
            fs::create_dir(d).unwrap();
        }
        rustix::mount::mount_bind(&data, &target).unwrap();
        let script = format!(
            "mount --bind {target} {inside} && while :; do echo x >> {inside}/log; sleep 0.05; done",
            target = target.display(),
            inside = inside.display()
        );
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let mut found = Vec::new();
        for _ in 0..100 {
            found = writers_under(std::slice::from_ref(&target));
            if found.contains(&pid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        kill(pid);
        let _ = child.wait();
        let _ = rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH);
        assert!(
            found.contains(&pid),
            "the container's writer must be found: {found:?}"
        );
        assert!(
            !found.contains(&i32::try_from(std::process::id()).unwrap()),
            "never this process"
        );
    }

    /// A process of another mount namespace writing at the volume's path, where that
    /// namespace has mounted another filesystem over it: the same path, not the volume.
    #[test]
    fn a_writer_of_another_filesystem_at_the_same_path_is_spared() {
        if skip_without_root("a_writer_of_another_filesystem_at_the_same_path_is_spared") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, target) = (dir.path().join("data"), dir.path().join("target"));
        for d in [&data, &target] {
            fs::create_dir(d).unwrap();
        }
        rustix::mount::mount_bind(&data, &target).unwrap();
        let script = format!(
            "mount -t tmpfs none {target} && exec 3>>{target}/log && while :; do echo x >&3; sleep 0.05; done",
            target = target.display()
        );
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let log = target.join("log");
        let mut open = false;
        for _ in 0..100 {
            open = fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.filter_map(Result::ok)
                    .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == log))
            });
            if open {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let found = writers_under(std::slice::from_ref(&target));
        kill(pid);
        let _ = child.wait();
        let _ = rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH);
        assert!(open, "the writer holds {} open", log.display());
        assert!(!found.contains(&pid), "not the volume's writer: {found:?}");
    }
}
