use anyhow::Context;
use csi_grpc::conn::Endpoint;
use csi_hostpath::config::{Config, DriverArgs};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: DriverArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.common);
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_hostpath::server::run(Config::from_args(&args), endpoint, shutdown)
        .await
        .context("csi-hostpath failed")
}
