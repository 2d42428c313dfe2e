//! Writes the snapshot.storage.k8s.io/v1 CRDs generated from the Rust types into the directory
//! given (default `manifests/crds`), one file per CRD as upstream names them.

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "manifests/crds".to_string());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {dir}"))?;
    for crd in csi_snapshotter::api::crds() {
        let path = std::path::Path::new(&dir).join(csi_snapshotter::api::crd_file_name(&crd));
        std::fs::write(&path, csi_snapshotter::api::crd_yaml(&crd))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
