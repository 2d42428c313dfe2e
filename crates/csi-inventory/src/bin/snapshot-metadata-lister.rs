//! snapshot-metadata-lister: prints the allocated blocks of a VolumeSnapshot, or the blocks
//! changed since a previous one, from the driver's Kubernetes SnapshotMetadata service.

use std::process::ExitCode;

use csi_inventory::snapshot_metadata::client;
use csi_inventory::snapshot_metadata::flags::ListerArgs;

#[tokio::main]
async fn main() -> ExitCode {
    let args: ListerArgs = csi_grpc::flags::parse();
    match client::run(&args, std::io::stdout().lock()).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error}");
            ExitCode::FAILURE
        }
    }
}
