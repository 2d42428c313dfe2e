//! The command lines of csi-node-driver-registrar and livenessprobe, with every upstream flag
//! and default (upstream-flags/{csi-node-driver-registrar,livenessprobe}.tsv, from their `--help`).

use std::time::Duration;

use clap::{ArgAction, Parser};
use csi_grpc::flags::{CommonArgs, CsiArgs, DefaultOverrides, HttpArgs, SidecarCli, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;

/// csi-node-driver-registrar: registers a CSI driver with the kubelet.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-node-driver-registrar", version)]
pub struct RegistrarArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// `--csi-address` (the driver's socket in this container) and `--timeout` (GetPluginInfo
    /// and the /healthz GetInfo).
    #[command(flatten)]
    pub csi: CsiArgs,

    /// Path of the driver's socket on the host: the endpoint kubelet is told. Required.
    #[arg(long, default_value = "")]
    pub kubelet_registration_path: String,

    /// Directory kubelet watches for registration sockets (the host's plugins_registry).
    #[arg(long, default_value = "/registration")]
    pub plugin_registration_path: String,

    /// Address (e.g. :9809) of the /healthz server; empty disables it.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated: port of the /healthz server (`:<port>`); exclusive with --http-endpoint.
    #[arg(long, default_value = "")]
    pub health_port: String,

    /// Deprecated: `kubelet-registration-probe` exits 0 at once (what upstream does now).
    #[arg(long, default_value = "")]
    pub mode: String,

    /// Accepted for compatibility: there is no Go profiler to serve.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_pprof: bool,

    /// Deprecated no-op, as upstream.
    #[arg(long, value_parser = parse_go_duration)]
    pub connection_timeout: Option<Duration>,
}

/// `--mode` value that only checks the flags and exits 0.
pub const REGISTRATION_PROBE_MODE: &str = "kubelet-registration-probe";

impl RegistrarArgs {
    /// Where /healthz is served: `--http-endpoint`, else `:<--health-port>`, else nowhere.
    pub fn health_address(&self) -> Option<String> {
        match (self.http_endpoint.as_str(), self.health_port.as_str()) {
            ("", "" | "0") => None,
            ("", port) => Some(format!(":{}", port.trim_start_matches(':'))),
            (endpoint, _) => Some(endpoint.to_string()),
        }
    }
}

impl SidecarCli for RegistrarArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[("timeout", "1s")];

    fn validate(&self) -> Result<(), String> {
        self.csi.endpoint().map_err(|e| e.to_string())?;
        if self.kubelet_registration_path.is_empty() {
            return Err("--kubelet-registration-path is required".to_string());
        }
        if !self.http_endpoint.is_empty() && !matches!(self.health_port.as_str(), "" | "0") {
            return Err("only one of --health-port and --http-endpoint can be set".to_string());
        }
        Ok(())
    }
}

/// livenessprobe: answers the kubelet's liveness probes with the driver's Probe.
#[derive(Parser, Debug, Clone)]
#[command(name = "livenessprobe", version)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// CSI endpoint of the driver: unix:///abs/path or /abs/path.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Deadline of each Probe (and of connecting for it).
    #[arg(long, default_value = "3s", value_parser = parse_go_duration)]
    pub probe_timeout: Duration,

    /// Deprecated: port of /healthz on every interface; replaced by --http-endpoint.
    #[arg(long, default_value = "9808")]
    pub health_port: String,

    /// `--http-endpoint` (/healthz and the metrics; replaces --health-port), the deprecated
    /// `--metrics-address` and `--metrics-path`.
    #[command(flatten)]
    pub http: HttpArgs,
}

impl ProbeArgs {
    /// Where /healthz is served.
    pub fn health_address(&self) -> String {
        if self.http.http_endpoint.is_empty() {
            format!(":{}", self.health_port.trim_start_matches(':'))
        } else {
            self.http.http_endpoint.clone()
        }
    }
}

impl SidecarCli for ProbeArgs {
    fn validate(&self) -> Result<(), String> {
        csi_grpc::conn::Endpoint::parse(&self.csi_address).map_err(|e| e.to_string())?;
        if !self.http.http_endpoint.is_empty() && self.health_port != "9808" {
            return Err("only one of --health-port and --http-endpoint can be set".to_string());
        }
        self.http.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    /// Every flag in upstream's tables is accepted by name, with upstream's defaults.
    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        for (name, command, table) in [
            (
                "csi-node-driver-registrar",
                <RegistrarArgs as clap::CommandFactory>::command(),
                include_str!("../upstream-flags/csi-node-driver-registrar.tsv"),
            ),
            (
                "livenessprobe",
                <ProbeArgs as clap::CommandFactory>::command(),
                include_str!("../upstream-flags/livenessprobe.tsv"),
            ),
        ] {
            let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
            assert!(
                missing.is_empty(),
                "{name}: upstream flags not accepted: {missing:?}"
            );
        }
        let registrar: RegistrarArgs =
            try_parse_from(["r", "--kubelet-registration-path=/k/csi.sock"]).unwrap();
        assert_eq!(registrar.csi.timeout, Duration::from_secs(1));
        assert_eq!(registrar.plugin_registration_path, "/registration");
        assert_eq!(registrar.csi.csi_address, "/run/csi/socket");
        assert_eq!(registrar.health_address(), None);
        let probe: ProbeArgs = try_parse_from(["p"]).unwrap();
        assert_eq!(probe.probe_timeout, Duration::from_secs(3));
        assert_eq!(probe.health_address(), ":9808");
    }

    #[test]
    fn bad_combinations_are_usage_errors() {
        let registrar = |args: &[&str]| {
            try_parse_from::<RegistrarArgs, _, _>(std::iter::once("r").chain(args.iter().copied()))
                .map(drop)
                .map_err(|e| e.to_string())
        };
        assert!(
            registrar(&[])
                .unwrap_err()
                .contains("--kubelet-registration-path is required")
        );
        assert!(
            registrar(&[
                "--kubelet-registration-path=/k",
                "--health-port=9809",
                "--http-endpoint=:9810"
            ])
            .unwrap_err()
            .contains("only one of")
        );
        let probe = |args: &[&str]| {
            try_parse_from::<ProbeArgs, _, _>(std::iter::once("p").chain(args.iter().copied()))
                .map(drop)
                .map_err(|e| e.to_string())
        };
        assert!(probe(&["--http-endpoint=:1", "--metrics-address=:2"]).is_err());
        assert!(probe(&["--http-endpoint=:1", "--health-port=7"]).is_err());
        assert!(probe(&["--http-endpoint=:1"]).is_ok());
    }
}
