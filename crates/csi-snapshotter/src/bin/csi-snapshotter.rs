use anyhow::Context;
use csi_snapshotter::flags::SnapshotterArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: SnapshotterArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_snapshotter::run::sidecar(args, shutdown).await?;
    Ok(())
}
