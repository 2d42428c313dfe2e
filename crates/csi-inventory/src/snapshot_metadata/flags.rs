//! The snapshot-metadata-lister command line: upstream's flags (tools/snapshot-metadata-lister),
//! long and short, Go style single-dash long flags accepted too.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use csi_grpc::flags::SidecarCli;

use super::resolve::{Previous, Query, ServiceAccountRef};

/// Upstream's default lifetime of the security token, in seconds.
pub const DEFAULT_TOKEN_EXPIRY_SECS: i64 = 600;

/// Displays metadata on the content of a VolumeSnapshot: its allocated blocks, or with a
/// previous snapshot (by name, or by the CSI handle of its VolumeSnapshotContent, which takes
/// precedence) the blocks changed between the two, which must be of the same volume.
#[derive(Parser, Debug, Clone)]
#[command(name = "snapshot-metadata-lister", version)]
pub struct ListerArgs {
    /// The Namespace containing the VolumeSnapshot objects.
    #[arg(short = 'n', long, default_value = "")]
    pub namespace: String,
    /// The name of the VolumeSnapshot for which metadata is to be displayed.
    #[arg(short = 's', long, default_value = "")]
    pub snapshot: String,
    /// The CSI handle of an earlier VolumeSnapshot against which changed block metadata is to
    /// be displayed.
    #[arg(short = 'P', long, default_value = "")]
    pub previous_snapshot_id: String,
    /// The name of an earlier VolumeSnapshot against which changed block metadata is to be
    /// displayed.
    #[arg(short = 'p', long, default_value = "")]
    pub previous_snapshot: String,
    /// The format of the output.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output_format: OutputFormat,
    /// Path to the kubeconfig file (default: ~/.kube/config when it exists, else the in-cluster
    /// configuration).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// ServiceAccount used to create a security token. If unspecified the ServiceAccount of
    /// the Pod in which the command is invoked will be used.
    #[arg(long, default_value = "")]
    pub service_account: String,
    /// Namespace of the ServiceAccount used to create a security token. If unspecified the
    /// Namespace of the Pod in which the command is invoked will be used.
    #[arg(long, default_value = "")]
    pub service_account_namespace: String,
    /// Expiry time in seconds for the security token.
    #[arg(long, default_value_t = DEFAULT_TOKEN_EXPIRY_SECS, allow_negative_numbers = true)]
    pub token_expiry: i64,
    /// The starting byte offset.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub starting_offset: i64,
    /// The maximum results per record.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub max_results: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

impl ListerArgs {
    /// What to enumerate.
    pub fn query(&self) -> Query {
        let previous = if !self.previous_snapshot_id.is_empty() {
            Some(Previous::Id(self.previous_snapshot_id.clone()))
        } else if !self.previous_snapshot.is_empty() {
            Some(Previous::Name(self.previous_snapshot.clone()))
        } else {
            None
        };
        Query {
            namespace: self.namespace.clone(),
            snapshot: self.snapshot.clone(),
            previous,
            starting_offset: self.starting_offset,
            max_results: self.max_results,
        }
    }

    /// The ServiceAccount the token is for; `None`: the caller's own (validated: both parts or
    /// neither).
    pub fn service_account(&self) -> Option<ServiceAccountRef> {
        (!self.service_account.is_empty()).then(|| ServiceAccountRef {
            namespace: self.service_account_namespace.clone(),
            name: self.service_account.clone(),
        })
    }

    /// The token lifetime; 0 means upstream's default.
    pub fn token_expiry_secs(&self) -> i64 {
        if self.token_expiry == 0 {
            DEFAULT_TOKEN_EXPIRY_SECS
        } else {
            self.token_expiry
        }
    }
}

impl SidecarCli for ListerArgs {
    /// Upstream's `Args.Validate`, with its messages.
    fn validate(&self) -> Result<(), String> {
        let invalid = |what: &str| Err(format!("invalid argument: {what}"));
        match () {
            () if self.namespace.is_empty() => invalid("missing Namespace"),
            () if self.snapshot.is_empty() => invalid("missing SnapshotName"),
            () if self.token_expiry < 0 => invalid("invalid TokenExpirySecs"),
            () if self.max_results < 0 => invalid("invalid MaxResults"),
            () if self.service_account_namespace.is_empty() && !self.service_account.is_empty() => {
                invalid("SAName provided but SANamespace missing")
            }
            () if !self.service_account_namespace.is_empty() && self.service_account.is_empty() => {
                invalid("SANamespace provided but SAName missing")
            }
            () => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ListerArgs, String> {
        csi_grpc::flags::try_parse_from::<ListerArgs, _, _>(
            std::iter::once("snapshot-metadata-lister").chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn upstream_flags_short_long_and_go_style() {
        let args = parse(&[
            "-n",
            "ns",
            "-s",
            "snap-2",
            "-p",
            "snap-1",
            "-o",
            "json",
            "-max-results=3",
            "--starting-offset=4096",
            "-service-account=backup",
            "--service-account-namespace=apps",
            "--kubeconfig=/k",
        ])
        .unwrap();
        assert_eq!(
            args.query(),
            Query {
                namespace: "ns".into(),
                snapshot: "snap-2".into(),
                previous: Some(Previous::Name("snap-1".into())),
                starting_offset: 4096,
                max_results: 3,
            }
        );
        assert_eq!(args.output_format, OutputFormat::Json);
        assert_eq!(
            args.service_account(),
            Some(ServiceAccountRef {
                namespace: "apps".into(),
                name: "backup".into()
            })
        );
        assert_eq!(args.token_expiry_secs(), 600);
        assert_eq!(args.kubeconfig, Some(PathBuf::from("/k")));
    }

    #[test]
    fn the_previous_handle_takes_precedence_over_the_name() {
        let args = parse(&["-n", "ns", "-s", "b", "-p", "a", "-P", "handle-a"]).unwrap();
        assert_eq!(args.query().previous, Some(Previous::Id("handle-a".into())));
        let args = parse(&["-n", "ns", "-s", "b", "--token-expiry=0"]).unwrap();
        assert_eq!(args.query().previous, None);
        assert_eq!(args.service_account(), None);
        assert_eq!(args.token_expiry_secs(), 600);
    }

    #[test]
    fn upstream_validation_messages() {
        for (args, message) in [
            (&["-s", "b"][..], "invalid argument: missing Namespace"),
            (&["-n", "ns"][..], "invalid argument: missing SnapshotName"),
            (
                &["-n", "ns", "-s", "b", "--token-expiry=-1"][..],
                "invalid TokenExpirySecs",
            ),
            (
                &["-n", "ns", "-s", "b", "--max-results=-1"][..],
                "invalid MaxResults",
            ),
            (
                &["-n", "ns", "-s", "b", "--service-account=x"][..],
                "SAName provided but SANamespace missing",
            ),
            (
                &["-n", "ns", "-s", "b", "--service-account-namespace=x"][..],
                "SANamespace provided but SAName missing",
            ),
            (&["-n", "ns", "-s", "b", "-o", "yaml"][..], "yaml"),
        ] {
            let error = parse(args).expect_err(message);
            assert!(error.contains(message), "{args:?}: {error}");
        }
    }
}
