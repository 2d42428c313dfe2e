//! The command lines of cosi-controller and cosi-provisioner. Upstream's take `--kubeconfig`,
//! klog's `-v` and (the sidecar) `--driver-addr`/`-d` and `--debug`/`-g`; ours take those among
//! the shared flags (leader election, `/metrics` and `/healthz` on `--http-endpoint`, workers,
//! backoff), with upstream's behaviour as the defaults: leader election on, 40 workers,
//! retries from 100ms to 30s.

use std::time::Duration;

use clap::Parser;
use csi_grpc::flags::{DefaultOverrides, SidecarCli};
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::flags::SidecarArgs;

/// cosi-controller: makes (or binds) a Bucket for every BucketClaim, cluster-wide.
#[derive(Parser, Debug, Clone)]
#[command(name = "cosi-controller", version)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Every claim is synced again this often.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync_period: Duration,
}

impl SidecarCli for ControllerArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[
        ("leader_election", "true"),
        ("worker_threads", "40"),
        ("retry_interval_start", "100ms"),
        ("retry_interval_max", "30s"),
    ];

    fn validate(&self) -> Result<(), String> {
        self.sidecar.common.validate()?;
        self.sidecar.http.validate()?;
        self.sidecar.workers.validate()?;
        self.sidecar.leader_election.timings().validate()
    }
}

/// cosi-provisioner: the COSI sidecar next to one driver.
#[derive(Parser, Debug, Clone)]
#[command(name = "cosi-provisioner", version)]
pub struct ProvisionerArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// The driver's COSI socket.
    #[arg(short = 'd', long, default_value = "unix:///var/lib/cosi/cosi.sock")]
    pub driver_addr: String,

    /// Log every gRPC request and response (credentials redacted): `-v=5`.
    #[arg(short = 'g', long)]
    pub debug: bool,

    /// Every Bucket and BucketAccess is synced again this often.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync_period: Duration,
}

impl SidecarCli for ProvisionerArgs {
    const DEFAULTS: DefaultOverrides<'static> = &[
        ("leader_election", "true"),
        ("worker_threads", "40"),
        ("retry_interval_start", "100ms"),
        ("retry_interval_max", "30s"),
        ("timeout", "1m"),
    ];

    fn validate(&self) -> Result<(), String> {
        self.sidecar.common.validate()?;
        self.sidecar.http.validate()?;
        self.sidecar.workers.validate()?;
        csi_grpc::conn::Endpoint::parse(&self.driver_addr).map_err(|e| e.to_string())?;
        self.sidecar.leader_election.timings().validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_defaults_and_its_one_flag() {
        let args: ControllerArgs =
            csi_grpc::flags::try_parse_from(["cosi-controller", "--kubeconfig=/k", "-v=5"])
                .expect("upstream's flags parse");
        assert!(args.sidecar.leader_election.leader_election);
        assert_eq!(args.sidecar.workers.worker_threads, 40);
        assert_eq!(
            args.sidecar.workers.retry_interval_start,
            Duration::from_millis(100)
        );
        assert_eq!(
            args.sidecar.workers.retry_interval_max,
            Duration::from_secs(30)
        );
        let args: ControllerArgs =
            csi_grpc::flags::try_parse_from(["cosi-controller", "--leader-election=false"])
                .expect("election can be turned off");
        assert!(!args.sidecar.leader_election.leader_election);
    }

    #[test]
    fn the_sidecar_takes_upstreams_flags() {
        let args: ProvisionerArgs = csi_grpc::flags::try_parse_from([
            "cosi-provisioner",
            "-d",
            "unix:///cosi/cosi.sock",
            "--kubeconfig=/k",
            "-g",
        ])
        .expect("upstream's flags parse");
        assert_eq!(args.driver_addr, "unix:///cosi/cosi.sock");
        assert!(args.debug);
        assert!(args.sidecar.leader_election.leader_election);
        assert!(
            csi_grpc::flags::try_parse_from::<ProvisionerArgs, _, _>([
                "cosi-provisioner",
                "--driver-addr=tcp://somewhere"
            ])
            .is_err(),
            "only Unix sockets"
        );
    }
}
