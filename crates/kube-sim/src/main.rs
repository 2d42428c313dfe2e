use anyhow::Context;
use clap::Parser;
use kube_sim::cli::{Args, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    csi_grpc::logging::init(&args.common);
    let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
    match args.command {
        Command::Serve { port } => kube_sim::cli::serve(port, shutdown).await?,
        Command::Roles(roles) => kube_sim::cli::roles(&roles, shutdown).await?,
        Command::Up(up) => kube_sim::cli::up(&up, shutdown).await?,
    }
    Ok(())
}
