use anyhow::Context;
use csi_node_driver_registrar::flags::RegistrarArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: RegistrarArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_node_driver_registrar::registrar::run(args, shutdown).await?;
    Ok(())
}
