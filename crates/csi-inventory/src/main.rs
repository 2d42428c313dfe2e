use anyhow::Context;
use csi_inventory::flags::{Command, InventoryArgs};
use csi_inventory::run::{self, FINDINGS_EXIT_CODE};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: InventoryArgs = csi_sidecar::flags::parse();
    csi_sidecar::logging::init(&args.target().common);
    let inventory = run::connect(args.target()).await?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        Command::Report(report) if report.serve => {
            let shutdown =
                csi_sidecar::shutdown::on_signals().context("installing signal handlers")?;
            run::serve(inventory, report, shutdown).await?;
        }
        Command::Report(report) => {
            if !run::report(&inventory, report, &mut out).await?.is_clean() {
                std::process::exit(FINDINGS_EXIT_CODE);
            }
        }
        Command::Import(import) => inventory.import(import, &mut out).await?,
    }
    Ok(())
}
