//! snapshot-metadata-lister: a backup application's client of the Kubernetes SnapshotMetadata
//! API (changed block tracking), as upstream's tool and iterator (tools/snapshot-metadata-lister,
//! pkg/iterator): the VolumeSnapshot's content names the driver, the driver's
//! SnapshotMetadataService object says where its service listens, which audience a token must
//! be for and which CA to trust; a TokenRequest makes that token for a ServiceAccount; the
//! allocated or changed blocks stream back over TLS.
//!
//! `flags` (the command line), `resolve` (names to handles, pure), `emit` (table and JSON,
//! pure), `client` (the API server and the gRPC service; [`client::MetadataStream`] is the
//! iterator a backup program reads blocks from).

pub mod client;
pub mod emit;
pub mod flags;
pub mod resolve;
