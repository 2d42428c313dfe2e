//! The csi-snapshot-metadata command line: the flags of upstream's external-snapshot-metadata
//! sidecar (pkg/sidecar/sidecar.go; `upstream-flags/csi-snapshot-metadata.tsv`) with their
//! names and defaults, built from the shared pieces: logging (`-v`, `--vmodule`, ...), the
//! driver (`--csi-address`, `--timeout` 1m as upstream), the Kubernetes client
//! (`--kubeconfig`, `--kube-api-qps`, `--kube-api-burst`: no client-side limit unless given)
//! and TLS (`--tls-*`, `TLS_CERT_PATH` / `TLS_KEY_PATH`).

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{CommonArgs, CsiArgs, DefaultOverrides, SidecarCli, parse_go_bool};
use csi_grpc::tls::TlsServerArgs;
use csi_sidecar::flags::KubeArgs;

/// csi-snapshot-metadata: serves the Kubernetes SnapshotMetadata API (changed block tracking)
/// for a CSI driver's snapshots, over TLS, to authorized backup applications.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-snapshot-metadata", version)]
pub struct SnapshotMetadataArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub csi: CsiArgs,

    #[command(flatten)]
    pub tls: TlsServerArgs,

    /// GRPC SnapshotMetadata service port number.
    #[arg(long, default_value = "50051", allow_negative_numbers = true)]
    pub port: i32,

    /// The TCP network address where the HTTP server for diagnostics, including health check
    /// and metrics, will listen.
    #[arg(long, default_value = ":8080")]
    pub http_endpoint: String,

    /// The HTTP path where prometheus metrics will be exposed.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Disable the metrics endpoint. The health endpoint will still be available.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub disable_metrics: bool,

    /// Audience string used for authentication; empty: the audience of the
    /// SnapshotMetadataService named after the driver.
    #[arg(long, default_value = "")]
    pub audience: String,

    /// The maximum duration in minutes for any individual streaming session (zero or less:
    /// 10, as upstream's server takes it).
    #[arg(long, default_value = "10", allow_negative_numbers = true)]
    pub max_streaming_duration_min: i64,
}

/// Upstream's default when `--max-streaming-duration-min` is not positive.
const DEFAULT_MAX_STREAMING_MINUTES: u64 = 10;

impl SnapshotMetadataArgs {
    /// How long one request may take, stream included.
    pub fn max_streaming_duration(&self) -> Duration {
        let minutes = u64::try_from(self.max_streaming_duration_min)
            .ok()
            .filter(|&m| m > 0)
            .unwrap_or(DEFAULT_MAX_STREAMING_MINUTES);
        Duration::from_secs(minutes.saturating_mul(60))
    }

    /// Upstream's `Args.Validate` (run after parsing, exit 1 as upstream): the address,
    /// timeout, port and key pair are required, the TLS settings must parse.
    pub fn check(&self) -> Result<(), String> {
        if self.csi.csi_address.is_empty() {
            return Err("CSIAddress is required".into());
        }
        if self.csi.timeout.is_zero() {
            return Err("CSITimeout is required".into());
        }
        if self.port <= 0 || self.port > i32::from(u16::MAX) {
            return Err("invalid GRPCPort".into());
        }
        if self.tls.tls_cert.is_empty() {
            return Err("missing TLSCertFile".into());
        }
        if self.tls.tls_key.is_empty() {
            return Err("missing TLSKeyFile".into());
        }
        self.tls.options().map(drop).map_err(|e| e.to_string())
    }
}

impl SidecarCli for SnapshotMetadataArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "1m")];

    fn validate(&self) -> Result<(), String> {
        self.common.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<SnapshotMetadataArgs, clap::Error> {
        try_parse_from::<SnapshotMetadataArgs, _, _>(
            std::iter::once("csi-snapshot-metadata").chain(args.iter().copied()),
        )
    }

    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        let command = <SnapshotMetadataArgs as clap::CommandFactory>::command();
        let table = include_str!("../upstream-flags/csi-snapshot-metadata.tsv");
        let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
        assert!(
            missing.is_empty(),
            "upstream flags not accepted: {missing:?}"
        );
        let args = parse(&[]).unwrap();
        assert_eq!(args.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.csi.timeout, Duration::from_secs(60));
        assert_eq!(args.port, 50051);
        assert_eq!(args.http_endpoint, ":8080");
        assert_eq!(args.metrics_path, "/metrics");
        assert!(!args.disable_metrics);
        assert_eq!(args.audience, "");
        assert_eq!(args.max_streaming_duration(), Duration::from_secs(600));
        assert_eq!(args.kube.kube_api_qps, None);
        assert_eq!(args.kube.kube_api_burst, None);
    }

    #[test]
    fn upstream_command_lines_parse() {
        let args = parse(&[
            "-csi-address=/csi/csi.sock",
            "--tls-cert=/certs/tls.crt",
            "--tls-key",
            "/certs/tls.key",
            "--audience=backup",
            "--max-streaming-duration-min=0",
            "--disable-metrics",
            "--tls-min-version=VersionTLS13",
            "-v=5",
        ])
        .unwrap();
        assert_eq!(args.csi.csi_address, "/csi/csi.sock");
        assert_eq!(args.tls.tls_cert, "/certs/tls.crt");
        assert_eq!(args.tls.tls_key, "/certs/tls.key");
        assert_eq!(args.audience, "backup");
        assert!(args.disable_metrics);
        assert_eq!(args.max_streaming_duration(), Duration::from_secs(600));
        assert_eq!(args.check(), Ok(()));
    }

    #[test]
    fn check_refuses_as_upstream() {
        let with = |extra: &[&str]| {
            let mut all = vec!["--tls-cert=c", "--tls-key=k"];
            all.extend_from_slice(extra);
            parse(&all).unwrap().check()
        };
        assert_eq!(with(&["--port=0"]), Err("invalid GRPCPort".into()));
        assert_eq!(
            with(&["--csi-address="]),
            Err("CSIAddress is required".into())
        );
        assert_eq!(
            with(&["--timeout=0s"]),
            Err("CSITimeout is required".into())
        );
        assert_eq!(
            with(&["--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA"]),
            Err("unsupported or insecure cipher suite: \"TLS_RSA_WITH_RC4_128_SHA\"".into())
        );
        assert_eq!(
            parse(&["--tls-key=k"]).unwrap().check(),
            Err("missing TLSCertFile".into())
        );
        assert_eq!(
            parse(&["--tls-cert=c"]).unwrap().check(),
            Err("missing TLSKeyFile".into())
        );
    }
}
