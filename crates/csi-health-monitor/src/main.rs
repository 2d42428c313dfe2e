use anyhow::Context;
use csi_health_monitor::flags::HealthMonitorArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: HealthMonitorArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_health_monitor::run::run(args, shutdown).await?;
    Ok(())
}
