//! Writes the suite's image tarball (`docker save` layout) from the release binaries, for a
//! node without a registry (`make test-node` imports it with `node import`):
//!
//!   cargo run -p csi-suite-scenarios --example node_image -- RELEASE_DIR NAME:TAG OUT.tar

use std::path::PathBuf;

use anyhow::Context;
use csi_suite_scenarios::image::ImageFiles;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [release_dir, reference, out] = args.as_slice() else {
        anyhow::bail!("usage: node_image RELEASE_DIR NAME:TAG OUT.tar");
    };
    let files = ImageFiles::runtime_stage(&PathBuf::from(release_dir))?;
    files
        .write_image(reference, &PathBuf::from(out))
        .with_context(|| format!("writing {out}"))?;
    eprintln!("{out}: {reference}, {} files", files.paths().count());
    Ok(())
}
