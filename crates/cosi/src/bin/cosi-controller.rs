use anyhow::Context;
use cosi::flags::ControllerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ControllerArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    cosi::run::controller(args, shutdown).await?;
    Ok(())
}
