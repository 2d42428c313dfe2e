use anyhow::Context;
use csi_snapshotter::flags::SnapshotterArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: SnapshotterArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_snapshotter::run::sidecar(args, shutdown).await?;
    Ok(())
}
