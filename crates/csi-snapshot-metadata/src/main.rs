use anyhow::Context;
use csi_snapshot_metadata::flags::SnapshotMetadataArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: SnapshotMetadataArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.common);
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "csi-snapshot-metadata");
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_snapshot_metadata::run::run(args, shutdown, None).await?;
    Ok(())
}
