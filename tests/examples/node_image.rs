//! Writes the suite's image from the release binaries, without a container engine:
//!
//!   cargo run -p csi-suite-scenarios --example node_image -- RELEASE_DIR NAME:TAG OUT.tar
//!     amd64 only, in `docker save` layout, for a node without a registry (`make test-node`
//!     imports it with `node import`);
//!   cargo run -p csi-suite-scenarios --example node_image -- --index NAME:TAG OUT.tar \
//!       AMD64_RELEASE_DIR ARM64_RELEASE_DIR ARM64_ROOT
//!     amd64 and arm64 as an OCI image layout with one image index (`make image`); ARM64_ROOT
//!     holds arm64's losetup, mke2fs and their libraries (`scripts/install-cross.sh`).

use std::path::Path;

use anyhow::Context;
use csi_suite_scenarios::image::{ImageFiles, Platform};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [release_dir, reference, out] => {
            let files = ImageFiles::runtime_stage(&Platform::amd64(), Path::new(release_dir))?;
            files
                .write_image(reference, Path::new(out))
                .with_context(|| format!("writing {out}"))?;
            eprintln!("{out}: {reference}, {} files", files.paths().count());
        }
        [flag, reference, out, amd64_dir, arm64_dir, arm64_root] if flag == "--index" => {
            let images = [
                ImageFiles::runtime_stage(&Platform::amd64(), Path::new(amd64_dir))?,
                ImageFiles::runtime_stage(
                    &Platform::arm64(Path::new(arm64_root)),
                    Path::new(arm64_dir),
                )?,
            ];
            ImageFiles::write_index(&images, reference, Path::new(out))
                .with_context(|| format!("writing {out}"))?;
            for image in &images {
                eprintln!(
                    "{out}: {reference} for {}, {} files",
                    image.architecture(),
                    image.paths().count()
                );
            }
        }
        _ => anyhow::bail!(
            "usage: node_image RELEASE_DIR NAME:TAG OUT.tar\n       \
             node_image --index NAME:TAG OUT.tar AMD64_RELEASE_DIR ARM64_RELEASE_DIR ARM64_ROOT"
        ),
    }
    Ok(())
}
