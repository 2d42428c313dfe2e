use anyhow::Context;
use csi_resizer::flags::ResizerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ResizerArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_resizer::run::run(args, shutdown).await?;
    Ok(())
}
