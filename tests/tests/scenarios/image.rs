//! The image tarball `make test-node` builds without a container engine holds what the
//! Dockerfile's runtime stage holds, and is a loadable `docker save` archive.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use csi_suite_scenarios::image::{BIN_DIR, BINARIES, ImageFiles, TOOLS, USER};
use sha2::{Digest, Sha256};

/// A file at the top of the repository.
fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The words of the Dockerfile's `for binary in …; do` loop.
fn dockerfile_binaries(text: &str) -> Vec<String> {
    let start = text.find("for binary in ").expect("the binaries loop") + "for binary in ".len();
    let end = start + text[start..].find(';').expect("the loop's end");
    text[start..end]
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_image_carries_what_the_dockerfile_carries() {
    let text = repo_file("Dockerfile");
    assert_eq!(
        dockerfile_binaries(&text),
        BINARIES,
        "the Dockerfile and tests/src/image.rs name the same binaries"
    );
    for package in [
        "csi-provisioner",
        "csi-attacher",
        "csi-resizer",
        "csi-snapshotter",
        "podmon",
        "csi-inventory",
        "csi-hostpath",
        "cosi",
    ] {
        assert!(text.contains(&format!("-p {package}")), "{package} built");
    }
    let makefile = repo_file("Makefile");
    let release_rustflags = makefile
        .lines()
        .find_map(|line| line.strip_prefix("RELEASE_RUSTFLAGS := "))
        .expect("the Makefile's RELEASE_RUSTFLAGS");
    assert!(
        text.contains(&format!("RUSTFLAGS=\"{release_rustflags}\"")),
        "the image's binaries are linked as make build links them"
    );
    for tool in TOOLS {
        assert!(
            text.contains(&format!("cp {tool} /out/bin/")),
            "{tool} copied"
        );
    }
    assert!(
        text.contains(&format!("ldd {} |", TOOLS.join(" "))),
        "the tools' libraries copied"
    );
    let runtime = &text[text.rfind("\nFROM ").expect("a runtime stage")..];
    assert!(runtime.contains(&format!("USER {USER}")), "same user");
    assert!(
        runtime.contains(&format!("/out/bin/ {BIN_DIR}/")),
        "same bin dir"
    );
}

/// A release directory whose "binaries" are copies of a real dynamically linked executable.
fn stand_in_release(dir: &Path) -> PathBuf {
    let release = dir.join("release");
    std::fs::create_dir(&release).unwrap();
    for binary in BINARIES {
        std::fs::copy("/bin/true", release.join(binary)).unwrap();
    }
    release
}

#[test]
fn the_image_is_a_docker_archive_with_binaries_libraries_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let files = ImageFiles::runtime_stage(&stand_in_release(dir.path())).unwrap();
    let paths: BTreeSet<PathBuf> = files.paths().map(Path::to_path_buf).collect();
    for binary in BINARIES.iter().chain(["losetup", "mke2fs"].iter()) {
        assert!(paths.contains(&Path::new(BIN_DIR).join(binary)), "{binary}");
    }
    let names: Vec<String> = paths
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    for library in ["libc.so.6", "libsmartcols.so.1", "libext2fs.so.2"] {
        assert!(names.iter().any(|n| n == library), "{library} in {names:?}");
    }
    assert!(
        names.iter().any(|n| n.starts_with("ld-linux")),
        "the dynamic loader"
    );

    let out = dir.path().join("image.tar");
    files.write_image("csi-suite:test", &out).unwrap();
    let mut entries = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(std::fs::File::open(&out).unwrap());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        entries.insert(name, data);
    }
    let manifest: serde_json::Value = serde_json::from_slice(&entries["manifest.json"]).unwrap();
    assert_eq!(manifest[0]["RepoTags"][0], "csi-suite:test");
    let config_name = manifest[0]["Config"].as_str().unwrap();
    let layer_name = manifest[0]["Layers"][0].as_str().unwrap();
    let config: serde_json::Value = serde_json::from_slice(&entries[config_name]).unwrap();
    let layer = &entries[layer_name];
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", hex::encode(Sha256::digest(layer))),
        "the config names the layer by its digest"
    );
    assert_eq!(config["config"]["User"], USER);

    let mut in_layer = BTreeSet::new();
    let mut passwd = String::new();
    let mut layer_archive = tar::Archive::new(layer.as_slice());
    for entry in layer_archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        if name == "etc/passwd" {
            entry.read_to_string(&mut passwd).unwrap();
        }
        in_layer.insert(name);
    }
    assert!(
        in_layer.contains("usr/local/bin/csi-hostpath"),
        "{in_layer:?}"
    );
    assert!(in_layer.contains("tmp"));
    assert!(passwd.contains("nonroot:x:65532:65532"), "{passwd}");
}
