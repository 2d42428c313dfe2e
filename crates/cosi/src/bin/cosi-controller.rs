use anyhow::Context;
use cosi::flags::ControllerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ControllerArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    cosi::run::controller(args, shutdown).await?;
    Ok(())
}
