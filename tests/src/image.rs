//! The suite's container image without a container engine: the Dockerfile's runtime stage
//! (the release binaries, losetup and mke2fs, the shared libraries they load, the nonroot user) written as
//! an image tarball in `docker save` layout, which `ctr images import` (and `node import`) load.
//! No base image can be pulled offline, so the libraries come from this machine, found by
//! `ldd`: the same glibc and libgcc the distroless cc image carries. The Dockerfile stays what
//! users build; `tests/tests/scenarios/image.rs` keeps the two in step.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The binaries of the workspace the image carries (the Dockerfile's `for binary in …`).
pub const BINARIES: [&str; 14] = [
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
    "csi-snapshotter",
    "snapshot-controller",
    "csi-health-monitor",
    "csi-node-driver-registrar",
    "livenessprobe",
    "podmon",
    "csi-inventory",
    "csi-hostpath",
    "cosi-controller",
    "cosi-provisioner",
    "cosi-s3",
];

/// Host tools the image carries beside them: the reference driver attaches loop devices
/// with losetup and formats ext4 volumes with mke2fs.
pub const TOOLS: [&str; 2] = ["/usr/sbin/losetup", "/usr/sbin/mke2fs"];

/// Where the binaries go in the image (on the default PATH).
pub const BIN_DIR: &str = "/usr/local/bin";

/// The user the image runs as unless a container asks for root (distroless `nonroot`).
pub const USER: &str = "65532:65532";

/// Errors while building the image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("ldd {path}: {message}")]
    Ldd { path: PathBuf, message: String },
    #[error("writing the image: {0}")]
    Write(#[from] io::Error),
}

/// Every file of the image: its path in the image and where it comes from on this machine.
#[derive(Debug, Default)]
pub struct ImageFiles {
    files: BTreeMap<PathBuf, PathBuf>,
}

impl ImageFiles {
    /// The runtime stage: the binaries of `release_dir`, the tools, and every library any of
    /// them loads (the dynamic loader included), at the paths the loader looks them up.
    pub fn runtime_stage(release_dir: &Path) -> Result<Self, ImageError> {
        let mut files = Self::default();
        let executables = BINARIES
            .iter()
            .map(|name| release_dir.join(name))
            .chain(TOOLS.iter().map(PathBuf::from));
        for executable in executables {
            let name = executable.file_name().unwrap_or_default();
            files
                .files
                .insert(Path::new(BIN_DIR).join(name), executable.clone());
            for library in shared_libraries(&executable)? {
                files.files.insert(library.clone(), library);
            }
        }
        Ok(files)
    }

    /// The image paths, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// Writes the image `reference` (`name:tag`) to `out` in `docker save` layout: one layer,
    /// its config (user, PATH) and `manifest.json`.
    pub fn write_image(&self, reference: &str, out: &Path) -> Result<(), ImageError> {
        let layer = self.layer()?;
        let layer_digest = hex::encode(Sha256::digest(&layer));
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": USER,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        }))
        .map_err(io::Error::other)?;
        let config_name = format!("{}.json", hex::encode(Sha256::digest(&config)));
        let layer_name = format!("{layer_digest}/layer.tar");
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": [reference], "Layers": [layer_name],
        }]))
        .map_err(io::Error::other)?;
        let mut archive = tar::Builder::new(std::fs::File::create(out)?);
        for (name, data) in [
            (config_name.as_str(), config.as_slice()),
            (layer_name.as_str(), layer.as_slice()),
            ("manifest.json", manifest.as_slice()),
        ] {
            append_file(&mut archive, name, data, 0o644)?;
        }
        archive.into_inner()?.sync_all()?;
        Ok(())
    }

    /// The one layer: directories, the files (symlinks followed), the nonroot user.
    fn layer(&self) -> Result<Vec<u8>, ImageError> {
        let mut layer = tar::Builder::new(Vec::new());
        let mut dirs: Vec<PathBuf> = ["tmp", "etc", "home/nonroot", "proc", "sys", "dev"]
            .iter()
            .map(PathBuf::from)
            .collect();
        for path in self.files.keys() {
            let relative = path.strip_prefix("/").unwrap_or(path);
            dirs.extend(relative.ancestors().skip(1).map(Path::to_path_buf));
        }
        dirs.retain(|dir| !dir.as_os_str().is_empty());
        dirs.sort();
        dirs.dedup();
        for dir in &dirs {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(if dir == Path::new("tmp") {
                0o1777
            } else {
                0o755
            });
            header.set_size(0);
            header.set_mtime(0);
            if dir == Path::new("home/nonroot") {
                header.set_uid(65532);
                header.set_gid(65532);
            }
            layer.append_data(&mut header, dir, io::empty())?;
        }
        for (path, source) in &self.files {
            let data = std::fs::read(source).map_err(|source_error| ImageError::Read {
                path: source.clone(),
                source: source_error,
            })?;
            let relative = path.strip_prefix("/").unwrap_or(path);
            append_file(&mut layer, relative, &data, 0o755)?;
        }
        append_file(
            &mut layer,
            "etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            0o644,
        )?;
        append_file(
            &mut layer,
            "etc/group",
            b"root:x:0:\nnonroot:x:65532:\n",
            0o644,
        )?;
        Ok(layer.into_inner()?)
    }
}

fn append_file<W: io::Write>(
    archive: &mut tar::Builder<W>,
    path: impl AsRef<Path>,
    data: &[u8],
    mode: u32,
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    archive.append_data(&mut header, path, data)
}

/// The shared libraries `executable` loads, the dynamic loader included, by the paths `ldd`
/// resolves them to.
pub fn shared_libraries(executable: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let output = Command::new("ldd")
        .arg(executable)
        .output()
        .map_err(|source| ImageError::Read {
            path: "ldd".into(),
            source,
        })?;
    if !output.status.success() {
        return Err(ImageError::Ldd {
            path: executable.to_path_buf(),
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2
/// (0x…)` give paths; the vDSO (`linux-vdso.so.1 (0x…)`) is the kernel's and has none.
fn parse_ldd(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, resolved)) => resolved.trim().split(' ').next()?,
                None => line.split(' ').next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines() {
        let output = "\tlinux-vdso.so.1 (0x00007efc4d0ca000)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007efc4d099000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007efc4be1e000)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007efc4d0cc000)\n";
        assert_eq!(
            parse_ldd(output),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").is_empty());
    }
}
