//! The csi-provisioner command line: every flag of external-provisioner v6.3 with its name and
//! default (upstream-flags/csi-provisioner.tsv, from its `--help`), on top of the shared sidecar flags.
//! Flags for features this provisioner does not build yet are accepted and, when turned on,
//! refused with a clear error — never silently ignored. `--feature-gates` takes every gate
//! upstream takes ([`crate::gates::TABLE`]).

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{DefaultOverrides, SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::feature_gates::ResolvedGates;
use csi_sidecar::flags::SidecarArgs;

use crate::gates;

/// csi-provisioner: creates and deletes CSI volumes for PersistentVolumeClaims.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-provisioner", version)]
pub struct ProvisionerArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Prefix of the names of provisioned volumes (and their PVs).
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,

    /// Cut the claim UID (dashes removed) to this many characters in volume names; -1 keeps
    /// the whole UID with dashes. As upstream: 0 names every volume `<prefix>-`, and a length
    /// no UID has (over 32, or below -1) stops the provisioner at the first claim it
    /// provisions.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub volume_name_uuid_length: i64,

    /// fsType when the StorageClass names none (empty: the driver decides).
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// Add csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume parameters.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// With delayed binding, only the selected node's topology is sent.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub strict_topology: bool,

    /// With immediate binding, send the aggregated cluster topology.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub immediate_topology: bool,

    /// Mark provisioned PVs readOnly when every access mode is ReadOnlyMany.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub controller_publish_readonly: bool,

    /// Refuse restoring a snapshot into a claim of another volume mode unless allowed.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prevent_volume_mode_conversion: bool,

    /// Workers removing the cloning-protection finalizer from deleted clone sources: a pool
    /// of its own beside --worker-threads.
    #[arg(long, default_value = "1")]
    pub cloning_protection_threads: u32,

    /// How often snapshots left with the source-protection finalizer are swept.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Publish CSIStorageCapacity objects (needs NAMESPACE, and POD_NAME for the owner).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_capacity: bool,

    /// Capacity polling interval.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub capacity_poll_interval: Duration,

    /// Capacity workers.
    #[arg(long, default_value = "1")]
    pub capacity_threads: u32,

    /// Also publish capacity for Immediate classes.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub capacity_for_immediate_binding: bool,

    /// Owner of CSIStorageCapacity objects: how many owners up from the pod.
    #[arg(long, default_value = "1", allow_hyphen_values = true)]
    pub capacity_ownerref_level: i32,

    /// Client-side QPS for capacity updates. Upstream limits to 1 (burst 5) by default; like
    /// --kube-api-qps, there is no client-side limit unless this or the burst is given (API
    /// Priority and Fairness protects the server; 429 + Retry-After is always honoured).
    #[arg(long, value_name = "QPS")]
    pub kube_api_capacity_qps: Option<f32>,

    /// Client-side burst for capacity updates (see --kube-api-capacity-qps).
    #[arg(long, value_name = "BURST")]
    pub kube_api_capacity_burst: Option<u32>,

    /// Run one provisioner per node, next to a driver for node-local volumes (needs the
    /// NODE_NAME environment variable): it provisions only for claims that selected its node.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment: bool,

    /// Per-node provisioning: also handle Immediate claims, by setting their selected node to
    /// this node after a delay.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment_immediate_binding: bool,

    /// Per-node provisioning: base delay before a node claims an Immediate PVC.
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    pub node_deployment_base_delay: Duration,

    /// Per-node provisioning: maximum delay.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub node_deployment_max_delay: Duration,

    /// The API server address (deprecated upstream; use --kubeconfig). Accepted for
    /// compatibility; a non-empty value overrides the kubeconfig's server.
    #[arg(long, default_value = "")]
    pub master: String,

    /// Upstream serves Go's /debug/pprof profiles on --http-endpoint. This binary has no Go
    /// runtime to profile: accepted when false, refused when true.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_pprof: bool,
}

impl ProvisionerArgs {
    /// `--feature-gates` against upstream's table, as component-base resolves them. Pure.
    pub fn gates(&self) -> Result<ResolvedGates, String> {
        csi_sidecar::feature_gates::resolve_gates(&self.sidecar.feature_gates(), gates::TABLE)
    }
}

impl SidecarCli for ProvisionerArgs {
    /// external-provisioner's defaults that differ from the shared ones.
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "10s"), ("worker_threads", "100")];

    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()?;
        if self.volume_name_prefix.is_empty() {
            return Err("--volume-name-prefix must not be empty".to_string());
        }
        if self.enable_pprof {
            return Err("--enable-pprof: this csi-provisioner is not a Go program and has no /debug/pprof profiles to serve; remove the flag".to_string());
        }
        if self.cloning_protection_threads == 0 {
            return Err("--cloning-protection-threads must be at least 1 (0 would never release clone sources)".to_string());
        }
        self.gates().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<ProvisionerArgs, clap::Error> {
        try_parse_from::<ProvisionerArgs, _, _>(
            std::iter::once("csi-provisioner").chain(args.iter().copied()),
        )
    }

    /// Every flag in upstream's table is accepted by name, and its default is upstream's.
    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        let command = <ProvisionerArgs as clap::CommandFactory>::command();
        let table = include_str!("../upstream-flags/csi-provisioner.tsv");
        let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
        assert!(
            missing.is_empty(),
            "upstream flags not accepted: {missing:?}"
        );
        let args = parse(&[]).unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(10));
        assert_eq!(args.sidecar.workers.worker_threads, 100);
        assert_eq!(args.sidecar.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.volume_name_prefix, "pvc");
        assert_eq!(args.volume_name_uuid_length, -1);
        assert_eq!(args.default_fstype, "");
        assert!(
            !args.extra_create_metadata
                && !args.strict_topology
                && !args.controller_publish_readonly
        );
        assert!(
            args.immediate_topology
                && args.prevent_volume_mode_conversion
                && args.node_deployment_immediate_binding
        );
        assert_eq!(args.cloning_protection_threads, 1);
        assert_eq!(
            args.snapshot_orphan_sweep_interval,
            Duration::from_secs(300)
        );
        assert_eq!(args.capacity_poll_interval, Duration::from_secs(60));
        assert_eq!(
            (args.capacity_threads, args.capacity_ownerref_level),
            (1, 1)
        );
        assert_eq!(
            (args.kube_api_capacity_qps, args.kube_api_capacity_burst),
            (None, None),
            "no client-side limit unless asked for"
        );
        assert_eq!(args.node_deployment_base_delay, Duration::from_secs(20));
        assert_eq!(args.node_deployment_max_delay, Duration::from_secs(60));
        assert_eq!(
            args.sidecar.kube.kube_api_qps, None,
            "no client-side limit unless asked"
        );
    }

    #[test]
    fn go_style_values() {
        let args = parse(&[
            "--timeout=1m30s",
            "-v=5",
            "--strict-topology",
            "--immediate-topology=false",
            "--volume-name-uuid-length=16",
            "-extra-create-metadata",
        ])
        .unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(90));
        assert_eq!(args.sidecar.common.verbosity, Some(5));
        assert!(args.strict_topology && !args.immediate_topology && args.extra_create_metadata);
        assert_eq!(args.volume_name_uuid_length, 16);
    }

    #[test]
    fn refused_combinations() {
        let table: [(&[&str], &str); 5] = [
            (&["--cloning-protection-threads=0"], "at least 1"),
            (
                &["--volume-name-prefix="],
                "--volume-name-prefix must not be empty",
            ),
            (
                &["--enable-pprof"],
                "--enable-pprof: this csi-provisioner is not a Go program",
            ),
            (
                &["--log-text-split-stream"],
                "options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
            ),
            (
                &["--log-json-info-buffer-size=1Mi"],
                "options.json.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled",
            ),
        ];
        for (args, message) in table {
            let error = parse(args).unwrap_err();
            assert!(error.to_string().contains(message), "{args:?}: {error}");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
        for accepted in [
            "--feature-gates=VolumeAttributesClass=false",
            "--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=false",
            "--enable-pprof=false",
            "--log-text-info-buffer-size=0",
            "--log-json-split-stream=false",
        ] {
            assert!(parse(&[accepted]).is_ok(), "{accepted}");
        }
    }

    /// As upstream, which checks no length at startup: 0 names every volume `<prefix>-`; a
    /// length no UID has stops the provisioner at its first claim (request::volume_name).
    #[test]
    fn every_volume_name_uuid_length_starts() {
        for length in ["-1", "0", "16", "32", "33", "-2"] {
            let args = parse(&[&format!("--volume-name-uuid-length={length}")]);
            assert_eq!(
                args.map(|a| a.volume_name_uuid_length.to_string()).ok(),
                Some(length.to_string())
            );
        }
    }

    /// Every gate upstream v6.3.0 accepts, by the rules of component-base: its own four, the
    /// generic ones linked in with k8s.io/apiserver v0.36.1, AllAlpha and AllBeta. A row per
    /// kind of gate; then every name of the table alone at its default is accepted.
    #[test]
    fn feature_gates_as_upstream() {
        let gate = |args: &ProvisionerArgs, name: &str| args.gates().unwrap().enabled[name];
        let defaults = parse(&[]).unwrap();
        assert!(gate(&defaults, "Topology") && gate(&defaults, "VolumeAttributesClass"));
        assert!(!gate(&defaults, "CrossNamespaceVolumeDataSource"));
        assert!(!gate(&defaults, "ReleaseLeaderElectionOnExit"));

        /// The flag's value; the gate it sets, its value and how many warnings, or the error.
        type Row<'a> = (&'a str, Result<(&'a str, bool, usize), &'a str>);
        let table: [Row; 12] = [
            ("Topology=true", Ok(("Topology", true, 1))),
            ("Topology=false", Ok(("Topology", false, 1))),
            (
                "ReleaseLeaderElectionOnExit=true",
                Ok(("ReleaseLeaderElectionOnExit", true, 0)),
            ),
            (
                "AllAlpha=true,CrossNamespaceVolumeDataSource=false",
                Ok(("ReleaseLeaderElectionOnExit", true, 0)),
            ),
            (
                "VolumeAttributesClass=false",
                Ok(("VolumeAttributesClass", false, 1)),
            ),
            ("WatchList=false", Ok(("WatchList", false, 0))),
            ("APIServerTracing=true", Ok(("APIServerTracing", true, 1))),
            ("KMSv1=true", Ok(("KMSv1", true, 1))),
            (
                "APIServerTracing=false",
                Err("cannot set feature gate APIServerTracing to false, feature is locked to true"),
            ),
            (
                "SeparateCacheWatchRPC=true",
                Err(
                    "cannot set feature gate SeparateCacheWatchRPC to true, feature is locked to false",
                ),
            ),
            (
                "CSIStorageCapacity=true",
                Err("unrecognized feature gate: CSIStorageCapacity"),
            ),
            (
                "LoggingBetaOptions=true",
                Err("unrecognized feature gate: LoggingBetaOptions"),
            ),
        ];
        for (flag, expected) in table {
            let parsed = parse(&[&format!("--feature-gates={flag}")]);
            match (parsed, expected) {
                (Ok(args), Ok((name, value, warnings))) => {
                    let resolved = args.gates().unwrap();
                    assert_eq!(resolved.enabled[name], value, "{flag}");
                    assert_eq!(resolved.warnings.len(), warnings, "{flag}");
                }
                (Err(error), Err(message)) => {
                    assert!(error.to_string().contains(message), "{flag}: {error}");
                    assert_eq!(error.exit_code(), 2, "{flag}");
                }
                (parsed, expected) => panic!("{flag}: {parsed:?}, expected {expected:?}"),
            }
        }
        for gate in crate::gates::TABLE {
            let flag = format!("--feature-gates={}={}", gate.name, gate.default);
            assert!(parse(&[&flag]).is_ok(), "{flag}");
        }
        let names: std::collections::BTreeSet<_> =
            crate::gates::TABLE.iter().map(|g| g.name).collect();
        assert_eq!(names.len(), crate::gates::TABLE.len(), "no gate twice");
        assert_eq!(
            names.len(),
            4 + 42 + 2,
            "upstream's gates, AllAlpha/AllBeta aside"
        );
    }

    /// The bar of a drop-in: csi-provisioner's args in upstream's example Deployment and in
    /// two vendors' manifests parse unchanged.
    #[test]
    fn upstream_and_vendor_manifests_args_parse() {
        let manifests: [(&str, &[&str]); 3] = [
            (
                // kubernetes-csi/external-provisioner v6.3.0, deploy/kubernetes/deployment.yaml
                "external-provisioner",
                &[
                    "--csi-address=$(ADDRESS)",
                    "--leader-election",
                    "--http-endpoint=:8080",
                ],
            ),
            (
                // kubernetes-sigs/aws-ebs-csi-driver 014d11ef9ff4,
                // deploy/kubernetes/base/controller.yaml (rendered from its Helm chart)
                "aws-ebs-csi-driver",
                &[
                    "--csi-address=$(ADDRESS)",
                    "--v=2",
                    "--feature-gates=Topology=true",
                    "--extra-create-metadata",
                    "--leader-election=true",
                    "--default-fstype=ext4",
                ],
            ),
            (
                // kubernetes-csi/csi-driver-nfs 008c21bad40c, deploy/csi-nfs-controller.yaml
                "csi-driver-nfs",
                &["-v=2", "--csi-address=$(ADDRESS)", "--leader-election"],
            ),
        ];
        for (source, args) in manifests {
            // $(ADDRESS) is expanded by the kubelet from the container's env.
            let expanded: Vec<String> = args
                .iter()
                .map(|a| a.replace("$(ADDRESS)", "/csi/csi.sock"))
                .collect();
            let refs: Vec<&str> = expanded.iter().map(String::as_str).collect();
            if let Err(error) = parse(&refs) {
                panic!("{source}: {args:?}: {error}");
            }
        }
    }
}
