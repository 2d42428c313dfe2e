use anyhow::Context;
use csi_node_driver_registrar::flags::RegistrarArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: RegistrarArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_node_driver_registrar::registrar::run(args, shutdown).await?;
    Ok(())
}
