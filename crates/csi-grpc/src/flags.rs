//! The flags every binary of the suite shares (component-base logging, csi-lib-utils'
//! `--csi-address` and `--timeout`, the diagnostics HTTP server), as clap argument groups each
//! binary flattens into its own `Args`, and the parsing entry points. The controllers' Kubernetes
//! flags (client, leader election, workers, feature gates) build on these in `csi_sidecar::flags`.
//!
//! Compatibility rules carried over from Go's flag parsing: durations use Go syntax, booleans
//! accept `--flag`, `--flag=true` and `--flag=false`, and single-dash long flags
//! (`-csi-address=/x`) are accepted like double-dash ones.

mod values;

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, error::ErrorKind};

use csi_kinds::go_duration::parse_go_duration;
pub use values::{parse_colon_map, parse_go_bool};

use crate::conn::Endpoint;

/// Logging and process flags every binary of the suite accepts (component-base's set).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct CommonArgs {
    /// Log verbosity as klog levels: 0 error, 1 warn, 2 info, 3-4 debug, 5+ trace. Unset: info.
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u8>,

    /// Accepted for compatibility; Go source-file patterns have no meaning here, so it is ignored
    /// with a warning.
    #[arg(long, value_name = "PATTERN=N,...")]
    pub vmodule: Option<String>,

    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,

    /// Accepted for compatibility; logs are written unbuffered, so there is nothing to flush.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// [Alpha upstream] Split JSON logs into stderr (errors) and stdout (info). Accepted for
    /// compatibility at its default; true is refused as upstream refuses it (it needs the
    /// LoggingAlphaOptions gate, which no flag enables). Logs go to one stream here.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: bool,

    /// [Alpha upstream] Split text logs into stderr (errors) and stdout (info). Accepted for
    /// compatibility at its default; true is refused as upstream refuses it (it needs the
    /// LoggingAlphaOptions gate, which no flag enables). Logs go to one stream here.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: bool,

    /// [Alpha upstream] Buffer size of split JSON info logs. Accepted for compatibility at zero
    /// (no buffering, what this binary does: logs are written unbuffered); any other size is
    /// refused as upstream refuses it (LoggingAlphaOptions gate).
    #[arg(long, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,

    /// [Alpha upstream] Buffer size of split text info logs. Accepted for compatibility at zero
    /// (no buffering, what this binary does: logs are written unbuffered); any other size is
    /// refused as upstream refuses it (LoggingAlphaOptions gate).
    #[arg(long, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,

    /// Accepted for compatibility and changes nothing here: upstream sets Go's GOMAXPROCS from
    /// the container's CPU quota; this binary's runtime always sizes its threads from that
    /// quota (the standard library's available_parallelism reads the cgroup limits).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub automaxprocs: bool,
}

impl CommonArgs {
    /// Refuses what component-base's logging validation refuses: the alpha logging options
    /// away from their defaults (upstream's LoggingAlphaOptions gate is off and no flag turns
    /// it on), with upstream's field paths and message.
    pub fn validate(&self) -> Result<(), String> {
        let nonzero = |size: &Option<String>| {
            size.as_deref()
                .is_some_and(|s| csi_kinds::quantity::parse(s) != Some(0))
        };
        let forbidden = [
            (self.log_text_split_stream, "text.splitStream"),
            (
                nonzero(&self.log_text_info_buffer_size),
                "text.infoBufferSize",
            ),
            (self.log_json_split_stream, "json.splitStream"),
            (
                nonzero(&self.log_json_info_buffer_size),
                "json.infoBufferSize",
            ),
        ];
        let errors: Vec<String> = forbidden
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, field)| {
                format!("options.{field}: Forbidden: Feature LoggingAlphaOptions is disabled")
            })
            .collect();
        match errors.as_slice() {
            [] => {}
            [one] => return Err(one.clone()),
            many => return Err(format!("[{}]", many.join(", "))),
        }
        if self.log_flush_frequency.is_zero() {
            return Err("flushFrequency: Invalid value: \"0s\": Must be greater than zero".into());
        }
        Ok(())
    }
}

/// How to reach the CSI driver.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct CsiArgs {
    /// CSI endpoint: unix:///abs/path or /abs/path.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of every CSI call (Go duration). The default differs per sidecar, as upstream.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub timeout: Duration,
}

impl CsiArgs {
    /// The parsed `--csi-address`.
    pub fn endpoint(&self) -> Result<Endpoint, crate::conn::ConnError> {
        Endpoint::parse(&self.csi_address)
    }
}

/// The diagnostics HTTP server.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct HttpArgs {
    /// Address (e.g. :8080) for metrics and health checks; empty disables the server.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated: address that serves metrics only. Exclusive with --http-endpoint.
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,
}

/// Where and what the diagnostics server serves, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpServing {
    Disabled,
    /// `--metrics-address`: metrics only.
    MetricsOnly(String),
    /// `--http-endpoint`: metrics and health checks.
    MetricsAndHealth(String),
}

impl HttpArgs {
    pub fn serving(&self) -> HttpServing {
        match (self.http_endpoint.as_str(), self.metrics_address.as_str()) {
            ("", "") => HttpServing::Disabled,
            ("", metrics) => HttpServing::MetricsOnly(metrics.to_string()),
            (endpoint, _) => HttpServing::MetricsAndHealth(endpoint.to_string()),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(
                "only one of --metrics-address and --http-endpoint can be set (--metrics-address is deprecated)"
                    .into(),
            );
        }
        if !self.metrics_path.starts_with('/') {
            return Err(format!(
                "--metrics-path {:?} must start with /",
                self.metrics_path
            ));
        }
        Ok(())
    }
}

/// Per-binary defaults that differ between the upstream sidecars (e.g. `--timeout` is 15s in
/// the attacher, 10s in the provisioner, 1s in the registrar). Keys are clap argument ids
/// (field names, e.g. `"timeout"`, `"worker_threads"`).
pub type DefaultOverrides<'a> = &'a [(&'static str, &'static str)];

/// A binary's argument struct: clap-parsable plus its cross-flag checks.
pub trait SidecarCli: Parser {
    /// Per-binary default overrides of shared flags.
    const DEFAULTS: DefaultOverrides<'static> = &[];

    /// Checks the combinations clap cannot express; the message is shown with exit code 2.
    fn validate(&self) -> Result<(), String>;
}

/// Parses the process arguments; exits with clap's usage error (code 2) on unknown flags, bad
/// values or invalid combinations, exactly as for any other usage error.
pub fn parse<A: SidecarCli>() -> A {
    match try_parse_from::<A, _, _>(std::env::args_os()) {
        Ok(args) => args,
        Err(error) => error.exit(),
    }
}

/// [`parse`] on explicit arguments (the first is the program name), returning the error.
pub fn try_parse_from<A, I, T>(args: I) -> Result<A, clap::Error>
where
    A: SidecarCli,
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut command = A::command();
    for (id, default) in A::DEFAULTS {
        command = command.mut_arg(*id, |arg| arg.default_value(*default));
    }
    let args = normalize_single_dash_long_flags(args.into_iter().map(Into::into), &command);
    let matches = command.try_get_matches_from_mut(args)?;
    let parsed = A::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    parsed
        .validate()
        .map_err(|reason| command.error(ErrorKind::ArgumentConflict, reason))?;
    Ok(parsed)
}

/// The flags of an upstream flag table (`flag<TAB>type<TAB>default` lines after a header, as in
/// `crates/<component>/upstream-flags/*.tsv`) that `command` does not accept (`--version`
/// aside: clap's).
pub fn missing_upstream_flags(command: &clap::Command, table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split('\t').next())
        .map(|flag| flag.trim_start_matches("--"))
        .filter(|flag| !flag.is_empty() && *flag != "version")
        .filter(|flag| !command.get_arguments().any(|a| a.get_long() == Some(flag)))
        .map(|flag| format!("--{flag}"))
        .collect()
}

/// Go's `flag` package accepts `-name=value` for long flags; manifests written for the Go
/// sidecars sometimes use it. Rewrites `-name…` to `--name…` when `name` is one of the command's
/// long flags (so `-v=5` and negative numbers are left alone).
fn normalize_single_dash_long_flags(
    args: impl Iterator<Item = OsString>,
    command: &clap::Command,
) -> Vec<OsString> {
    let long_names: Vec<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| long.len() > 1)
        .collect();
    let mut after_separator = false;
    args.map(|arg| {
        let Some(text) = arg.to_str() else {
            return arg;
        };
        if after_separator || text == "--" {
            after_separator = true;
            return arg;
        }
        match text.strip_prefix('-') {
            Some(rest) if !rest.starts_with('-') => {
                let name = rest.split('=').next().unwrap_or(rest);
                if long_names.contains(&name) {
                    OsString::from(format!("-{text}"))
                } else {
                    arg
                }
            }
            _ => arg,
        }
    })
    .collect()
}

#[cfg(test)]
mod tests;
