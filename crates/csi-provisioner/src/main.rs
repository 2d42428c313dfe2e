use anyhow::Context;
use csi_provisioner::flags::ProvisionerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ProvisionerArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_provisioner::run::run(args, shutdown).await?;
    Ok(())
}
