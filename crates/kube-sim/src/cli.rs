//! The `kube-sim` command line: `serve` (API server only), `roles` (cluster roles against any
//! cluster, real or simulated) and `up` (both, like a tiny kind).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::ApiServer;
use crate::roles::{self, Role, RoleError, RolesConfig, Timing};

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("listening on 127.0.0.1:{port}: {source}")]
    Listen {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Role(#[from] RoleError),
}

/// kube-sim: an in-process Kubernetes API server and cluster-role simulators for the CSI suite.
#[derive(Parser, Debug)]
#[command(name = "kube-sim", version)]
pub struct Args {
    #[command(flatten)]
    pub common: csi_grpc::flags::CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the API on 127.0.0.1 until SIGTERM/SIGINT (kubectl --server http://127.0.0.1:PORT).
    Serve {
        #[arg(long, default_value = "8080")]
        port: u16,
    },
    /// Run cluster roles against the cluster of --kubeconfig (real or simulated).
    Roles(RolesArgs),
    /// API server plus every role; writes a kubeconfig and prints its path.
    Up(UpArgs),
}

#[derive(ClapArgs, Debug)]
pub struct NodeArgs {
    /// Simulated nodes, one kubelet each.
    #[arg(long, value_delimiter = ',', default_value = "node-a,node-b,node-c")]
    pub nodes: Vec<String>,
    /// Directory under which each kubelet gets `<root>/<node>` (its /var/lib/kubelet).
    #[arg(long, default_value = "/var/lib/kube-sim")]
    pub root: PathBuf,
    /// A CSI driver endpoint every kubelet registers directly (no registration socket);
    /// `{node}` is replaced by the node name.
    #[arg(long)]
    pub driver_endpoint: Option<String>,
    /// Node heartbeat (Lease renewal) interval.
    #[arg(long, default_value = "10s", value_parser = csi_kinds::go_duration::parse_go_duration)]
    pub heartbeat_interval: Duration,
    /// Silence after which a node is Unknown and tainted unreachable.
    #[arg(long, default_value = "40s", value_parser = csi_kinds::go_duration::parse_go_duration)]
    pub node_monitor_grace_period: Duration,
}

impl NodeArgs {
    fn config(&self, roles: Vec<Role>) -> RolesConfig {
        RolesConfig {
            roles,
            nodes: self.nodes.clone(),
            root: self.root.clone(),
            driver_endpoint: self.driver_endpoint.clone(),
            timing: Timing {
                heartbeat_interval: self.heartbeat_interval,
                node_grace_period: self.node_monitor_grace_period,
                ..Timing::default()
            },
        }
    }
}

#[derive(ClapArgs, Debug)]
pub struct RolesArgs {
    #[command(flatten)]
    pub kube: csi_sidecar::flags::KubeArgs,
    /// Roles to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kubelet,pv-binder,scheduler,attach-detach,node-lifecycle"
    )]
    pub roles: Vec<Role>,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

#[derive(ClapArgs, Debug)]
pub struct UpArgs {
    /// API server port (0: any free port).
    #[arg(long, default_value = "0")]
    pub port: u16,
    #[command(flatten)]
    pub nodes: NodeArgs,
}

pub async fn serve(port: u16, shutdown: CancellationToken) -> Result<(), CliError> {
    let server = listen(port).await?;
    tracing::info!(address = %server.addr, "kube-sim serving; kubectl --server http://{}", server.addr);
    shutdown.cancelled().await;
    server.stop();
    Ok(())
}

pub async fn roles(args: &RolesArgs, shutdown: CancellationToken) -> Result<(), CliError> {
    let client = csi_sidecar::kube::client(&args.kube)
        .await
        .map_err(|source| CliError::Kubeconfig {
            path: args.kube.kubeconfig.clone(),
            source: Box::new(source),
        })?;
    let running = roles::start(
        client,
        &args.nodes.config(args.roles.clone()),
        shutdown.clone(),
    )
    .await?;
    tracing::info!(roles = ?args.roles, nodes = ?args.nodes.nodes, "roles running");
    shutdown.cancelled().await;
    for kubelet in &running.kubelets {
        kubelet.stop().await;
    }
    Ok(())
}

pub async fn up(args: &UpArgs, shutdown: CancellationToken) -> Result<(), CliError> {
    let server = listen(args.port).await?;
    std::fs::create_dir_all(&args.nodes.root).map_err(|source| CliError::Write {
        path: args.nodes.root.clone(),
        source,
    })?;
    let kubeconfig = args.nodes.root.join("kubeconfig");
    write_kubeconfig(&kubeconfig, server.addr)?;
    let running = roles::start(
        server.client(),
        &args.nodes.config(Role::ALL.to_vec()),
        shutdown.clone(),
    )
    .await?;
    tracing::info!(address = %server.addr, nodes = ?args.nodes.nodes, "kube-sim is up");
    announce(&kubeconfig);
    shutdown.cancelled().await;
    for kubelet in &running.kubelets {
        kubelet.stop().await;
    }
    server.stop();
    Ok(())
}

#[allow(
    clippy::print_stdout,
    reason = "`kube-sim up` prints the kubeconfig path for scripts"
)]
fn announce(kubeconfig: &Path) {
    println!("{}", kubeconfig.display());
}

async fn listen(port: u16) -> Result<ApiServer, CliError> {
    ApiServer::start_on(&format!("127.0.0.1:{port}"))
        .await
        .map_err(|source| CliError::Listen { port, source })
}

/// A kubeconfig for a plain-HTTP API server at `address`.
pub fn kubeconfig_yaml(address: std::net::SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: http://{address}\ncontexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\ncurrent-context: kube-sim\nusers:\n- name: kube-sim\n  user: {{}}\n"
    )
}

fn write_kubeconfig(path: &Path, address: std::net::SocketAddr) -> Result<(), CliError> {
    std::fs::write(path, kubeconfig_yaml(address)).map_err(|source| CliError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_flags() {
        let args = Args::try_parse_from([
            "kube-sim",
            "roles",
            "--kubeconfig",
            "/k",
            "--roles",
            "kubelet,scheduler",
            "--nodes",
            "a,b",
            "--root",
            "/r",
            "--node-monitor-grace-period",
            "2s",
        ])
        .unwrap();
        let Command::Roles(roles) = args.command else {
            panic!("roles subcommand");
        };
        assert_eq!(roles.roles, [Role::Kubelet, Role::Scheduler]);
        let config = roles.nodes.config(roles.roles.clone());
        assert_eq!(config.nodes, ["a", "b"]);
        assert_eq!(config.timing.node_grace_period, Duration::from_secs(2));
        assert_eq!(config.timing.heartbeat_interval, Duration::from_secs(10));
        let error =
            Args::try_parse_from(["kube-sim", "roles", "--roles", "kubeproxy"]).unwrap_err();
        assert!(error.to_string().contains("unknown role"), "{error}");
    }

    #[test]
    fn kubeconfig_parses() {
        let text = kubeconfig_yaml("127.0.0.1:6443".parse().unwrap());
        let config = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("kube-sim"));
        assert_eq!(
            config.clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .server
                .as_deref(),
            Some("http://127.0.0.1:6443")
        );
    }
}
