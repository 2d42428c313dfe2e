//! The suite's container image without a container engine: the Dockerfile's runtime stage
//! (the release binaries, losetup and mke2fs, the shared libraries they load, the nonroot user)
//! for each platform, written as an image tarball: in `docker save` layout for this machine
//! (what `make test-node` imports with `node import`, `ctr images import`), or as an OCI image
//! layout whose index holds amd64 and arm64 (`make image`). No base image can be pulled offline,
//! so the libraries come from a root directory, found by asking its dynamic loader: for amd64
//! this machine's own / (`ldd`), the same glibc and libgcc the distroless cc image carries; for
//! arm64 Debian's arm64 packages unpacked by `scripts/install-cross.sh`, whose loader runs under
//! qemu-aarch64. The Dockerfile stays what users build; `tests/tests/scenarios/image.rs` keeps
//! the two in step.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The binaries of the workspace the image carries (the Dockerfile's `for binary in …`).
pub const BINARIES: [&str; 15] = [
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
    "csi-snapshotter",
    "snapshot-controller",
    "csi-health-monitor",
    "csi-snapshot-metadata",
    "csi-node-driver-registrar",
    "livenessprobe",
    "podmon",
    "csi-inventory",
    "csi-hostpath",
    "cosi-controller",
    "cosi-provisioner",
    "cosi-s3",
];

/// Host tools the image carries beside them, as this machine has them: the reference driver
/// attaches loop devices with losetup and formats ext4 volumes with mke2fs.
pub const TOOLS: [&str; 2] = ["/usr/sbin/losetup", "/usr/sbin/mke2fs"];

/// Where the binaries go in the image (on the default PATH).
pub const BIN_DIR: &str = "/usr/local/bin";

/// The user the image runs as unless a container asks for root (distroless `nonroot`).
pub const USER: &str = "65532:65532";

/// The ELF machine numbers (`e_machine`) of the two platforms.
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;

/// A platform the image is built for: its architecture as OCI names it, the ELF machine of its
/// programs, the root directory its tools and their libraries come from, and how that root's
/// dynamic loader is asked which libraries a program loads.
#[derive(Debug, Clone)]
pub struct Platform {
    pub architecture: &'static str,
    pub elf_machine: u16,
    root: PathBuf,
    list_libraries: Vec<OsString>,
}

impl Platform {
    /// amd64 from this machine's own files: `ldd` lists the libraries.
    pub fn amd64() -> Self {
        Self {
            architecture: "amd64",
            elf_machine: EM_X86_64,
            root: PathBuf::from("/"),
            list_libraries: vec!["ldd".into()],
        }
    }

    /// arm64 from `root`, Debian's arm64 packages unpacked (`scripts/install-cross.sh`): its own
    /// dynamic loader lists the libraries, run by qemu-aarch64 with `root` as the guest's /.
    pub fn arm64(root: &Path) -> Self {
        Self {
            architecture: "arm64",
            elf_machine: EM_AARCH64,
            root: root.to_path_buf(),
            list_libraries: vec![
                "qemu-aarch64".into(),
                "-L".into(),
                root.into(),
                "/lib/ld-linux-aarch64.so.1".into(),
                "--list".into(),
            ],
        }
    }

    /// Where a file at `path` of the image comes from: `path` under the root.
    fn source(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// The root's copy of `tool` (one of [`TOOLS`]): Debian's packages put losetup and mke2fs in
    /// /sbin, which a merged-/usr system such as this one also reaches as /usr/sbin.
    fn tool(&self, tool: &str) -> PathBuf {
        let path = Path::new(tool);
        let at_usr = self.source(path);
        if at_usr.exists() {
            return at_usr;
        }
        self.source(&Path::new("/sbin").join(path.file_name().unwrap_or_default()))
    }

    /// The shared libraries `executable` loads, the dynamic loader included, by their paths in
    /// the image.
    pub fn shared_libraries(&self, executable: &Path) -> Result<Vec<PathBuf>, ImageError> {
        let (program, args) = self
            .list_libraries
            .split_first()
            .expect("a command lists libraries");
        let output = Command::new(program)
            .args(args)
            .arg(executable)
            .output()
            .map_err(|source| ImageError::Read {
                path: PathBuf::from(program),
                source,
            })?;
        let ldd_error = |message: String| ImageError::Ldd {
            path: executable.to_path_buf(),
            message,
        };
        if !output.status.success() {
            return Err(ldd_error(
                String::from_utf8_lossy(&output.stderr).trim().to_string(),
            ));
        }
        parse_ldd(&String::from_utf8_lossy(&output.stdout))
            .map_err(|missing| ldd_error(format!("not found: {}", missing.join(", "))))
    }
}

/// The ELF machine (`e_machine`) of the executable `path`.
pub fn elf_machine(path: &Path) -> Result<u16, ImageError> {
    let header = elf_header(path)?;
    Ok(u16::from_le_bytes([header[18], header[19]]))
}

/// Whether the executable `path` names a program interpreter (the dynamic loader): a dynamically
/// linked program does, a static one does not.
pub fn has_interpreter(path: &Path) -> Result<bool, ImageError> {
    let data = std::fs::read(path).map_err(|source| ImageError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let not_elf = || ImageError::NotElf(path.to_path_buf());
    let field = |offset: usize, len: usize| -> Result<u64, ImageError> {
        let bytes = data.get(offset..offset + len).ok_or_else(not_elf)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0, |value, byte| (value << 8) | u64::from(*byte)))
    };
    elf_header(path)?;
    // ELF64 little-endian: e_phoff at 32, e_phentsize at 54, e_phnum at 56; p_type first.
    let program_headers = usize::try_from(field(32, 8)?).map_err(|_| not_elf())?;
    let entry_size = usize::try_from(field(54, 2)?).map_err(|_| not_elf())?;
    let count = usize::try_from(field(56, 2)?).map_err(|_| not_elf())?;
    const PT_INTERP: u64 = 3;
    for index in 0..count {
        if field(program_headers + index * entry_size, 4)? == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first 64 bytes of `path`, checked to be an ELF64 little-endian header (the only kind
/// either platform runs).
fn elf_header(path: &Path) -> Result<[u8; 64], ImageError> {
    let mut header = [0; 64];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .map_err(|source| ImageError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(ImageError::NotElf(path.to_path_buf()));
    }
    Ok(header)
}

/// Errors while building the image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("ldd {path}: {message}")]
    Ldd { path: PathBuf, message: String },
    #[error("{0}: not an ELF64 little-endian file")]
    NotElf(PathBuf),
    #[error("{path}: an executable for ELF machine {found}, not {architecture} ({expected})")]
    Architecture {
        path: PathBuf,
        architecture: &'static str,
        expected: u16,
        found: u16,
    },
    #[error("writing the image: {0}")]
    Write(#[from] io::Error),
}

/// Every file of one platform's image: its path in the image and where it comes from on this
/// machine.
#[derive(Debug)]
pub struct ImageFiles {
    architecture: &'static str,
    files: BTreeMap<PathBuf, PathBuf>,
}

/// The OCI media types of what an image layout holds.
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// A blob of an image: its bytes and their SHA-256 (hex).
struct Blob {
    digest: String,
    data: Vec<u8>,
}

impl Blob {
    fn new(data: Vec<u8>) -> Self {
        Self {
            digest: hex::encode(Sha256::digest(&data)),
            data,
        }
    }

    fn json(value: &serde_json::Value) -> Result<Self, ImageError> {
        Ok(Self::new(
            serde_json::to_vec(value).map_err(io::Error::other)?,
        ))
    }

    /// Its OCI descriptor as `media_type`.
    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        serde_json::json!({
            "mediaType": media_type,
            "digest": format!("sha256:{}", self.digest),
            "size": self.data.len(),
        })
    }
}

impl ImageFiles {
    /// The runtime stage for `platform`: the binaries of `release_dir` (each checked to be built
    /// for it), the tools, and every library any of them loads (the dynamic loader included), at
    /// the paths the loader looks them up.
    pub fn runtime_stage(platform: &Platform, release_dir: &Path) -> Result<Self, ImageError> {
        let mut files = BTreeMap::new();
        let executables = BINARIES
            .iter()
            .map(|name| release_dir.join(name))
            .chain(TOOLS.iter().map(|tool| platform.tool(tool)));
        for executable in executables {
            let found = elf_machine(&executable)?;
            if found != platform.elf_machine {
                return Err(ImageError::Architecture {
                    path: executable,
                    architecture: platform.architecture,
                    expected: platform.elf_machine,
                    found,
                });
            }
            let name = executable.file_name().unwrap_or_default();
            // A static program (the suite's own) loads no library and names no loader.
            if has_interpreter(&executable)? {
                for library in platform.shared_libraries(&executable)? {
                    let source = platform.source(&library);
                    files.insert(library, source);
                }
            }
            files.insert(Path::new(BIN_DIR).join(name), executable);
        }
        Ok(Self {
            architecture: platform.architecture,
            files,
        })
    }

    /// The image paths, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// The image's architecture (OCI's name).
    pub fn architecture(&self) -> &'static str {
        self.architecture
    }

    /// Writes the image `reference` (`name:tag`) to `out` in `docker save` layout: one layer,
    /// its config (user, PATH) and `manifest.json`.
    pub fn write_image(&self, reference: &str, out: &Path) -> Result<(), ImageError> {
        let layer = Blob::new(self.layer()?);
        let config = self.config(&layer)?;
        let config_name = format!("{}.json", config.digest);
        let layer_name = format!("{}/layer.tar", layer.digest);
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": [reference], "Layers": [layer_name],
        }]))
        .map_err(io::Error::other)?;
        let mut archive = tar::Builder::new(std::fs::File::create(out)?);
        for (name, data) in [
            (config_name.as_str(), config.data.as_slice()),
            (layer_name.as_str(), layer.data.as_slice()),
            ("manifest.json", manifest.as_slice()),
        ] {
            append_file(&mut archive, name, data, 0o644)?;
        }
        archive.into_inner()?.sync_all()?;
        Ok(())
    }

    /// Writes the image `reference` (`name:tag`) for every platform of `images` to `out` as an
    /// OCI image layout archive: `index.json` names one image index (by the annotations
    /// containerd's and Docker's import read) whose manifests are the platforms' images, each
    /// one uncompressed layer and its config.
    pub fn write_index(images: &[Self], reference: &str, out: &Path) -> Result<(), ImageError> {
        let mut blobs = Vec::new();
        let mut manifests = Vec::new();
        for image in images {
            let layer = Blob::new(image.layer()?);
            let config = image.config(&layer)?;
            let manifest = Blob::json(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": config.descriptor(OCI_CONFIG),
                "layers": [layer.descriptor(OCI_LAYER)],
            }))?;
            let mut descriptor = manifest.descriptor(OCI_MANIFEST);
            descriptor["platform"] =
                serde_json::json!({"architecture": image.architecture, "os": "linux"});
            manifests.push(descriptor);
            blobs.extend([layer, config, manifest]);
        }
        let index = Blob::json(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": manifests,
        }))?;
        let mut named = index.descriptor(OCI_INDEX);
        let tag = reference.rsplit_once(':').map_or("latest", |(_, tag)| tag);
        named["annotations"] = serde_json::json!({
            "io.containerd.image.name": reference,
            "org.opencontainers.image.ref.name": tag,
        });
        let layout = Blob::json(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [named],
        }))?;
        blobs.push(index);
        let mut archive = tar::Builder::new(std::fs::File::create(out)?);
        append_file(
            &mut archive,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        append_file(&mut archive, "index.json", &layout.data, 0o644)?;
        let mut written = std::collections::BTreeSet::new();
        for blob in &blobs {
            if written.insert(&blob.digest) {
                let name = format!("blobs/sha256/{}", blob.digest);
                append_file(&mut archive, name, &blob.data, 0o644)?;
            }
        }
        archive.into_inner()?.sync_all()?;
        Ok(())
    }

    /// The image's config (architecture, user, PATH) over its one `layer`.
    fn config(&self, layer: &Blob) -> Result<Blob, ImageError> {
        Blob::json(&serde_json::json!({
            "architecture": self.architecture,
            "os": "linux",
            "config": {
                "User": USER,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", layer.digest)]},
        }))
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

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2
/// (0x…)` give paths; the vDSO (`linux-vdso.so.1 (0x…)`) is the kernel's and has none. A library
/// the loader did not find (`libx.so.1 => not found`) is an error: the names of all such.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, Vec<String>> {
    let mut paths = Vec::new();
    let mut missing = Vec::new();
    for line in output.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((name, resolved)) if resolved.trim() == "not found" => {
                missing.push(name.trim().to_string());
                continue;
            }
            Some((_, resolved)) => resolved.trim().split(' ').next(),
            None => line.split(' ').next(),
        };
        if let Some(path) = path.filter(|path| path.starts_with('/')) {
            paths.push(PathBuf::from(path));
        }
    }
    if missing.is_empty() {
        Ok(paths)
    } else {
        Err(missing)
    }
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
            parse_ldd(output).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        assert_eq!(
            parse_ldd("\tlibz.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"),
            Err(vec!["libz.so.1".to_string()])
        );
    }
}
