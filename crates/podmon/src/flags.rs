//! The podmon command line: Dell's flags with Dell's names (case-sensitive, Go-style
//! `-flag=value` accepted) and defaults where they make sense for any CSI driver, plus the
//! shared sidecar set (`--kubeconfig`, `--http-endpoint`, `--leader-election-*`, …) and ours.
//!
//! Deviations, for a generic driver: `--labelvalue` and `--driverPath` default to the driver's
//! own name (GetPluginInfo) instead of Dell's `csi-vxflexos`; `--driver-config-params` may be
//! empty (no dynamic configuration).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use csi_grpc::flags::{SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::flags::SidecarArgs;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In the controller Deployment: cleans up pods of failed nodes (leader-elected).
    Controller,
    /// In the node DaemonSet: cleans the zombies' mounts and removes the taint.
    Node,
    /// The controller's pod handling only (no connectivity polling, no driver-pod watch).
    Standalone,
}

/// podmon: resiliency for stateful pods on failed nodes.
#[derive(Parser, Debug, Clone)]
#[command(name = "podmon", version)]
pub struct PodmonArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    #[arg(long, value_enum, default_value = "controller")]
    pub mode: Mode,

    /// The driver's CSI endpoint (Dell's name; overrides --csi-address when set).
    #[arg(long, default_value = "")]
    pub csisock: String,

    /// Lease-based leader election (controller mode; node mode never elects).
    #[arg(long = "leaderelection", action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "true", default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub leaderelection: bool,

    /// Label key of the protected pods.
    #[arg(long = "labelkey", default_value = "podmon.dellemc.com/driver")]
    pub label_key: String,

    /// Label value of the protected pods (empty: the driver name).
    #[arg(long = "labelvalue", default_value = "")]
    pub label_value: String,

    /// The CSI driver name (Dell's name for it; empty: asked from the driver).
    #[arg(long = "driverPath", default_value = "")]
    pub driver_path: String,

    /// The CSI driver name (wins over --driverPath).
    #[arg(long = "driver-name", default_value = "")]
    pub driver_name: String,

    /// Seconds between connectivity samples of the nodes hosting protected pods.
    #[arg(long = "arrayConnectivityPollRate", default_value = "15")]
    pub array_connectivity_poll_rate: u64,

    /// Consecutive "not connected" samples before a node counts as disconnected.
    #[arg(long = "arrayConnectivityConnectionLossThreshold", default_value = "3")]
    pub array_connectivity_connection_loss_threshold: u32,

    /// With the unreachable NoExecute taint, clean up even when the driver reports the node
    /// connected, I/O in progress, or an error.
    #[arg(long = "skipArrayConnectionValidation", action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub skip_array_connection_validation: bool,

    /// The driver ConfigMap's file (PODMON_* keys), re-read when it changes; empty: none.
    #[arg(long = "driver-config-params", default_value = "")]
    pub driver_config_params: String,

    /// Label key of the driver's node pods (a node whose driver pod is not Ready gets the
    /// driver-offline taint).
    #[arg(long = "driverPodLabelKey", default_value = "driver.dellemc.com")]
    pub driver_pod_label_key: String,

    #[arg(long = "driverPodLabelValue", default_value = "dell-storage")]
    pub driver_pod_label_value: String,

    /// Never track or clean protected pods without bound claims.
    #[arg(long = "ignoreVolumelessPods", action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub ignore_volumeless_pods: bool,

    /// This node's name (node mode).
    #[arg(long, env = "KUBE_NODE_NAME", default_value = "")]
    pub node_name: String,

    /// kubelet's root directory as this container sees it (node mode).
    #[arg(
        long,
        env = "X_CSI_PRIVATE_MOUNT_DIR",
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_dir: PathBuf,

    /// Where node mode keeps its inventory of protected pods (empty:
    /// `<kubelet-dir>/plugins/<driver>/podmon-node-state.json`).
    #[arg(long, default_value = "")]
    pub state_file: String,

    /// How often node mode checks its Node for the taint.
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    pub node_poll_interval: Duration,

    /// Circuit breaker: at most this fraction of the nodes running the driver is evacuated at once
    /// (at least one).
    #[arg(long, default_value = "0.3333", value_parser = parse_fraction)]
    pub max_evacuated_fraction: f64,

    /// After fencing, also add `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// (non-graceful node shutdown); node mode removes it with our taint.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub out_of_service_taint: bool,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("{text} is not in (0, 1]"))
    }
}

impl PodmonArgs {
    /// The endpoint to dial: `--csisock`, else `--csi-address`.
    pub fn csi_address(&self) -> &str {
        if self.csisock.is_empty() {
            &self.sidecar.csi.csi_address
        } else {
            &self.csisock
        }
    }

    /// The driver name given on the command line, if any.
    pub fn configured_driver_name(&self) -> Option<&str> {
        [&self.driver_name, &self.driver_path]
            .into_iter()
            .find(|n| !n.is_empty())
            .map(String::as_str)
    }

    /// Whether this process runs under leader election: controller modes only, with
    /// `--leaderelection` (Dell's, default on) or `--leader-election`.
    pub fn elects(&self) -> bool {
        self.mode != Mode::Node
            && (self.leaderelection || self.sidecar.leader_election.leader_election)
    }
}

impl SidecarCli for PodmonArgs {
    fn validate(&self) -> Result<(), String> {
        csi_grpc::conn::Endpoint::parse(self.csi_address()).map_err(|e| e.to_string())?;
        self.sidecar.http.validate()?;
        self.sidecar.workers.validate()?;
        if self.array_connectivity_poll_rate == 0 {
            return Err("--arrayConnectivityPollRate must be greater than zero".into());
        }
        if self.array_connectivity_connection_loss_threshold == 0 {
            return Err(
                "--arrayConnectivityConnectionLossThreshold must be greater than zero".into(),
            );
        }
        if self.label_key.is_empty() {
            return Err("--labelkey must not be empty".into());
        }
        if self.mode == Mode::Node && self.node_name.is_empty() {
            return Err("node mode needs the node's name: KUBE_NODE_NAME or --node-name".into());
        }
        if self.node_poll_interval.is_zero() {
            return Err("--node-poll-interval must be greater than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<PodmonArgs, clap::Error> {
        try_parse_from::<PodmonArgs, _, _>(std::iter::once("podmon").chain(args.iter().copied()))
    }

    #[test]
    fn dells_flags_with_dells_defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.mode, Mode::Controller);
        assert!(args.leaderelection && args.elects());
        assert_eq!(args.label_key, "podmon.dellemc.com/driver");
        assert_eq!(args.array_connectivity_poll_rate, 15);
        assert_eq!(args.array_connectivity_connection_loss_threshold, 3);
        assert!(!args.skip_array_connection_validation && !args.ignore_volumeless_pods);
        assert_eq!(
            (
                args.driver_pod_label_key.as_str(),
                args.driver_pod_label_value.as_str()
            ),
            ("driver.dellemc.com", "dell-storage")
        );
        assert_eq!(args.node_poll_interval, Duration::from_secs(30));
        assert!((args.max_evacuated_fraction - 0.3333).abs() < 1e-9);
        assert!(!args.out_of_service_taint);
        assert_eq!(args.configured_driver_name(), None);
    }

    #[test]
    fn a_dell_controller_command_line_parses() {
        let args = parse(&[
            "--csisock=unix:/var/run/csi/csi.sock",
            "--labelvalue=csi-powerstore",
            "--arrayConnectivityPollRate=60",
            "--driverPath=csi-powerstore.dellemc.com",
            "--mode=controller",
            "--skipArrayConnectionValidation=false",
            "--driver-config-params=/powerstore-config-params/driver-config-params.yaml",
            "--driverPodLabelValue=dell-storage",
            "--ignoreVolumelessPods=false",
            "-leaderelection=true",
        ])
        .unwrap();
        assert_eq!(args.csi_address(), "unix:/var/run/csi/csi.sock");
        assert_eq!(
            args.configured_driver_name(),
            Some("csi-powerstore.dellemc.com")
        );
        assert_eq!(args.array_connectivity_poll_rate, 60);
        assert!(args.elects());
    }

    #[test]
    fn node_mode_needs_a_node_name_and_never_elects() {
        let error = parse(&["--mode=node"]).unwrap_err().to_string();
        assert!(error.contains("KUBE_NODE_NAME"), "{error}");
        let args = parse(&["--mode=node", "--node-name=n1", "--leaderelection=true"]).unwrap();
        assert!(!args.elects());
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for (args, expected) in [
            (&["--mode=standby"][..], "standby"),
            (&["--arrayConnectivityPollRate=0"][..], "PollRate"),
            (
                &["--arrayConnectivityConnectionLossThreshold=0"][..],
                "Threshold",
            ),
            (&["--max-evacuated-fraction=1.5"][..], "not in (0, 1]"),
            (&["--skipArrayConnectionValidation=maybe"][..], "maybe"),
            (&["--labelKey=x"][..], "labelKey"),
        ] {
            let error = parse(args).unwrap_err().to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
