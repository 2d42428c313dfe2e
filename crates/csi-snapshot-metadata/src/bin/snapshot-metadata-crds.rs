//! Writes the cbt.storage.k8s.io SnapshotMetadataService CRD generated from the Rust type into
//! the directory given (default `manifests/crds`), named as upstream names it.

fn main() -> Result<(), String> {
    csi_kinds::crd::write_crds_into_argument_dir(
        &csi_kinds::cbt::crds(),
        csi_kinds::cbt::CRDS_COMMAND,
    )
}
