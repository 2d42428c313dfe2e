//! The node's OS operations: bind mounts, read-only remounts, unmounts, loop devices, and
//! finding the processes that write under a path (for fencing). Mounts use rustix's safe
//! wrappers of mount(2); loop devices use util-linux `losetup`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::mount::{MountFlags, UnmountFlags, mount_bind, mount_remount, unmount};

pub use csi_sidecar::mounts::{is_mount_point, mount_points};

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

/// Bind-mounts `source` on `target`, read-only when asked (a bind mount takes `ro` only on
/// a remount).
pub fn bind(source: &Path, target: &Path, readonly: bool) -> io::Result<()> {
    mount_bind(source, target)?;
    if readonly && let Err(error) = remount_read_only(target) {
        let _ = unmount(target, UnmountFlags::DETACH);
        return Err(error);
    }
    Ok(())
}

pub fn remount_read_only(target: &Path) -> io::Result<()> {
    mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")?;
    Ok(())
}

pub fn remount_read_write(target: &Path) -> io::Result<()> {
    mount_remount(target, MountFlags::BIND, "")?;
    Ok(())
}

pub use csi_sidecar::mounts::unmount_all;

/// Attaches `image` to a loop device, reusing one already attached to it.
pub fn loop_attach(image: &Path) -> io::Result<String> {
    if let Some(device) = loop_device_of(image)? {
        return Ok(device);
    }
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

/// Processes holding a file under any of `paths` open for writing.
pub fn writers_under(paths: &[PathBuf]) -> Vec<i32> {
    let Ok(processes) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id();
    processes
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(own))
        .filter(|pid| writes_under(*pid, paths))
        .collect()
}

fn writes_under(pid: i32, paths: &[PathBuf]) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        let Ok(target) = fs::read_link(fd.path()) else {
            return false;
        };
        if !paths.iter().any(|p| target.starts_with(p)) {
            return false;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        open_for_writing(&info)
    })
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
}
