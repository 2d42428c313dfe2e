//! The image tarballs built without a container engine hold what the Dockerfile's runtime
//! stage holds: `make test-node`'s loadable `docker save` archive (amd64), and `make image`'s OCI
//! image layout whose index holds amd64 and arm64; `make cross`'s arm64 binaries start under
//! qemu-aarch64.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_suite_scenarios::image::{
    BIN_DIR, BINARIES, EM_AARCH64, EM_X86_64, ImageError, ImageFiles, Platform, TOOLS, USER,
    elf_machine, has_interpreter,
};
use sha2::{Digest, Sha256};

/// The top of the repository.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file at the top of the repository.
fn repo_file(name: &str) -> String {
    let path = workspace().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `path` of the workspace, made by `make cross` (`what` it is), or `None` (a skip, said on
/// stderr) where it is missing outside CI. Under CI=true it must be there: .ci/run runs
/// `make cross` before the tests.
fn made_by_cross(path: &str, what: &str) -> Option<PathBuf> {
    let path = workspace().join(path);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} ({what}) is missing under CI: .ci/run runs make cross before make test",
        path.display()
    );
    eprintln!("SKIPPED: needs {} ({what}): run make cross", path.display());
    None
}

/// The entries of a tar archive: name to contents.
fn tar_entries(data: impl Read) -> BTreeMap<String, Vec<u8>> {
    let mut entries = BTreeMap::new();
    let mut archive = tar::Archive::new(data);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut contents = Vec::new();
        entry.read_to_end(&mut contents).unwrap();
        entries.insert(name, contents);
    }
    entries
}

/// The ELF machine of an executable's bytes, if they are one.
fn machine_of(contents: &[u8]) -> Option<u16> {
    (contents.starts_with(b"\x7fELF") && contents.len() > 20)
        .then(|| u16::from_le_bytes([contents[18], contents[19]]))
}

/// The words of a Makefile variable, continuation lines included.
fn makefile_words(makefile: &str, variable: &str) -> Vec<String> {
    let start = makefile
        .find(&format!("\n{variable} := "))
        .unwrap_or_else(|| panic!("the Makefile's {variable}"));
    let mut words = Vec::new();
    for line in makefile[start + variable.len() + 5..].lines() {
        let continued = line.trim_end().ends_with('\\');
        words.extend(
            line.trim_end_matches(['\\', ' '])
                .split_whitespace()
                .map(str::to_string),
        );
        if !continued {
            break;
        }
    }
    words
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
    let makefile = repo_file("Makefile");
    let packages: Vec<&str> = text
        .split_whitespace()
        .filter(|word| *word != "\\")
        .skip_while(|word| *word != "-p")
        .collect::<Vec<_>>()
        .chunks(2)
        .take_while(|pair| pair[0] == "-p")
        .map(|pair| pair[1])
        .collect();
    assert_eq!(
        packages,
        makefile_words(&makefile, "IMAGE_PACKAGES"),
        "the Dockerfile builds the packages make cross builds for arm64"
    );
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

/// A release directory `name` whose "binaries" are copies of `executable`, a real dynamically
/// linked one.
fn stand_in_release(dir: &Path, name: &str, executable: &Path) -> PathBuf {
    let release = dir.join(name);
    std::fs::create_dir(&release).unwrap();
    for binary in BINARIES {
        std::fs::copy(executable, release.join(binary)).unwrap();
    }
    release
}

#[test]
fn the_image_is_a_docker_archive_with_binaries_libraries_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let release = stand_in_release(dir.path(), "release", Path::new("/bin/true"));
    let files = ImageFiles::runtime_stage(&Platform::amd64(), &release).unwrap();
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
    let entries = tar_entries(std::fs::File::open(&out).unwrap());
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
    assert_eq!(config["architecture"], "amd64");

    let in_layer = tar_entries(layer.as_slice());
    assert!(
        in_layer.contains_key("usr/local/bin/csi-hostpath"),
        "{:?}",
        in_layer.keys()
    );
    assert!(in_layer.contains_key("tmp"));
    let passwd = String::from_utf8_lossy(&in_layer["etc/passwd"]);
    assert!(passwd.contains("nonroot:x:65532:65532"), "{passwd}");
}

#[test]
fn an_arm64_image_refuses_binaries_built_for_amd64() {
    let dir = tempfile::tempdir().unwrap();
    let release = stand_in_release(dir.path(), "release", Path::new("/bin/true"));
    let error = ImageFiles::runtime_stage(&Platform::arm64(dir.path()), &release).unwrap_err();
    assert!(
        matches!(
            error,
            ImageError::Architecture {
                architecture: "arm64",
                expected: EM_AARCH64,
                found: EM_X86_64,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn the_image_index_holds_an_amd64_and_an_arm64_image() {
    let Some(arm64_root) = made_by_cross(".tools/arm64/root", "arm64's losetup and mke2fs") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let amd64 = stand_in_release(dir.path(), "amd64", Path::new("/bin/true"));
    let arm64 = stand_in_release(dir.path(), "arm64", &arm64_root.join("sbin/losetup"));
    let images = [
        ImageFiles::runtime_stage(&Platform::amd64(), &amd64).unwrap(),
        ImageFiles::runtime_stage(&Platform::arm64(&arm64_root), &arm64).unwrap(),
    ];
    let out = dir.path().join("image.oci.tar");
    ImageFiles::write_index(&images, "csi-suite:test", &out).unwrap();

    let entries = tar_entries(std::fs::File::open(&out).unwrap());
    let layout: serde_json::Value = serde_json::from_slice(&entries["oci-layout"]).unwrap();
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    for (name, contents) in &entries {
        if let Some(digest) = name.strip_prefix("blobs/sha256/") {
            assert_eq!(digest, hex::encode(Sha256::digest(contents)), "{name}");
        }
    }
    // blob(descriptor): the blob a descriptor names, checked against its size.
    let blob = |descriptor: &serde_json::Value| -> &[u8] {
        let digest = descriptor["digest"].as_str().unwrap();
        let contents =
            &entries[&format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap())];
        assert_eq!(descriptor["size"], contents.len(), "{digest}");
        contents
    };
    let json = |data: &[u8]| -> serde_json::Value { serde_json::from_slice(data).unwrap() };

    let layout_index = json(&entries["index.json"]);
    let named = &layout_index["manifests"][0];
    assert_eq!(layout_index["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(
        named["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(
        named["annotations"]["io.containerd.image.name"],
        "csi-suite:test"
    );
    assert_eq!(
        named["annotations"]["org.opencontainers.image.ref.name"],
        "test"
    );
    let index = json(blob(named));
    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let platform = &m["platform"];
            (
                platform["os"].to_string(),
                platform["architecture"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            (r#""linux""#.into(), r#""amd64""#.into()),
            (r#""linux""#.into(), r#""arm64""#.into())
        ]
    );
    for (descriptor, machine, loader) in [
        (&index["manifests"][0], EM_X86_64, "ld-linux-x86-64.so.2"),
        (&index["manifests"][1], EM_AARCH64, "ld-linux-aarch64.so.1"),
    ] {
        let architecture = &descriptor["platform"]["architecture"];
        let manifest = json(blob(descriptor));
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        let config = json(blob(&manifest["config"]));
        assert_eq!(&config["architecture"], architecture);
        assert_eq!(config["config"]["User"], USER);
        let layer = blob(&manifest["layers"][0]);
        assert_eq!(
            config["rootfs"]["diff_ids"][0], manifest["layers"][0]["digest"],
            "an uncompressed layer's diff ID is its digest"
        );
        let files = tar_entries(layer);
        for binary in BINARIES.iter().chain(&["losetup", "mke2fs"]) {
            let path = format!("usr/local/bin/{binary}");
            assert!(files.contains_key(&path), "{architecture}: {path}");
        }
        for (path, contents) in &files {
            if let Some(found) = machine_of(contents) {
                assert_eq!(
                    found, machine,
                    "{architecture}: {path} is for another machine"
                );
            }
        }
        let names: BTreeSet<&str> = files.keys().filter_map(|p| p.rsplit('/').next()).collect();
        for library in [loader, "libc.so.6", "libsmartcols.so.1", "libext2fs.so.2"] {
            assert!(
                names.contains(library),
                "{architecture}: {library} in {names:?}"
            );
        }
    }
}

#[test]
fn the_arm64_binaries_start_under_qemu() {
    let Some(release) = made_by_cross("target/release-arm64", "the arm64 release binaries") else {
        return;
    };
    for binary in BINARIES {
        let path = release.join(binary);
        assert_eq!(elf_machine(&path).unwrap(), EM_AARCH64, "{binary}");
        assert!(
            !has_interpreter(&path).unwrap(),
            "{binary} is statically linked"
        );
        let run = |flag: &str| {
            let output = Command::new("qemu-aarch64")
                .arg(&path)
                .arg(flag)
                .output()
                .expect("qemu-aarch64 runs (scripts/install-cross.sh installs qemu-user)");
            assert!(
                output.status.success(),
                "{binary} {flag}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap()
        };
        assert_eq!(
            run("--version").trim(),
            format!("{binary} {}", env!("CARGO_PKG_VERSION")),
        );
        assert!(run("--help").contains("Usage:"), "{binary} --help");
    }
}
