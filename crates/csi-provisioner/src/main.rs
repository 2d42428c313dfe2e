use anyhow::Context;
use csi_provisioner::flags::ProvisionerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: ProvisionerArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_provisioner::run::run(args, shutdown).await?;
    Ok(())
}
