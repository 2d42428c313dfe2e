use anyhow::Context;
use podmon::flags::PodmonArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: PodmonArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    podmon::run::run(args, shutdown).await?;
    Ok(())
}
