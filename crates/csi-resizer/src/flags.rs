//! The csi-resizer command line: every flag of external-resizer with its name and default
//! (upstream-flags/csi-resizer.tsv, from its `--help`), on top of the shared sidecar flags.
//! Upstream names the worker count `--workers` (default 10) and has no `--worker-threads`, so
//! the shared worker flag is renamed here; its `--timeout` is 10s.

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{DefaultOverrides, SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::feature_gates::{FeatureGate, ResolvedGates, Stage};
use csi_sidecar::flags::SidecarArgs;
use csi_sidecar::leader::RELEASE_ON_EXIT_GATE;

/// Beta, default on: a PV expanded on the controller that still needs node expansion keeps
/// its claim's old capacity in `volume.alpha.kubernetes.io/pre-resize-capacity`.
pub const ANNOTATE_FS_RESIZE: FeatureGate =
    FeatureGate::new("AnnotateFsResize", true, Stage::Beta, false);
/// GA, default on, not locked: `status.allocatedResources` / `allocatedResourceStatuses` and
/// retrying a smaller size after a failed expansion.
pub const RECOVER_VOLUME_EXPANSION_FAILURE: FeatureGate =
    FeatureGate::new("RecoverVolumeExpansionFailure", true, Stage::Ga, false);
/// GA, default on: ControllerModifyVolume for VolumeAttributesClass changes.
pub const VOLUME_ATTRIBUTES_CLASS: FeatureGate =
    FeatureGate::new("VolumeAttributesClass", true, Stage::Ga, false);

/// external-resizer's own gates (pkg/features).
pub const GATES: &[FeatureGate] = &[
    ANNOTATE_FS_RESIZE,
    RECOVER_VOLUME_EXPANSION_FAILURE,
    VOLUME_ATTRIBUTES_CLASS,
    RELEASE_ON_EXIT_GATE,
];

/// csi-resizer: expands CSI volumes when their PersistentVolumeClaims ask for more.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-resizer", version)]
#[command(mut_arg("worker_threads", |arg| arg.long("workers")))]
pub struct ResizerArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Resync period of the caches: every claim is synced again this often.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync_period: Duration,

    /// Keep a claim whose driver answered FailedPrecondition (no online expansion) from being
    /// expanded again while a pod uses it; needs to watch pods.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub handle_volume_inuse_error: bool,

    /// Add the claim's name and namespace and the PV's name to ControllerModifyVolume's
    /// mutable parameters (`csi.storage.k8s.io/pvc/name`, ...).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub extra_modify_metadata: bool,

    /// The API server address (deprecated upstream; use --kubeconfig). A non-empty value
    /// overrides the kubeconfig's server.
    #[arg(long, default_value = "")]
    pub master: String,
}

impl ResizerArgs {
    /// `--feature-gates` against upstream's table, as component-base resolves them. Pure.
    pub fn gates(&self) -> Result<ResolvedGates, String> {
        csi_sidecar::feature_gates::resolve_gates(&self.sidecar.feature_gates(), GATES)
    }
}

impl SidecarCli for ResizerArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "10s")];

    fn validate(&self) -> Result<(), String> {
        if self.sidecar.workers.worker_threads == 0 {
            return Err("--workers must be greater than zero".to_string());
        }
        self.sidecar.validate()?;
        self.gates().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<ResizerArgs, clap::Error> {
        try_parse_from::<ResizerArgs, _, _>(
            std::iter::once("csi-resizer").chain(args.iter().copied()),
        )
    }

    /// Every flag in upstream's table is accepted by name, and its default is upstream's.
    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        let command = <ResizerArgs as clap::CommandFactory>::command();
        let table = include_str!("../upstream-flags/csi-resizer.tsv");
        let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
        assert!(
            missing.is_empty(),
            "upstream flags not accepted: {missing:?}"
        );
        assert!(
            !command
                .get_arguments()
                .any(|a| a.get_long() == Some("worker-threads")),
            "upstream has no --worker-threads"
        );
        let args = parse(&[]).unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(10));
        assert_eq!(args.sidecar.workers.worker_threads, 10);
        assert_eq!(
            (
                args.sidecar.workers.retry_interval_start,
                args.sidecar.workers.retry_interval_max
            ),
            (Duration::from_secs(1), Duration::from_secs(300))
        );
        assert_eq!(args.sidecar.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.resync_period, Duration::from_secs(600));
        assert!(args.handle_volume_inuse_error && !args.extra_modify_metadata);
        assert_eq!(args.master, "");
        let gates = args.gates().unwrap();
        assert!(gates.get(ANNOTATE_FS_RESIZE) && gates.get(RECOVER_VOLUME_EXPANSION_FAILURE));
        assert!(!gates.get(RELEASE_ON_EXIT_GATE));
    }

    #[test]
    fn values_are_parsed_as_upstream() {
        let args = parse(&[
            "--workers=3",
            "--handle-volume-inuse-error=false",
            "--resync-period=1m30s",
            "--feature-gates=RecoverVolumeExpansionFailure=false",
        ])
        .unwrap();
        assert_eq!(args.sidecar.workers.worker_threads, 3);
        assert!(!args.handle_volume_inuse_error);
        assert_eq!(args.resync_period, Duration::from_secs(90));
        assert!(!args.gates().unwrap().get(RECOVER_VOLUME_EXPANSION_FAILURE));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for (args, expected) in [
            (&["--workers=0"][..], "--workers must be greater than zero"),
            (&["--worker-threads=4"][..], "worker-threads"),
            (&["--resync-period=soon"][..], "soon"),
            (
                &["--feature-gates=Topology=true"][..],
                "unrecognized feature gate: Topology",
            ),
        ] {
            let error = parse(args).unwrap_err().to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
