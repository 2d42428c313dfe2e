//! Writes the objectstorage.k8s.io/v1alpha1 CRDs generated from the Rust types into the
//! directory given (default `manifests/crds`), one file per CRD as upstream names them.

fn main() -> Result<(), String> {
    csi_kinds::crd::write_crds_into_argument_dir(
        &csi_kinds::objectstorage::crds(),
        csi_kinds::objectstorage::CRDS_COMMAND,
    )
}
