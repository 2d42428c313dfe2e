use anyhow::Context;
use csi_attacher::flags::AttacherArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: AttacherArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.sidecar.common);
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    csi_attacher::run::run(args, shutdown).await?;
    Ok(())
}
