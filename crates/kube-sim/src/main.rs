use anyhow::Context;
use clap::{Parser, Subcommand};

/// kube-sim: an in-process Kubernetes API server for the CSI suite.
#[derive(Parser, Debug)]
#[command(name = "kube-sim", version)]
struct Args {
    #[command(flatten)]
    common: csi_sidecar::flags::CommonArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the API on 127.0.0.1 until SIGTERM/SIGINT (use: kubectl --server http://127.0.0.1:PORT).
    Serve {
        #[arg(long, default_value = "8080")]
        port: u16,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    csi_sidecar::logging::init(&args.common);
    let Command::Serve { port } = args.command;
    let shutdown = csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
    let server = kube_sim::ApiServer::start_on(&format!("127.0.0.1:{port}"))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    tracing::info!(address = %server.addr, "kube-sim serving; kubectl --server http://{}", server.addr);
    shutdown.cancelled().await;
    server.stop();
    Ok(())
}
