//! Writes the snapshot.storage.k8s.io/v1 CRDs generated from the Rust types into the directory
//! given (default `manifests/crds`), one file per CRD as upstream names them.

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "manifests/crds".to_string());
    csi_sidecar::crd::write_crds(
        std::path::Path::new(&dir),
        &csi_snapshotter::api::crds(),
        csi_snapshotter::api::CRDS_COMMAND,
    )
    .with_context(|| format!("writing the CRDs into {dir}"))
}
