use anyhow::Context;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_inventory::flags::{Command, InventoryArgs};
use csi_inventory::run::{self, FINDINGS_EXIT_CODE};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: InventoryArgs = csi_grpc::flags::parse();
    csi_grpc::logging::init(&args.target().common);
    if let Command::Report(report) = &args.command
        && report.serve
    {
        let shutdown = csi_grpc::shutdown::on_signals().context("installing signal handlers")?;
        return Ok(run::serve(report, shutdown).await?);
    }
    let inventory = run::connect(args.target(), CsiOperationMetrics::unregistered()).await?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        Command::Report(report) => {
            if !run::report(&inventory, report, &mut out).await?.is_clean() {
                std::process::exit(FINDINGS_EXIT_CODE);
            }
        }
        Command::Import(import) => inventory.import(import, &mut out).await?,
    }
    Ok(())
}
