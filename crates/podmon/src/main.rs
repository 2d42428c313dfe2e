use anyhow::Context;
use podmon::flags::PodmonArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: PodmonArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    podmon::run::run(args, shutdown).await?;
    Ok(())
}
