use anyhow::Context;
use cosi_s3::serve::{S3Args, serve};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = S3Args::from_env();
    csi_grpc::logging::init(&args.common);
    let endpoint = args.endpoint()?;
    let driver = args.driver()?;
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    serve(driver, &endpoint, shutdown).await?;
    Ok(())
}
