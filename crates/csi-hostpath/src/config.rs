//! Flags of `csi-hostpath` and the configuration derived from them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::{ArgAction, Parser, ValueEnum};
use csi_grpc::conn::Endpoint;
use csi_grpc::flags::{CommonArgs, SidecarCli, parse_go_bool};

use crate::health::HealthApi;

/// Our driver name: reverse-domain, so it never collides with upstream's hostpath driver.
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi-suite.io";

/// Which CSI services this instance serves (Identity always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Controller,
    Node,
    Both,
}

impl Mode {
    pub fn controller(self) -> bool {
        matches!(self, Self::Controller | Self::Both)
    }
    pub fn node(self) -> bool {
        matches!(self, Self::Node | Self::Both)
    }
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "csi-hostpath",
    version,
    about = "Reference CSI driver on a local state directory"
)]
pub struct DriverArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// CSI endpoint to serve: unix:///abs/path or /abs/path.
    #[arg(long, default_value = "unix:///tmp/csi.sock")]
    pub endpoint: String,

    /// Services to serve besides Identity.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: Mode,

    /// This instance's node ID (the simulated node it runs on).
    #[arg(long)]
    pub nodeid: String,

    /// Driver name reported by GetPluginInfo.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub drivername: String,

    /// State directory, shared by every instance on this machine: volume data, snapshots,
    /// the state file (state.log) and node heartbeats.
    #[arg(long, default_value = "/csi-data-dir")]
    pub statedir: PathBuf,

    /// Capacity per node: `<quantity>` for the default pool or `<kind>=<quantity>` for a
    /// named pool (StorageClass parameter `kind`); repeatable. Unset: the free space of the
    /// state directory's filesystem.
    #[arg(long = "capacity", value_parser = parse_capacity)]
    pub capacity: Vec<(String, u64)>,

    /// Largest volume CreateVolume and expansion accept.
    #[arg(long, default_value = "1Ti", value_parser = parse_quantity)]
    pub max_volume_size: u64,

    /// Maximum volumes published to one node (NodeGetInfo and ControllerPublishVolume); 0 is
    /// unlimited.
    #[arg(long, default_value = "0")]
    pub max_volumes_per_node: i64,

    /// Advertise PUBLISH_UNPUBLISH_VOLUME and PUBLISH_READONLY (and fence unpublished nodes).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_attach: bool,

    /// Serve the podmon connectivity extension (`podmon.v1.Podmon`) besides CSI.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_podmon_extension: bool,

    /// Serve the CSI SnapshotMetadata service (GetMetadataAllocated, GetMetadataDelta) and
    /// advertise SNAPSHOT_METADATA_SERVICE, on controller instances. On by default, unlike
    /// upstream's hostpath driver: the reference driver serves what it implements, and nothing
    /// but external-snapshot-metadata acts on the capability.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_snapshot_metadata: bool,

    /// Mutable parameter names CreateVolume and ControllerModifyVolume accept (comma-separated);
    /// any other name is INVALID_ARGUMENT, as with upstream's hostpath driver. None by default.
    #[arg(long, value_delimiter = ',')]
    pub accepted_mutable_parameter_names: Vec<String>,

    /// Roots under which staging and target paths must lie (comma-separated). Not `/tmp` by
    /// default: anyone may make symlinks and directories there.
    #[arg(long, value_delimiter = ',', default_value = "/var/lib/kubelet")]
    pub allowed_path_roots: Vec<PathBuf>,

    /// The volume health API to advertise and serve: `v1.13` (the health RPCs), `v1.12` (the
    /// VOLUME_CONDITION capability and `volume_condition` fields of CSI v1.0-v1.12, as older
    /// consumers such as external-health-monitor v0.18 need) or `both`.
    #[arg(long, value_enum, default_value = "v1.13")]
    pub volume_health: HealthApi,
}

impl SidecarCli for DriverArgs {
    fn validate(&self) -> Result<(), String> {
        Endpoint::parse(&self.endpoint).map_err(|e| e.to_string())?;
        if self.nodeid.trim().is_empty()
            || self.nodeid.contains('/')
            || self.nodeid.starts_with('.')
        {
            return Err("--nodeid must be non-empty, without '/' and not start with '.'".into());
        }
        if self.drivername.is_empty() || self.drivername.len() > 63 {
            return Err("--drivername must be 1 to 63 characters".into());
        }
        if !self.statedir.is_absolute() {
            return Err("--statedir must be an absolute path".into());
        }
        if let Some(root) = self.allowed_path_roots.iter().find(|r| !r.is_absolute()) {
            return Err(format!(
                "--allowed-path-roots: {} is not absolute",
                root.display()
            ));
        }
        let mut kinds = BTreeSet::new();
        if let Some((kind, _)) = self.capacity.iter().find(|(kind, _)| !kinds.insert(kind)) {
            return Err(format!("--capacity given twice for pool {kind:?}"));
        }
        Ok(())
    }
}

/// The driver's settled configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_name: String,
    pub node_id: String,
    pub mode: Mode,
    pub state_dir: PathBuf,
    /// Per-node capacity by pool kind; empty: the filesystem's free space.
    pub capacity: BTreeMap<String, u64>,
    pub max_volume_size: u64,
    pub max_volumes_per_node: i64,
    pub enable_attach: bool,
    pub podmon_extension: bool,
    /// The SnapshotMetadata service (controller instances).
    pub snapshot_metadata: bool,
    pub accepted_mutable_parameters: BTreeSet<String>,
    pub allowed_path_roots: Vec<PathBuf>,
    pub volume_health: HealthApi,
    pub vendor_version: String,
}

impl Config {
    pub fn from_args(args: &DriverArgs) -> Self {
        Self {
            driver_name: args.drivername.clone(),
            node_id: args.nodeid.clone(),
            mode: args.mode,
            state_dir: args.statedir.clone(),
            capacity: args.capacity.iter().cloned().collect(),
            max_volume_size: args.max_volume_size,
            max_volumes_per_node: args.max_volumes_per_node,
            enable_attach: args.enable_attach,
            podmon_extension: args.enable_podmon_extension,
            snapshot_metadata: args.enable_snapshot_metadata,
            accepted_mutable_parameters: args
                .accepted_mutable_parameter_names
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            allowed_path_roots: args.allowed_path_roots.clone(),
            volume_health: args.volume_health,
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The topology key of this driver: `topology.<drivername>/node`.
    pub fn topology_key(&self) -> String {
        format!("topology.{}/node", self.driver_name)
    }
}

/// Parses a Kubernetes quantity of bytes: `1073741824`, `10Gi`, `500M`, `1.5Ti`.
pub fn parse_quantity(input: &str) -> Result<u64, String> {
    let bytes = csi_kinds::quantity::parse(input).ok_or_else(|| {
        format!("invalid quantity {input:?}: expected a number with an optional suffix like Gi")
    })?;
    u64::try_from(bytes).map_err(|_| format!("invalid quantity {input:?}: out of range"))
}

/// `--capacity` values: `<quantity>` or `<kind>=<quantity>`.
pub fn parse_capacity(input: &str) -> Result<(String, u64), String> {
    match input.split_once('=') {
        Some((kind, quantity)) => Ok((kind.trim().to_string(), parse_quantity(quantity)?)),
        None => Ok((String::new(), parse_quantity(input)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let table = [
            ("1024", 1024),
            ("1Ki", 1024),
            ("10Gi", 10 << 30),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("1Ti", 1 << 40),
        ];
        for (input, want) in table {
            assert_eq!(parse_quantity(input), Ok(want), "{input}");
        }
        for bad in ["", "Gi", "10XB", "-1Gi", "ten"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn capacity_pools() {
        assert_eq!(parse_capacity("10Gi"), Ok((String::new(), 10 << 30)));
        assert_eq!(parse_capacity("fast=1Gi"), Ok(("fast".into(), 1 << 30)));
        assert!(parse_capacity("fast=lots").is_err());
    }

    fn parse(args: &[&str]) -> Result<DriverArgs, clap::Error> {
        csi_grpc::flags::try_parse_from::<DriverArgs, _, _>(
            std::iter::once("csi-hostpath").chain(args.iter().copied()),
        )
    }

    #[test]
    fn flags_and_defaults() {
        let args = parse(&["--nodeid=n1"]).unwrap();
        assert_eq!(args.endpoint, "unix:///tmp/csi.sock");
        assert_eq!(args.mode, Mode::Both);
        assert_eq!(args.drivername, DEFAULT_DRIVER_NAME);
        assert!(args.enable_attach);
        assert!(args.enable_snapshot_metadata);
        assert_eq!(args.max_volume_size, 1 << 40);
        assert_eq!(args.max_volumes_per_node, 0);
        assert_eq!(args.volume_health, HealthApi::V1_13);
        let args = parse(&[
            "--nodeid=n1",
            "--mode=node",
            "--enable-attach=false",
            "--capacity=fast=1Gi",
            "--capacity=2Gi",
            "--accepted-mutable-parameter-names=iops,throughput",
            "--volume-health=v1.12",
            "--enable-snapshot-metadata=false",
        ])
        .unwrap();
        let config = Config::from_args(&args);
        assert_eq!(config.mode, Mode::Node);
        assert!(!config.enable_attach);
        assert!(!config.snapshot_metadata);
        assert_eq!(config.capacity.get("fast"), Some(&(1 << 30)));
        assert_eq!(config.capacity.get(""), Some(&(2 << 30)));
        assert_eq!(config.accepted_mutable_parameters.len(), 2);
        assert_eq!(config.volume_health, HealthApi::V1_12);
        assert_eq!(config.topology_key(), "topology.hostpath.csi-suite.io/node");
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for argv in [
            &[][..],
            &["--nodeid="][..],
            &["--nodeid=a/b"][..],
            &["--nodeid=n", "--endpoint=tcp://x:1"][..],
            &["--nodeid=n", "--statedir=relative"][..],
            &["--nodeid=n", "--capacity=1Gi", "--capacity=2Gi"][..],
            &["--nodeid=n", "--mode=everything"][..],
            &["--nodeid=n", "--volume-health=v2"][..],
        ] {
            assert_eq!(parse(argv).unwrap_err().exit_code(), 2, "{argv:?}");
        }
    }
}
