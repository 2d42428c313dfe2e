//! Writes the snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io CRDs generated from the
//! Rust types into the directory given (default `manifests/crds`), one file per CRD as upstream
//! names them.

fn main() -> Result<(), String> {
    let crds = [
        csi_kinds::snapshot::crds(),
        csi_kinds::groupsnapshot::crds(),
    ]
    .concat();
    csi_kinds::crd::write_crds_into_argument_dir(&crds, csi_kinds::snapshot::CRDS_COMMAND)
}
