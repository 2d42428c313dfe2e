//! Changed block tracking in a scenario: block volumes written through the device their pod
//! is given, the csi-snapshot-metadata sidecar run as its binary runs (its own flags, a
//! certificate made for it), the driver's SnapshotMetadataService object, and two backup
//! applications' ServiceAccounts: one allowed to read the namespace's VolumeSnapshots, one not.

use std::net::SocketAddr;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use csi_kinds::cbt::SnapshotMetadataService;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::Cluster;
use crate::csi_proxy::CsiProxy;
use crate::fixtures::is_running;

/// The backup application allowed to `get` the namespace's VolumeSnapshots.
pub const BACKUP: &str = "backup";
/// A ServiceAccount of the namespace without any grant.
pub const INTRUDER: &str = "intruder";

/// A claim of `size` in volume mode Block.
pub fn block_claim(name: &str, class: &str, size: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageClassName": class,
        "accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
        "resources": {"requests": {"storage": size}}}})
}

/// A pod on `node` given the block claim `claim` as the device `/dev/xvda`.
pub fn block_pod(name: &str, node: &str, claim: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        "terminationGracePeriodSeconds": 5}})
}

/// Runs pod `name` on `node` with the block claim `claim` and returns the device its kubelet
/// published (what the container sees as `/dev/xvda`).
pub async fn block_device(cluster: &Cluster, name: &str, node: &str, claim: &str) -> PathBuf {
    let pods = cluster.namespaced::<Pod>();
    let node = cluster.node(node);
    cluster.create(&pods, block_pod(name, &node, claim)).await;
    let pod = cluster
        .wait_for(
            &pods,
            name,
            "the pod with the block device Running",
            is_running,
        )
        .await;
    let volume = crate::fixtures::volume_of(cluster, claim).await;
    kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(&node),
        &pod.uid().expect("a pod has a uid"),
        &volume,
        true,
    )
}

/// Writes each `(offset, bytes)` to `device` and flushes them to the volume.
pub fn write_blocks(device: &Path, writes: &[(u64, Vec<u8>)]) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .unwrap_or_else(|e| panic!("opening {}: {e}", device.display()));
    for (offset, bytes) in writes {
        file.write_all_at(bytes, *offset)
            .unwrap_or_else(|e| panic!("writing {} at {offset}: {e}", device.display()));
    }
    file.sync_all().expect("flushing the device");
}

/// `len` bytes of `device` from `offset`.
pub fn read_block(device: &Path, offset: u64, len: u64) -> Vec<u8> {
    let file =
        std::fs::File::open(device).unwrap_or_else(|e| panic!("opening {}: {e}", device.display()));
    let mut bytes = vec![0; usize::try_from(len).expect("a block fits in memory")];
    file.read_exact_at(&mut bytes, offset)
        .unwrap_or_else(|e| panic!("reading {} at {offset}: {e}", device.display()));
    bytes
}

/// Byte ranges sorted, with overlapping and adjacent ones joined: two listings of the same
/// bytes compare equal however they were cut into tuples.
pub fn joined(ranges: impl IntoIterator<Item = Range<u64>>) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for range in ranges {
        match out.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => out.push(range),
        }
    }
    out
}

/// The ranges of `writes`, joined.
pub fn written(writes: &[(u64, Vec<u8>)]) -> Vec<Range<u64>> {
    joined(
        writes
            .iter()
            .map(|(offset, bytes)| *offset..*offset + bytes.len() as u64),
    )
}

/// The sidecar's key and certificate for `localhost` and `127.0.0.1`, and the CA that signed
/// them (its PEM is the SnapshotMetadataService's `caCert`): csi-grpc's TLS test key material
/// (`crates/csi-grpc/tests/fixtures/tls`, made once with openssl, never used elsewhere).
#[derive(Debug)]
pub struct Certificates {
    pub ca_pem: Vec<u8>,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn certificates() -> Certificates {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/csi-grpc/tests/fixtures/tls");
    Certificates {
        ca_pem: std::fs::read(dir.join("ca.pem")).expect("the test CA"),
        cert: dir.join("server-1.pem"),
        key: dir.join("server-1-key.pem"),
    }
}

/// csi-snapshot-metadata running in this process as its binary runs, and the driver's
/// SnapshotMetadataService pointing at it.
#[derive(Debug)]
pub struct MetadataSidecar {
    pub service: SnapshotMetadataService,
    /// Its diagnostics server (`/metrics`).
    pub http: SocketAddr,
    /// Its way to the driver (see [`MetadataSidecar::stop`]).
    link: CsiProxy,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl MetadataSidecar {
    /// Stops the sidecar and returns its link to the driver, to be dropped last: like its
    /// binary, the sidecar exits the process once its driver connection is lost, so that
    /// connection goes through a proxy that outlives the driver (which [`Cluster::stop`] stops)
    /// and is dropped only when nothing runs any more.
    pub async fn stop(self) -> CsiProxy {
        self.shutdown.cancel();
        let _ = self.task.await;
        self.link
    }

    /// Its metrics text.
    pub async fn metrics(&self) -> String {
        let (status, text) = kube_sim_harness::http_get(self.http, "/metrics")
            .await
            .expect("the sidecar's metrics");
        assert_eq!(status, 200, "{text}");
        text
    }
}

impl Cluster {
    /// Whether the server issues ServiceAccount tokens on request (`serviceaccounts/token`, with
    /// its service-account issuer configured) and reviews them and access (TokenReview,
    /// SubjectAccessReview), as the SnapshotMetadata API needs; reports the scenario's skip
    /// when not.
    pub async fn serves_token_reviews(&self) -> bool {
        let core = match self.client.list_core_api_resources("v1").await {
            Ok(list) => list
                .resources
                .iter()
                .any(|r| r.name == "serviceaccounts/token"),
            Err(error) => panic!("discovery of v1: {error}"),
        };
        if !core {
            crate::report_skip(&self.scenario, "v1 serviceaccounts/token not served");
            return false;
        }
        self.serves("authentication.k8s.io/v1", "tokenreviews")
            .await
            && self
                .serves("authorization.k8s.io/v1", "subjectaccessreviews")
                .await
    }

    /// Starts csi-snapshot-metadata against the driver's controller instance (through a
    /// proxy: see [`MetadataSidecar::stop`]; TLS with
    /// [`certificates`], a free port, no `--audience`: the object's is used), then creates
    /// the driver's SnapshotMetadataService (audience `cbt-<id>`) with the address it serves.
    pub async fn start_snapshot_metadata(&self) -> MetadataSidecar {
        let certificates = certificates();
        let link = CsiProxy::start(
            &self.root().join("sockets").join("snapshot-metadata.sock"),
            self.driver.controller.endpoint.path(),
        );
        let mut argv = vec![
            "csi-snapshot-metadata".to_string(),
            format!("--csi-address={}", link.socket.display()),
            format!("--port={}", kube_sim_harness::free_address().port()),
            format!("--tls-cert={}", certificates.cert.display()),
            format!("--tls-key={}", certificates.key.display()),
            "--http-endpoint=127.0.0.1:0".to_string(),
        ];
        argv.extend(self.kubeconfig_args());
        let args = csi_grpc::flags::try_parse_from::<
            csi_snapshot_metadata::flags::SnapshotMetadataArgs,
            _,
            _,
        >(argv)
        .expect("csi-snapshot-metadata flags");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let (started, listening) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_snapshot_metadata::run::run(args, token, Some(started)).await {
                tracing::error!(%error, "csi-snapshot-metadata stopped");
            }
        });
        let listening = tokio::time::timeout(crate::step_timeout(), listening)
            .await
            .expect("csi-snapshot-metadata serving in time")
            .expect("csi-snapshot-metadata serving (see its error above)");
        let services = self.cluster_scoped::<SnapshotMetadataService>();
        self.delete_at_cleanup::<SnapshotMetadataService>(None, &self.driver_name);
        let service = self
            .create(
                &services,
                json!({"metadata": {"name": self.driver_name}, "spec": {
                    "address": format!("127.0.0.1:{}", listening.grpc.port()),
                    "audience": format!("cbt-{}", self.id),
                    "caCert": k8s_openapi::ByteString(certificates.ca_pem)}}),
            )
            .await;
        MetadataSidecar {
            service,
            http: listening.http,
            link,
            shutdown,
            task,
        }
    }

    /// The backup applications' ServiceAccounts in the scenario's namespace: [`BACKUP`], which
    /// a Role lets get and list VolumeSnapshots, and [`INTRUDER`], which nothing grants.
    pub async fn backup_accounts(&self) {
        let accounts = self.namespaced::<ServiceAccount>();
        for account in [BACKUP, INTRUDER] {
            self.create(&accounts, json!({"metadata": {"name": account}}))
                .await;
        }
        self.create(
            &self.namespaced::<Role>(),
            json!({"metadata": {"name": BACKUP}, "rules": [{
                "apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"],
                "verbs": ["get", "list"]}]}),
        )
        .await;
        self.create(
            &self.namespaced::<RoleBinding>(),
            json!({"metadata": {"name": BACKUP},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": BACKUP},
                "subjects": [{"kind": "ServiceAccount", "name": BACKUP,
                    "namespace": self.namespace}]}),
        )
        .await;
    }
}
