//! Protobuf types and gRPC clients/servers for the CSI sidecars.
//!
//! - [`csi::v1`]: the Container Storage Interface v1 (spec v1.13.0): `Identity`, `Controller`,
//!   `Node`, `GroupController` and the alpha `SnapshotMetadata` service.
//! - `csi::v1_12` (feature `v1-12`): the messages of spec v1.12.0, the last with the alpha
//!   `VolumeCondition` that v1.13.0 removed. Same proto package and method paths as
//!   [`csi::v1`], so they decode what drivers of v1.0-v1.12 send (and encode what they
//!   serve); no clients or servers.
//! - [`pluginregistration`]: the kubelet plugin-registration API (proto package
//!   `pluginregistration`, API v1).
//! - [`podmon::v1`]: Dell's `podmon.v1.Podmon` driver extension used by the resiliency sidecar.
//! - [`cosi::v1alpha1`]: the Container Object Storage Interface v1alpha1 (`Identity`,
//!   `Provisioner`), as released in COSI v0.2.2.
//! - [`snapshotmetadata`]: the Kubernetes SnapshotMetadata API (proto package
//!   `snapshotmetadata`) that the csi-snapshot-metadata sidecar serves to backup applications.
//! - [`grpc::health::v1`]: the gRPC health checking protocol, which that sidecar serves too.
//!
//! Code is generated at build time from `proto/` by protox and tonic-prost-build; no `protoc`
//! is needed.
//!
//! # Secrets
//!
//! The `Debug` output of a message never shows the contents of a field marked
//! `[(csi.v1.csi_secret) = true]` or `[(cosi.v1alpha1.cosi_secret) = true]`, nor of a
//! SnapshotMetadata request's `security_token` (the published proto has no such option; the
//! build script names those fields): for example `secrets: <redacted 2 keys>` or
//! `security_token: <redacted>`. Map keys are hidden too. All other fields print as prost's derived `Debug` would print them.
//! [`SECRET_BEARING_MESSAGES`] lists the messages this applies to. Only `Debug` is covered.
//! Serializing a message (protobuf or otherwise) still includes its secrets.

// Lints on generated code: prost/tonic output is not ours to fix, and new clippy/rustdoc lints
// keep appearing for it (doc comments copied from the protos, large enum variants, ...). So
// the generated modules, and only those, allow clippy, missing-docs and rustdoc lints. Nothing
// fires with today's toolchain; the allows are there so a toolchain update can't break
// `clippy -D warnings`. `missing_debug_implementations` stays on: one more guard that every
// type prost left without `Debug` got a generated one.
macro_rules! generated_package {
    ($package:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $package, ".rs"));
        include!(concat!(env!("OUT_DIR"), "/", $package, ".debug.rs"));
    };
}

/// Container Storage Interface.
pub mod csi {
    /// CSI v1 (`package csi.v1`).
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1 {
        generated_package!("csi.v1");
    }

    /// CSI v1.12.0 messages (`package csi.v1` as published in spec v1.12.0), for the
    /// `VolumeCondition` generation of drivers and consumers. Messages only.
    #[cfg(feature = "v1-12")]
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1_12 {
        include!(concat!(env!("OUT_DIR"), "/v1_12/csi.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/v1_12/csi.v1.debug.rs"));
    }
}

/// Kubelet plugin registration (`package pluginregistration`, API v1).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pluginregistration {
    generated_package!("pluginregistration");
}

/// Dell CSM resiliency ("podmon") driver extension.
pub mod podmon {
    /// `package podmon.v1`.
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1 {
        generated_package!("podmon.v1");
    }
}

/// Container Object Storage Interface.
pub mod cosi {
    /// COSI v1alpha1 (`package cosi.v1alpha1`).
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1alpha1 {
        generated_package!("cosi.v1alpha1");
    }
}

/// The Kubernetes SnapshotMetadata API (`package snapshotmetadata`, KEP-3314).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod snapshotmetadata {
    generated_package!("snapshotmetadata");
}

/// gRPC's own protocols.
pub mod grpc {
    /// Health checking.
    pub mod health {
        /// `package grpc.health.v1`.
        #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
        pub mod v1 {
            generated_package!("grpc.health.v1");
        }
    }
}

/// Test fixture for the redacting `Debug` generator; not a wire API.
#[doc(hidden)]
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod redaction_fixture {
    generated_package!("redaction_fixture");

    /// Secret-bearing messages of this fixture package (full protobuf names).
    pub const SECRET_BEARING_MESSAGES: &[&str] = include!(concat!(
        env!("OUT_DIR"),
        "/fixture_secret_bearing_messages.rs"
    ));
}

mod redact;

/// Full protobuf names (e.g. `"csi.v1.CreateVolumeRequest"`) of every message that has at least
/// one secret field (marked `csi_secret` or `cosi_secret`, or a `security_token`). Each has a generated, redacting `Debug` impl.
pub const SECRET_BEARING_MESSAGES: &[&str] =
    include!(concat!(env!("OUT_DIR"), "/secret_bearing_messages.rs"));

/// Full protobuf names (e.g. `"csi.v1.CreateVolumeRequest.secrets"`) of every secret field.
pub const SECRET_FIELDS: &[&str] = include!(concat!(env!("OUT_DIR"), "/secret_fields.rs"));

/// Encoded `google.protobuf.FileDescriptorSet` of the CSI, plugin-registration, podmon, COSI,
/// SnapshotMetadata and gRPC health protos
/// and everything they import, without source info. Useful for gRPC reflection or
/// `prost-reflect`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// The CSI spec release of the `csi.v1` protos.
pub const CSI_SPEC_VERSION: &str = "1.13.0";
