use anyhow::Context;
use csi_resizer::flags::ResizerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ResizerArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_resizer::run::run(args, shutdown).await?;
    Ok(())
}
