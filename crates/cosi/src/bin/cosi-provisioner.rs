use anyhow::Context;
use cosi::flags::ProvisionerArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args: ProvisionerArgs = csi_grpc::flags::parse();
    // Upstream's --debug logs every gRPC request and response: our -v=5 does.
    if args.debug {
        args.sidecar.common.verbosity = Some(args.sidecar.common.verbosity.unwrap_or(0).max(5));
    }
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    cosi::run::provisioner(args, shutdown).await?;
    Ok(())
}
