use anyhow::Context;
use csi_hostpath::config::{Config, DriverArgs};
use csi_sidecar::conn::Endpoint;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: DriverArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.common);
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_hostpath::server::run(Config::from_args(&args), endpoint, shutdown)
        .await
        .context("csi-hostpath failed")
}
