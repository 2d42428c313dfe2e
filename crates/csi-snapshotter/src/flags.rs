//! The command lines of csi-snapshotter and snapshot-controller: every flag of upstream's
//! binaries with its name and default (`upstream-flags/*.tsv`, from their `--help`), on top of
//! the shared sidecar flags. csi-snapshotter's `--timeout` is 1m; both resync every 15m.

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{DefaultOverrides, SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::feature_gates::{FeatureGate, ResolvedGates, Stage};
use csi_sidecar::flags::SidecarArgs;
use csi_sidecar::leader::RELEASE_ON_EXIT_GATE;

/// GA, default on: volume group snapshots. With it and the groupsnapshot.storage.k8s.io API
/// served, snapshot-controller binds groups to contents and makes their member snapshots, and
/// csi-snapshotter cuts, imports and deletes the driver's groups; without the API both run
/// without groups and say so. Off: group objects are left alone.
pub const VOLUME_GROUP_SNAPSHOT: FeatureGate =
    FeatureGate::new("CSIVolumeGroupSnapshot", true, Stage::Ga, false);

/// external-snapshotter's own gates (pkg/features), the same in both binaries.
pub const GATES: &[FeatureGate] = &[VOLUME_GROUP_SNAPSHOT, RELEASE_ON_EXIT_GATE];

/// csi-snapshotter: cuts and deletes the snapshots of one CSI driver for its
/// VolumeSnapshotContents.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-snapshotter", version)]
pub struct SnapshotterArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Resync period of the caches: every content is synced again this often.
    #[arg(long, default_value = "15m", value_parser = parse_go_duration)]
    pub resync_period: Duration,

    /// Prefix of the CSI snapshot name (`<prefix>-<VolumeSnapshot UID>`).
    #[arg(long, default_value = "snapshot")]
    pub snapshot_name_prefix: String,

    /// Characters of the UID (without dashes) in the snapshot name; -1 keeps the whole UID.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub snapshot_name_uuid_length: i64,

    /// Pass the VolumeSnapshot's and content's names to CreateSnapshot as parameters
    /// (`csi.storage.k8s.io/volumesnapshot/name`, ...).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// Prefix of the CSI group snapshot name (`<prefix>-<VolumeGroupSnapshot UID>`).
    #[arg(long = "groupsnapshot-name-prefix", default_value = "groupsnapshot")]
    pub group_snapshot_name_prefix: String,

    /// Characters of the group's UID (without dashes) in the group snapshot name; -1 keeps the
    /// whole UID.
    #[arg(
        long = "groupsnapshot-name-uuid-length",
        default_value = "-1",
        allow_hyphen_values = true
    )]
    pub group_snapshot_name_uuid_length: i64,

    /// Run on each node next to a node-local driver and handle only the contents the
    /// snapshot-controller labelled with this node (`NODE_NAME`): distributed snapshotting.
    /// Excludes `--leader-election`.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment: bool,
}

/// snapshot-controller: binds VolumeSnapshots to VolumeSnapshotContents, cluster-wide.
#[derive(Parser, Debug, Clone)]
#[command(name = "snapshot-controller", version)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Resync period of the caches: every snapshot and content is synced again this often.
    #[arg(long, default_value = "15m", value_parser = parse_go_duration)]
    pub resync_period: Duration,

    /// Record the source volume's mode on dynamic contents, so a restore cannot change it
    /// without the content's `snapshot.storage.kubernetes.io/allow-volume-mode-change`.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prevent_volume_mode_conversion: bool,

    /// Label each new content of a node-local volume with the volume's node (watching the
    /// Nodes), for the csi-snapshotters run with `--node-deployment`: distributed snapshotting.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_distributed_snapshotting: bool,

    /// How long, at most, between checks that the snapshot CRDs are served at startup.
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    pub retry_crd_interval_max: Duration,
}

fn gates(sidecar: &SidecarArgs) -> Result<ResolvedGates, String> {
    csi_sidecar::feature_gates::resolve_gates(&sidecar.feature_gates(), GATES)
}

/// A `--node-deployment` csi-snapshotter that cannot start (exit 1, as upstream).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeDeploymentError {
    #[error("Leader election cannot happen when node-deployment is set to true")]
    LeaderElection,
    #[error("The NODE_NAME environment variable must be set when using --enable-node-deployment.")]
    MissingNodeName,
}

impl SnapshotterArgs {
    pub fn gates(&self) -> Result<ResolvedGates, String> {
        gates(&self.sidecar)
    }

    /// With `--node-deployment`, the node whose contents this instance handles: `node_name`,
    /// the value of [`crate::distributed::NODE_NAME_ENV`]; without it, `None` (every content).
    pub fn deployment_node(
        &self,
        node_name: Option<&str>,
    ) -> Result<Option<String>, NodeDeploymentError> {
        if !self.node_deployment {
            return Ok(None);
        }
        if self.sidecar.leader_election.leader_election {
            return Err(NodeDeploymentError::LeaderElection);
        }
        match node_name {
            Some(node) if !node.is_empty() => Ok(Some(node.to_string())),
            _ => Err(NodeDeploymentError::MissingNodeName),
        }
    }
}

impl ControllerArgs {
    pub fn gates(&self) -> Result<ResolvedGates, String> {
        gates(&self.sidecar)
    }
}

impl SidecarCli for SnapshotterArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "1m")];

    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()?;
        if self.snapshot_name_uuid_length < -1 || self.snapshot_name_uuid_length == 0 {
            return Err(format!(
                "--snapshot-name-uuid-length must be -1 or positive, not {}",
                self.snapshot_name_uuid_length
            ));
        }
        self.gates().map(drop)
    }
}

impl SidecarCli for ControllerArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[];

    fn validate(&self) -> Result<(), String> {
        self.sidecar.common.validate()?;
        self.sidecar.http.validate()?;
        self.sidecar.workers.validate()?;
        self.gates().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn snapshotter(args: &[&str]) -> Result<SnapshotterArgs, clap::Error> {
        try_parse_from::<SnapshotterArgs, _, _>(
            std::iter::once("csi-snapshotter").chain(args.iter().copied()),
        )
    }

    fn controller(args: &[&str]) -> Result<ControllerArgs, clap::Error> {
        try_parse_from::<ControllerArgs, _, _>(
            std::iter::once("snapshot-controller").chain(args.iter().copied()),
        )
    }

    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        for (command, table) in [
            (
                <SnapshotterArgs as clap::CommandFactory>::command(),
                include_str!("../upstream-flags/csi-snapshotter.tsv"),
            ),
            (
                <ControllerArgs as clap::CommandFactory>::command(),
                include_str!("../upstream-flags/snapshot-controller.tsv"),
            ),
        ] {
            let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
            assert!(
                missing.is_empty(),
                "{}: not accepted: {missing:?}",
                command.get_name()
            );
        }
        let args = snapshotter(&[]).unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(60));
        assert_eq!(args.sidecar.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.sidecar.workers.worker_threads, 10);
        assert_eq!(args.resync_period, Duration::from_secs(900));
        assert_eq!(
            (
                args.snapshot_name_prefix.as_str(),
                args.snapshot_name_uuid_length
            ),
            ("snapshot", -1)
        );
        assert!(!args.extra_create_metadata && !args.node_deployment);
        assert!(args.gates().unwrap().get(VOLUME_GROUP_SNAPSHOT));
        let args = controller(&[]).unwrap();
        assert!(args.prevent_volume_mode_conversion && !args.enable_distributed_snapshotting);
        assert_eq!(args.retry_crd_interval_max, Duration::from_secs(30));
        assert_eq!(args.resync_period, Duration::from_secs(900));
        assert_eq!(args.sidecar.workers.worker_threads, 10);
    }

    #[test]
    fn values_are_parsed_as_upstream() {
        let args = snapshotter(&[
            "--snapshot-name-prefix=snap",
            "--snapshot-name-uuid-length=8",
            "--extra-create-metadata",
            "--timeout=30s",
        ])
        .unwrap();
        assert_eq!(args.snapshot_name_prefix, "snap");
        assert_eq!(args.snapshot_name_uuid_length, 8);
        assert!(args.extra_create_metadata);
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(30));
        let args = controller(&["--prevent-volume-mode-conversion=false"]).unwrap();
        assert!(!args.prevent_volume_mode_conversion);
    }

    #[test]
    fn distributed_snapshotting_is_accepted_and_a_node_deployment_needs_its_node() {
        let args = controller(&["--enable-distributed-snapshotting"]).unwrap();
        assert!(args.enable_distributed_snapshotting);
        for (flags, node, expected) in [
            (&[][..], Some("node-a"), Ok(None)),
            (
                &["--node-deployment"][..],
                Some("node-a"),
                Ok(Some("node-a".to_string())),
            ),
            (
                &["--node-deployment=true"][..],
                Some(""),
                Err(NodeDeploymentError::MissingNodeName),
            ),
            (
                &["--node-deployment"][..],
                None,
                Err(NodeDeploymentError::MissingNodeName),
            ),
            (
                &["--node-deployment", "--leader-election"][..],
                Some("node-a"),
                Err(NodeDeploymentError::LeaderElection),
            ),
        ] {
            let args = snapshotter(flags).unwrap();
            assert_eq!(args.deployment_node(node), expected, "{flags:?} {node:?}");
        }
        assert_eq!(
            NodeDeploymentError::MissingNodeName.to_string(),
            "The NODE_NAME environment variable must be set when using --enable-node-deployment."
        );
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for (args, expected) in [
            (
                &["--snapshot-name-uuid-length=0"][..],
                "must be -1 or positive",
            ),
            (
                &["--feature-gates=Topology=true"][..],
                "unrecognized feature gate: Topology",
            ),
        ] {
            let error = snapshotter(args).unwrap_err().to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
