//! The csi-inventory command line. The driver and cluster flags are the sidecars' own
//! (`--csi-address`, `--timeout`, `--kubeconfig`, `-v`, ...), accepted after either command.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use csi_grpc::flags::{CommonArgs, CsiArgs, HttpArgs, SidecarCli};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::flags::KubeArgs;

/// csi-inventory: compares what a CSI driver holds with what the cluster records, and imports
/// pre-existing volumes as PersistentVolumes.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-inventory", version)]
pub struct InventoryArgs {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Lists orphaned, missing, mismatched and abnormal volumes (and snapshots). Exit 0 when
    /// clean, 3 when anything was found.
    Report(ReportArgs),
    /// Creates a PersistentVolume for a volume that exists on the storage.
    Import(ImportArgs),
}

/// Where the driver and the cluster are.
#[derive(Args, Debug, Clone)]
pub struct Target {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub csi: CsiArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// `max_entries` of each ListVolumes / ListSnapshots call; 0 lets the driver choose.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub max_entries: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    #[command(flatten)]
    pub target: Target,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    /// Keep running: scan every --scan-interval and serve the findings as Prometheus gauges
    /// on --http-endpoint (nothing is printed).
    #[arg(long)]
    pub serve: bool,
    /// Time between two scans with --serve (Go duration).
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub scan_interval: Duration,
    #[command(flatten)]
    pub http: HttpArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    #[command(flatten)]
    pub target: Target,
    /// The volume's id at the driver (as ListVolumes gives it).
    #[arg(
        required_unless_present = "all_orphans",
        conflicts_with = "all_orphans"
    )]
    pub volume_id: Option<String>,
    /// Import every orphaned volume (needs --yes).
    #[arg(long)]
    pub all_orphans: bool,
    /// Confirms --all-orphans.
    #[arg(long)]
    pub yes: bool,
    /// The PersistentVolume's name (with --all-orphans: the provisioner's old name when the
    /// volume context has it, else imported-<volume id>).
    #[arg(
        long,
        required_unless_present = "all_orphans",
        conflicts_with = "all_orphans"
    )]
    pub name: Option<String>,
    /// The StorageClass the PV belongs to (its provisioner must be the driver): fsType,
    /// mount options and secret references come from it.
    #[arg(long)]
    pub storage_class: String,
    /// Reserve the PV for this claim (namespace/name).
    #[arg(long, conflicts_with = "all_orphans")]
    pub claim: Option<String>,
    /// Reclaim policy: Retain (the default: an imported volume's data is not deleted unless
    /// asked) or Delete.
    #[arg(long, default_value = "Retain")]
    pub reclaim: String,
    /// Access modes (repeat for several).
    #[arg(long = "access-mode", default_value = "ReadWriteOnce")]
    pub access_modes: Vec<String>,
    /// Filesystem or Block.
    #[arg(long, default_value = "Filesystem")]
    pub volume_mode: String,
    /// The size to record (a quantity, e.g. 10Gi) when the driver reports none.
    #[arg(long)]
    pub capacity: Option<String>,
    /// Print the PV(s) as YAML instead of creating them.
    #[arg(long)]
    pub dry_run: bool,
}

impl InventoryArgs {
    pub fn target(&self) -> &Target {
        match &self.command {
            Command::Report(args) => &args.target,
            Command::Import(args) => &args.target,
        }
    }
}

impl SidecarCli for InventoryArgs {
    fn validate(&self) -> Result<(), String> {
        self.target().common.validate()?;
        match &self.command {
            Command::Report(args) => {
                args.http.validate()?;
                if args.serve
                    && args.http.http_endpoint.is_empty()
                    && args.http.metrics_address.is_empty()
                {
                    return Err("--serve needs --http-endpoint".into());
                }
                if args.serve && args.scan_interval.is_zero() {
                    return Err("--scan-interval must be greater than zero".into());
                }
            }
            Command::Import(args) => {
                if args.all_orphans && !args.yes && !args.dry_run {
                    return Err("--all-orphans creates a PV for every orphaned volume: confirm with --yes (or look first with --dry-run)".into());
                }
                if let Some(capacity) = &args.capacity {
                    csi_kinds::quantity::bytes(capacity).map_err(|e| format!("--capacity: {e}"))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<InventoryArgs, String> {
        csi_grpc::flags::try_parse_from::<InventoryArgs, _, _>(
            std::iter::once("csi-inventory").chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_sidecar_flags_follow_the_command() {
        let args = parse(&[
            "report",
            "--csi-address=unix:///csi/csi.sock",
            "-o",
            "json",
            "--max-entries=2",
            "--kubeconfig=/k",
        ])
        .unwrap();
        let Command::Report(report) = &args.command else {
            panic!()
        };
        assert_eq!(report.output, Output::Json);
        assert_eq!(report.target.csi.csi_address, "unix:///csi/csi.sock");
        assert_eq!(report.target.max_entries, 2);
        assert_eq!(report.target.kube.kubeconfig, "/k");
        assert_eq!(report.scan_interval, Duration::from_secs(600));
    }

    #[test]
    fn bad_combinations_are_usage_errors() {
        for (args, message) in [
            (&["report", "--serve"][..], "--serve needs --http-endpoint"),
            (
                &["import", "--all-orphans", "--storage-class=c"][..],
                "confirm with --yes",
            ),
            (&["import", "vol", "--storage-class=c"][..], "--name"),
            (
                &[
                    "import",
                    "vol",
                    "--name=p",
                    "--storage-class=c",
                    "--capacity=lots",
                ][..],
                "--capacity",
            ),
            (&["report", "--max-entries=-1"][..], "-1"),
        ] {
            let error = parse(args).expect_err(message);
            assert!(error.contains(message), "{args:?}: {error}");
        }
        let args = parse(&[
            "import",
            "vol-1",
            "--name=p",
            "--storage-class=c",
            "--access-mode=ReadWriteOnce",
            "--access-mode=ReadOnlyMany",
        ])
        .unwrap();
        let Command::Import(import) = &args.command else {
            panic!()
        };
        assert_eq!(import.access_modes, ["ReadWriteOnce", "ReadOnlyMany"]);
        assert_eq!(import.reclaim, "Retain");
        assert!(parse(&["import", "--all-orphans", "--storage-class=c", "--yes"]).is_ok());
    }
}
