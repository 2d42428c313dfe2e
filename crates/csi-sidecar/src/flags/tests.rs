use std::collections::BTreeMap;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use super::*;
use crate::feature_gates::{FeatureGate, GateWarning, ResolvedGates, Stage, resolve_gates};
use csi_grpc::flags::{DefaultOverrides, HttpServing, SidecarCli, try_parse_from};

/// A binary with the attacher's defaults (the ones `SidecarArgs` declares).
#[derive(Parser, Debug)]
struct AttacherLike {
    #[command(flatten)]
    sidecar: SidecarArgs,
}

impl SidecarCli for AttacherLike {
    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()
    }
}

/// A binary with the provisioner's per-binary defaults.
#[derive(Parser, Debug)]
struct ProvisionerLike {
    #[command(flatten)]
    sidecar: SidecarArgs,
}

impl SidecarCli for ProvisionerLike {
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "10s"), ("worker_threads", "100")];
    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()
    }
}

fn attacher(args: &[&str]) -> Result<SidecarArgs, clap::Error> {
    let argv = std::iter::once("csi-attacher").chain(args.iter().copied());
    try_parse_from::<AttacherLike, _, _>(argv).map(|a| a.sidecar)
}

fn provisioner(args: &[&str]) -> Result<SidecarArgs, clap::Error> {
    let argv = std::iter::once("csi-provisioner").chain(args.iter().copied());
    try_parse_from::<ProvisionerLike, _, _>(argv).map(|a| a.sidecar)
}

/// The upstream defaults (crates/csi-attacher/upstream-flags/csi-attacher.tsv), one assertion each, so a
/// changed default fails here.
#[test]
fn defaults_match_upstream_attacher() {
    let args = attacher(&[]).unwrap();
    assert_eq!(args.csi.csi_address, "/run/csi/socket");
    assert_eq!(args.csi.timeout, Duration::from_secs(15));
    assert_eq!(
        args.kube.kubeconfig,
        std::env::var("KUBECONFIG").unwrap_or_default()
    );
    assert_eq!(
        args.kube.kube_api_qps, None,
        "no client-side limit unless asked"
    );
    assert_eq!(
        args.kube.kube_api_burst, None,
        "no client-side limit unless asked"
    );
    assert!(!args.leader_election.leader_election);
    assert_eq!(args.leader_election.leader_election_namespace, "");
    assert_eq!(
        args.leader_election.leader_election_lease_duration,
        Duration::from_secs(15)
    );
    assert_eq!(
        args.leader_election.leader_election_renew_deadline,
        Duration::from_secs(10)
    );
    assert_eq!(
        args.leader_election.leader_election_retry_period,
        Duration::from_secs(5)
    );
    assert!(args.leader_election.leader_election_labels.is_empty());
    assert_eq!(args.http.http_endpoint, "");
    assert_eq!(args.http.metrics_address, "");
    assert_eq!(args.http.metrics_path, "/metrics");
    assert_eq!(args.http.serving(), HttpServing::Disabled);
    assert_eq!(args.workers.worker_threads, 10);
    assert_eq!(args.workers.retry_interval_start, Duration::from_secs(1));
    assert_eq!(args.workers.retry_interval_max, Duration::from_secs(300));
    assert!(args.feature_gates().is_empty());
    assert_eq!(args.common.verbosity, None);
    assert_eq!(args.common.logging_format, "text");
    assert_eq!(args.common.log_flush_frequency, Duration::from_secs(5));
    assert!(!args.common.automaxprocs);
    assert!(!args.common.log_json_split_stream);
    assert!(!args.common.log_text_split_stream);
}

#[test]
fn per_binary_defaults_apply() {
    let args = provisioner(&[]).unwrap();
    assert_eq!(args.csi.timeout, Duration::from_secs(10));
    assert_eq!(args.workers.worker_threads, 100);
    // An explicit value still wins over the per-binary default.
    let args = provisioner(&["--timeout=2m", "--worker-threads", "7"]).unwrap();
    assert_eq!(args.csi.timeout, Duration::from_secs(120));
    assert_eq!(args.workers.worker_threads, 7);
}

#[test]
fn help_shows_upstream_defaults() {
    let mut command = ProvisionerLike::command();
    for (id, default) in ProvisionerLike::DEFAULTS {
        command = command.mut_arg(*id, |arg| arg.default_value(*default));
    }
    let help = command.render_long_help().to_string();
    for expected in [
        "[default: /run/csi/socket]",
        "[default: 10s]",
        "[default: 100]",
        "[default: 15s]",
        "[default: 5s]",
        "[default: /metrics]",
    ] {
        assert!(help.contains(expected), "help lacks {expected}:\n{help}");
    }
}

#[test]
fn booleans_accept_every_go_spelling() {
    for (argv, want) in [
        (&["--leader-election"][..], true),
        (&["--leader-election=true"][..], true),
        (&["--leader-election=false"][..], false),
        (&["--leader-election=1"][..], true),
        (&["--leader-election=F"][..], false),
        (&["-leader-election"][..], true),
        (&["-leader-election=false"][..], false),
    ] {
        let args = attacher(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert_eq!(args.leader_election.leader_election, want, "{argv:?}");
    }
    assert!(attacher(&["--leader-election=yes"]).is_err());
}

/// pflag's map flags add up when repeated; a later value of the same gate wins.
#[test]
fn repeated_feature_gates_add_up() {
    let args = attacher(&[
        "--feature-gates=Topology=true,ReleaseLeaderElectionOnExit=false",
        "--feature-gates=ReleaseLeaderElectionOnExit=true",
    ])
    .unwrap();
    assert_eq!(
        args.feature_gates(),
        BTreeMap::from([
            ("ReleaseLeaderElectionOnExit".into(), true),
            ("Topology".into(), true)
        ])
    );
}

#[test]
fn go_style_values() {
    let args = attacher(&[
        "--timeout=1m30s",
        "--retry-interval-start=500ms",
        "--retry-interval-max=10m",
        "--leader-election-labels=app:csi,team:storage",
        "--feature-gates=ReleaseLeaderElectionOnExit=true",
        "--kube-api-qps=20",
        "--kube-api-burst=40",
        "-csi-address=unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
        "--v=5",
        "--logging-format=json",
        "--vmodule=foo=3",
        "--automaxprocs",
        "--log-flush-frequency=1s",
    ])
    .unwrap();
    assert_eq!(args.csi.timeout, Duration::from_secs(90));
    assert_eq!(
        args.workers.retry_interval_start,
        Duration::from_millis(500)
    );
    assert_eq!(args.workers.retry_interval_max, Duration::from_secs(600));
    assert_eq!(
        args.leader_election.leader_election_labels,
        BTreeMap::from([
            ("app".into(), "csi".into()),
            ("team".into(), "storage".into())
        ])
    );
    assert_eq!(
        args.feature_gates(),
        BTreeMap::from([("ReleaseLeaderElectionOnExit".into(), true)])
    );
    assert_eq!(args.kube.kube_api_qps, Some(20.0));
    assert_eq!(args.kube.kube_api_burst, Some(40));
    assert_eq!(
        args.csi.csi_address,
        "unix:///var/lib/csi/sockets/pluginproxy/csi.sock"
    );
    assert_eq!(args.common.verbosity, Some(5));
    assert_eq!(args.common.logging_format, "json");
    for short in [&["-v", "4"][..], &["-v=4"][..], &["-v4"][..]] {
        assert_eq!(
            attacher(short).unwrap().common.verbosity,
            Some(4),
            "{short:?}"
        );
    }
}

#[test]
fn invalid_combinations_are_usage_errors_with_a_reason() {
    let table: &[(&[&str], &str)] = &[
        (
            &["--http-endpoint=:8080", "--metrics-address=:8081"],
            "only one of --metrics-address and --http-endpoint",
        ),
        (
            &["--worker-threads=0"],
            "--worker-threads must be greater than zero",
        ),
        (
            &["--retry-interval-start=10m", "--retry-interval-max=1m"],
            "--retry-interval-start must not exceed",
        ),
        (&["--csi-address=tcp://10.0.0.1:9000"], "unix"),
        (&["--csi-address=relative/csi.sock"], "absolute"),
        (
            &[
                "--leader-election-lease-duration=5s",
                "--leader-election-renew-deadline=10s",
            ],
            "lease duration",
        ),
        (&["--metrics-path=metrics"], "must start with /"),
    ];
    for (argv, reason) in table {
        let error = attacher(argv).expect_err(&format!("{argv:?} must be rejected"));
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict, "{argv:?}");
        assert_eq!(error.exit_code(), 2, "{argv:?}");
        let text = error.to_string();
        assert!(text.contains(reason), "{argv:?}: {text}");
    }
}

#[test]
fn bad_values_and_unknown_flags_are_clap_errors() {
    for argv in [
        &["--timeout=10"][..],
        &["--timeout=ten"][..],
        &["--no-such-flag"][..],
        &["--leader-election-labels=broken"][..],
        &["--feature-gates=Topology"][..],
        &["--logging-format=xml"][..],
        &["--worker-threads=-1"][..],
    ] {
        let error = attacher(argv).expect_err(&format!("{argv:?} must be rejected"));
        assert_eq!(error.exit_code(), 2, "{argv:?}");
    }
}

#[test]
fn metrics_address_alone_serves_metrics_only() {
    let args = attacher(&["--metrics-address=:9090"]).unwrap();
    assert_eq!(
        args.http.serving(),
        HttpServing::MetricsOnly(":9090".into())
    );
    let args = attacher(&["--http-endpoint=127.0.0.1:8080"]).unwrap();
    assert_eq!(
        args.http.serving(),
        HttpServing::MetricsAndHealth("127.0.0.1:8080".into())
    );
}

/// component-base's rules, one row each: unknown names, locked gates, GA and deprecated
/// warnings, and AllAlpha/AllBeta (explicit names win over them).
#[test]
fn feature_gates_resolve_like_component_base() {
    const TABLE: &[FeatureGate] = &[
        FeatureGate::new("Topology", true, Stage::Ga, false),
        FeatureGate::new("Locked", true, Stage::Ga, true),
        FeatureGate::new("Alpha", false, Stage::Alpha, false),
        FeatureGate::new("Beta", true, Stage::Beta, false),
        FeatureGate::new("Old", false, Stage::Deprecated, false),
    ];
    let defaults = [
        ("Alpha", false),
        ("Beta", true),
        ("Locked", true),
        ("Old", false),
        ("Topology", true),
    ];
    let warn = |name: &str, value, stage| GateWarning {
        name: name.to_string(),
        value,
        stage,
    };
    type Row<'a> = (
        &'a str,
        Result<(Vec<(&'a str, bool)>, Vec<GateWarning>), &'a str>,
    );
    let table: Vec<Row> = vec![
        ("", Ok((vec![], vec![]))),
        (
            "Topology=false,Alpha=true",
            Ok((
                vec![("Topology", false), ("Alpha", true)],
                vec![warn("Topology", false, Stage::Ga)],
            )),
        ),
        (
            "Topology=true",
            Ok((vec![], vec![warn("Topology", true, Stage::Ga)])),
        ),
        (
            "Locked=true",
            Ok((vec![], vec![warn("Locked", true, Stage::Ga)])),
        ),
        (
            "Old=true",
            Ok((
                vec![("Old", true)],
                vec![warn("Old", true, Stage::Deprecated)],
            )),
        ),
        ("Nope=true", Err("unrecognized feature gate: Nope")),
        (
            "Topology=true,Nope=false",
            Err("unrecognized feature gate: Nope"),
        ),
        (
            "Locked=false",
            Err("cannot set feature gate Locked to false, feature is locked to true"),
        ),
        ("AllAlpha=true", Ok((vec![("Alpha", true)], vec![]))),
        ("AllAlpha=true,Alpha=false", Ok((vec![], vec![]))),
        ("AllBeta=false", Ok((vec![("Beta", false)], vec![]))),
        (
            "AllBeta=false,AllAlpha=true,Beta=true",
            Ok((vec![("Alpha", true)], vec![])),
        ),
    ];
    for (flag, expected) in table {
        let given = parse_feature_gate_map(flag).unwrap();
        let resolved = resolve_gates(&given, TABLE);
        let expected = expected
            .map(|(changed, warnings)| ResolvedGates {
                enabled: defaults.iter().copied().chain(changed).collect(),
                warnings,
            })
            .map_err(str::to_string);
        assert_eq!(resolved, expected, "--feature-gates={flag}");
    }
    let resolved = resolve_gates(&BTreeMap::new(), TABLE).unwrap();
    assert!(resolved.get(TABLE[0]));
    let absent = FeatureGate::new("Absent", true, Stage::Beta, false);
    assert!(
        resolved.get(absent),
        "a gate outside the table has its default"
    );
}

/// A QPS no token bucket can pace (not finite, or so small that the wait for one token
/// overflows a timer) is a usage error naming the flag; every QPS the flag accepts paces
/// requests past the burst without panicking.
#[test]
fn kube_api_qps_refuses_values_no_token_bucket_can_pace() {
    for qps in ["1e-300", "1e-40", "0.000001", "NaN", "inf", "-inf", "1e39"] {
        let flag = format!("--kube-api-qps={qps}");
        let error = attacher(&[&flag]).expect_err(&format!("{flag} must be rejected"));
        assert_eq!(error.exit_code(), 2, "{flag}");
        assert!(error.to_string().contains("--kube-api-qps"), "{error}");
    }
    let smallest = MIN_POSITIVE_KUBE_API_QPS.to_string();
    for qps in [&smallest, "0.5", "0", "-1", "-1e-300", "1e30"] {
        let flag = format!("--kube-api-qps={qps}");
        let args = attacher(&[&flag, "--kube-api-burst=1"]).expect(&flag);
        let limit = crate::kube::RateLimit::from_flags(args.kube.kube_api_qps, Some(1));
        if let Some(limit) = limit {
            let start = tokio::time::Instant::now();
            let mut bucket = crate::kube::TokenBucket::new(limit, start);
            let waits: Vec<Duration> = (0..3).map(|_| bucket.reserve(start)).collect();
            assert_eq!(waits[0], Duration::ZERO, "{flag}");
            assert!(waits.is_sorted(), "{flag}: {waits:?}");
        }
    }
}
