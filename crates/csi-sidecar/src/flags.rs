//! The controllers' Kubernetes flags (csi-lib-utils `standardflags` and `leaderelection`): the
//! API client, leader election, workers and retries, feature gates, and [`SidecarArgs`], the
//! standard set of the controller sidecars, on top of the common flags of `csi_grpc::flags`.

mod values;

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{ArgAction, Args};
use csi_grpc::flags::{CommonArgs, CsiArgs, HttpArgs, parse_colon_map, parse_go_bool};
use csi_kinds::go_duration::parse_go_duration;
pub use values::{MIN_POSITIVE_KUBE_API_QPS, parse_feature_gate_map, parse_kube_api_qps};

use crate::leader::{LeaderElectionConfig, LeaderElectionTimings};

/// How to reach the Kubernetes API.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct KubeArgs {
    /// Path to a kubeconfig; empty means the KUBECONFIG variable, then in-cluster configuration.
    #[arg(long, env = "KUBECONFIG", default_value = "")]
    pub kubeconfig: String,

    /// Client-side QPS limit toward the API server. Upstream's default is 5; unlike upstream we
    /// set no client-side limit unless this or --kube-api-burst is given (API Priority and
    /// Fairness protects the server, and 429 + Retry-After is always honoured).
    #[arg(long, value_name = "QPS", value_parser = parse_kube_api_qps)]
    pub kube_api_qps: Option<f32>,

    /// Client-side burst toward the API server (upstream default 10; see --kube-api-qps).
    #[arg(long, value_name = "BURST")]
    pub kube_api_burst: Option<u32>,
}

/// Lease-based leader election (csi-lib-utils `leaderelection`).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct LeaderElectionArgs {
    /// Enable leader election.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_election: bool,

    /// Namespace of the Lease; empty means POD_NAMESPACE, then the service account's
    /// namespace, then "default".
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long non-leaders wait after observing a renewal before trying to take over.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps retrying a failed renewal before giving up leadership.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often candidates try to acquire or renew.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels to put on the Lease, as key:value,key2:value2.
    #[arg(long, default_value = "", value_parser = parse_colon_map)]
    pub leader_election_labels: BTreeMap<String, String>,
}

impl LeaderElectionArgs {
    pub fn timings(&self) -> LeaderElectionTimings {
        LeaderElectionTimings {
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        }
    }

    /// The election these flags describe for the Lease `lock_name`.
    pub fn config(&self, lock_name: &str, release_on_exit: bool) -> LeaderElectionConfig {
        LeaderElectionConfig::new(
            lock_name,
            &self.leader_election_namespace,
            self.leader_election_labels.clone(),
            self.timings(),
            release_on_exit,
        )
    }
}

/// Worker pool and per-object retry backoff.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkerArgs {
    /// Number of concurrent workers. The default differs per sidecar, as upstream.
    #[arg(long, default_value = "10")]
    pub worker_threads: u32,

    /// First retry delay of a failed object; doubles per failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration)]
    pub retry_interval_start: Duration,

    /// Cap of the per-object retry delay.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub retry_interval_max: Duration,
}

impl WorkerArgs {
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_threads == 0 {
            return Err("--worker-threads must be greater than zero".into());
        }
        if self.retry_interval_start.is_zero() {
            return Err("--retry-interval-start must be greater than zero".into());
        }
        if self.retry_interval_start > self.retry_interval_max {
            return Err("--retry-interval-start must not exceed --retry-interval-max".into());
        }
        Ok(())
    }
}

/// The standard flag set of the controller sidecars (provisioner, attacher): upstream's
/// `standardflags` plus `--timeout`, workers, retries and feature gates.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub csi: CsiArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,

    /// Feature gates as Name=true,Name2=false. The flag may be repeated: the maps add up,
    /// a later value of a gate winning, as upstream's (a pflag map) do.
    #[arg(long = "feature-gates", action = ArgAction::Append, value_parser = parse_feature_gate_map)]
    feature_gate_flags: Vec<BTreeMap<String, bool>>,
}

impl SidecarArgs {
    /// Every `--feature-gates` given, merged.
    pub fn feature_gates(&self) -> BTreeMap<String, bool> {
        self.feature_gate_flags
            .iter()
            .flatten()
            .map(|(name, value)| (name.clone(), *value))
            .collect()
    }

    /// Checks the combinations clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        self.csi.endpoint().map_err(|e| e.to_string())?;
        self.http.validate()?;
        self.workers.validate()?;
        self.leader_election.timings().validate()
    }
}

#[cfg(test)]
mod tests;
