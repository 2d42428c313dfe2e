use anyhow::Context;
use csi_attacher::flags::AttacherArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: AttacherArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.sidecar.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    csi_attacher::run::run(args, shutdown).await?;
    Ok(())
}
