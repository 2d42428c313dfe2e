//! The csi-health-monitor command line: every flag of external-health-monitor-controller v0.18.0
//! with its name and default (upstream-flags/csi-external-health-monitor-controller.tsv, from its
//! `--help`), on top of the shared sidecar flags, whose defaults (`--timeout` 15s,
//! `--worker-threads` 10) are upstream's.

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::flags::SidecarArgs;

/// csi-health-monitor: reports abnormal CSI volumes as Events on their claims.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-health-monitor", version)]
pub struct HealthMonitorArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Resync period of the caches.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync: Duration,

    /// How often a driver that lists volume health (v1.13 LIST_VOLUME_HEALTH, or v1.12
    /// LIST_VOLUMES with VOLUME_CONDITION) is asked for all of it.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub list_volumes_interval: Duration,

    /// How often each volume is checked on its own, with a driver that cannot list (v1.13
    /// GET_VOLUME_HEALTH, or v1.12 GET_VOLUME with VOLUME_CONDITION).
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub monitor_interval: Duration,

    /// Accepted for upstream's command lines: upstream's period of adding volumes to its
    /// per-volume queue. Here the volumes come from the PV cache, kept current by its watch.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub volume_list_add_interval: Duration,

    /// How often every node is judged again by the node watcher (besides its watch).
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub node_list_add_interval: Duration,

    /// Watch nodes: claims used by pods on a failed node get `NodeFailed`, then
    /// `NodeRecovered`.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_node_watcher: bool,
}

impl SidecarCli for HealthMonitorArgs {
    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()?;
        for (flag, interval) in [
            ("--list-volumes-interval", self.list_volumes_interval),
            ("--monitor-interval", self.monitor_interval),
            ("--node-list-add-interval", self.node_list_add_interval),
        ] {
            if interval.is_zero() {
                return Err(format!("{flag} must be greater than zero"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<HealthMonitorArgs, clap::Error> {
        try_parse_from::<HealthMonitorArgs, _, _>(
            std::iter::once("csi-health-monitor").chain(args.iter().copied()),
        )
    }

    /// Every flag in upstream's table is accepted by name, and its default is upstream's.
    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        let command = <HealthMonitorArgs as clap::CommandFactory>::command();
        let table = include_str!("../upstream-flags/csi-external-health-monitor-controller.tsv");
        let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
        assert!(
            missing.is_empty(),
            "upstream flags not accepted: {missing:?}"
        );
        let args = parse(&[]).unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(15));
        assert_eq!(args.sidecar.workers.worker_threads, 10);
        assert_eq!(args.sidecar.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.resync, Duration::from_secs(600));
        assert_eq!(
            (
                args.list_volumes_interval,
                args.monitor_interval,
                args.volume_list_add_interval,
                args.node_list_add_interval
            ),
            (
                Duration::from_secs(300),
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(300)
            )
        );
        assert!(!args.enable_node_watcher);
        assert!(
            parse(&["--enable-node-watcher"])
                .unwrap()
                .enable_node_watcher
        );
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for (args, expected) in [
            (&["--monitor-interval=0s"][..], "--monitor-interval"),
            (&["--list-volumes-interval=soon"][..], "soon"),
            (&["--worker-threads=0"][..], "worker-threads"),
            (&["--enable-node-watcher=maybe"][..], "maybe"),
        ] {
            let error = parse(args).unwrap_err().to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
