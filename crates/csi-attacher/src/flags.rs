//! The csi-attacher command line: every flag of external-attacher with its name and default
//! (upstream-flags/csi-attacher.tsv, from its `--help`), on top of the shared sidecar flags, whose
//! defaults (`--timeout` 15s, `--worker-threads` 10, retries 1s..5m) are external-attacher's.

use std::time::Duration;

use clap::Parser;
use csi_grpc::flags::SidecarCli;
use csi_kinds::go_duration::parse_go_duration;
use csi_sidecar::flags::SidecarArgs;

/// csi-attacher: attaches and detaches CSI volumes for VolumeAttachments.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-attacher", version)]
pub struct AttacherArgs {
    #[command(flatten)]
    pub sidecar: SidecarArgs,

    /// Resync period of the caches: every VolumeAttachment is synced again this often.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync: Duration,

    /// `max_entries` of each paged ListVolumes call during reconcile (0: no limit).
    #[arg(long, default_value = "0")]
    pub max_entries: i32,

    /// fsType when the PV names none (empty: the driver decides).
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// Period of the reconcile of VolumeAttachments against the driver's ListVolumes.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub reconcile_sync: Duration,

    /// Truncate logged gRPC payloads to this many characters (≤ 0: no limit).
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub max_grpc_log_length: i64,
}

impl SidecarCli for AttacherArgs {
    fn validate(&self) -> Result<(), String> {
        self.sidecar.validate()?;
        if self.max_entries < 0 {
            return Err("--max-entries must not be negative".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_grpc::flags::try_parse_from;

    fn parse(args: &[&str]) -> Result<AttacherArgs, clap::Error> {
        try_parse_from::<AttacherArgs, _, _>(
            std::iter::once("csi-attacher").chain(args.iter().copied()),
        )
    }

    /// Every flag in upstream's table is accepted by name, and its default is upstream's.
    #[test]
    fn every_upstream_flag_is_accepted_with_its_default() {
        let command = <AttacherArgs as clap::CommandFactory>::command();
        let table = include_str!("../upstream-flags/csi-attacher.tsv");
        let missing = csi_grpc::flags::missing_upstream_flags(&command, table);
        assert!(
            missing.is_empty(),
            "upstream flags not accepted: {missing:?}"
        );
        let args = parse(&[]).unwrap();
        assert_eq!(args.sidecar.csi.timeout, Duration::from_secs(15));
        assert_eq!(args.sidecar.workers.worker_threads, 10);
        assert_eq!(
            (
                args.sidecar.workers.retry_interval_start,
                args.sidecar.workers.retry_interval_max
            ),
            (Duration::from_secs(1), Duration::from_secs(300))
        );
        assert_eq!(args.sidecar.csi.csi_address, "/run/csi/socket");
        assert_eq!(args.resync, Duration::from_secs(600));
        assert_eq!(args.reconcile_sync, Duration::from_secs(60));
        assert_eq!((args.max_entries, args.max_grpc_log_length), (0, -1));
        assert_eq!(args.default_fstype, "");
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for (args, expected) in [
            (&["--max-entries=-1"][..], "must not be negative"),
            (&["--worker-threads=0"][..], "worker-threads"),
            (&["--reconcile-sync=soon"][..], "soon"),
        ] {
            let error = parse(args).unwrap_err().to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
