//! Changed block tracking through the real pipeline: a block volume written through the device
//! its pod is given, snapshots cut by the snapshot-controller and csi-snapshotter, the
//! csi-snapshot-metadata sidecar serving the driver's SnapshotMetadata over TLS, and a backup
//! application reading through snapshot-metadata-lister's library (the binary's output once).
//! The allocated blocks and the delta between two snapshots are exactly what was written;
//! upstream's refusals (a caller without the grant, a token for another audience, garbage, a
//! missing or unready snapshot) with its codes and messages; the driver's error passed through;
//! a snapshot deleted while streamed and a client that goes away leave nothing behind.

use std::ops::Range;
use std::path::PathBuf;

use csi_inventory::snapshot_metadata::client::{
    Lister, ListerError, MetadataStream, SecurityToken, connect,
};
use csi_inventory::snapshot_metadata::emit::Record;
use csi_inventory::snapshot_metadata::flags::ListerArgs;
use csi_inventory::snapshot_metadata::resolve::{Previous, Query, ServiceAccountRef};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::fixtures::{cut_snapshot, install_cbt_crds, install_snapshot_crds};
use csi_suite_scenarios::snapshot_metadata::{
    BACKUP, INTRUDER, MetadataSidecar, block_claim, block_device, joined, write_blocks, written,
};
use csi_suite_scenarios::{Cluster, Sidecar, logs, skip_without_root};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;
use tonic::Code;

const MI: u64 = 1 << 20;
const KI: u64 = 1 << 10;
/// The block volume's size.
const SIZE: &str = "4Mi";
/// A volume whose delta takes a while to read.
const BIG: &str = "512Mi";

/// A scenario's cluster with everything a backup needs: the snapshot pipeline, the sidecar and
/// its SnapshotMetadataService, the backup accounts, and the claim `disk` published to a pod.
struct Backup {
    cluster: Cluster,
    sidecars: Vec<Sidecar>,
    metadata: MetadataSidecar,
    lister: Lister,
    class: String,
    /// The device of `disk` in its pod.
    device: PathBuf,
}

impl Backup {
    /// `None` (after the named skip) where the scenario cannot run: without root (loop
    /// devices), or where the server lacks TokenRequest, TokenReview or SubjectAccessReview.
    async fn start(scenario: &str, size: &str) -> Option<Self> {
        if skip_without_root() {
            return None;
        }
        let cluster = Cluster::start(scenario).await;
        if !cluster.serves_token_reviews().await {
            cluster.stop().await;
            return None;
        }
        install_snapshot_crds(&cluster.client).await;
        install_cbt_crds(&cluster.client).await;
        let sidecars = vec![
            cluster.start_provisioner().await,
            cluster.start_attacher().await,
            cluster.start_snapshot_controller(),
            cluster.start_snapshotter().await,
        ];
        let class = cluster
            .storage_class("block", "Immediate", "Delete", json!({}))
            .await;
        let claims = cluster.namespaced::<PersistentVolumeClaim>();
        cluster
            .create(&claims, block_claim("disk", &class, size))
            .await;
        let device = block_device(&cluster, "app", "node-a", "disk").await;
        let metadata = cluster.start_snapshot_metadata().await;
        cluster.backup_accounts().await;
        let lister = Lister::new(cluster.client.clone());
        Some(Self {
            cluster,
            sidecars,
            metadata,
            lister,
            class,
            device,
        })
    }

    /// Deletes the scenario's snapshots while the controllers run (their finalizers would hold
    /// the namespace), then stops everything.
    async fn stop(self) {
        let snapshots = self.cluster.namespaced::<VolumeSnapshot>();
        let listed = snapshots
            .list(&Default::default())
            .await
            .expect("listing the snapshots");
        for snapshot in listed.items {
            let name = snapshot.metadata.name.unwrap_or_default();
            self.cluster
                .delete_and_wait(&snapshots, &name, "the snapshot deleted")
                .await;
        }
        let _link = self.metadata.stop().await;
        for sidecar in self.sidecars {
            sidecar.stop().await;
        }
        self.cluster.stop().await;
    }

    fn account(&self, name: &str) -> ServiceAccountRef {
        ServiceAccountRef {
            namespace: self.cluster.namespace.clone(),
            name: name.to_string(),
        }
    }

    fn query(&self, snapshot: &str, previous: Option<Previous>) -> Query {
        Query {
            namespace: self.cluster.namespace.clone(),
            snapshot: snapshot.to_string(),
            previous,
            starting_offset: 0,
            max_results: 0,
        }
    }

    /// Opens the stream of `query` as the backup application.
    async fn open(&self, query: &Query) -> Result<MetadataStream, ListerError> {
        self.lister
            .open(query, Some(self.account(BACKUP)), 600)
            .await
    }

    /// Every record of `query`, read as the backup application.
    async fn records(&self, query: &Query) -> Vec<Record> {
        let mut stream = self.open(query).await.expect("the stream opens");
        let mut records = Vec::new();
        while let Some(record) = stream.next().await.expect("the next record") {
            records.push(record);
        }
        records
    }

    /// A snapshot of `disk`, ready; the CSI handle of its content.
    async fn snapshot(&self, name: &str) -> String {
        let content = cut_snapshot(&self.cluster, &self.cluster.namespace, name, "disk").await;
        let content = self
            .cluster
            .cluster_scoped::<VolumeSnapshotContent>()
            .get(&content)
            .await
            .expect("the snapshot's content");
        content
            .status
            .and_then(|s| s.snapshot_handle)
            .expect("a ready content has a handle")
    }

    /// A token of the backup application for the service's audience.
    async fn token(&self) -> SecurityToken {
        let audience = &self.metadata.service.spec.audience;
        self.lister
            .token(&self.account(BACKUP), audience, 600)
            .await
            .expect("a token")
    }

    /// The gRPC status the sidecar answers `query` with when the call carries `token`.
    async fn refusal(&self, token: &SecurityToken, query: &Query) -> tonic::Status {
        let client = connect(&self.metadata.service)
            .await
            .expect("a client of the service");
        refused(MetadataStream::open(client, token, query, None).await).await
    }
}

/// The status a call fails with, when it is opened or later in its stream.
async fn refused(opened: Result<MetadataStream, ListerError>) -> tonic::Status {
    let error = match opened {
        Err(error) => error,
        Ok(mut stream) => loop {
            match stream.next().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("{stream:?} was answered"),
                Err(error) => break error,
            }
        },
    };
    error
        .status()
        .cloned()
        .unwrap_or_else(|| panic!("not a gRPC status: {error}"))
}

/// The byte ranges of `records`, joined.
fn ranges(records: &[Record]) -> Vec<Range<u64>> {
    joined(records.iter().flat_map(|record| {
        record.block_metadata.iter().map(|block| {
            let start = u64::try_from(block.byte_offset).expect("an offset");
            start..start + u64::try_from(block.size_bytes).expect("a size")
        })
    }))
}

/// `len` bytes of `fill`.
fn block(fill: u8, len: u64) -> Vec<u8> {
    vec![fill; usize::try_from(len).unwrap()]
}

/// The first writes: 64 KiB at the start, 8 KiB at 1 MiB, 8 KiB at 3 MiB + 4 KiB.
fn first_writes() -> Vec<(u64, Vec<u8>)> {
    vec![
        (0, block(0x11, 64 * KI)),
        (MI, block(0x22, 8 * KI)),
        (3 * MI + 4 * KI, block(0x33, 8 * KI)),
    ]
}

/// A backup application reads the allocated blocks of the first snapshot, exactly what was
/// written (through the library and as the lister binary prints them), and the blocks changed
/// by the next writes, by the previous snapshot's name and by its handle: a block rewritten
/// with the bytes it had is no change; from a starting offset, nothing before it.
#[tokio::test]
async fn a_backup_reads_the_allocated_blocks_then_only_the_changed_ones() {
    let Some(backup) = Backup::start("cbt-blocks", SIZE).await else {
        return;
    };
    let writes = first_writes();
    write_blocks(&backup.device, &writes);
    let first = backup.snapshot("first").await;

    let allocated = backup.records(&backup.query("first", None)).await;
    assert_eq!(ranges(&allocated), written(&writes));
    for record in &allocated {
        assert_eq!(record.volume_capacity_bytes, 4 * MI as i64);
    }

    // The binary's output, as upstream's table.
    let mut argv = vec![
        "snapshot-metadata-lister".to_string(),
        "-n".into(),
        backup.cluster.namespace.clone(),
        "-s".into(),
        "first".into(),
        format!("--service-account={BACKUP}"),
        format!("--service-account-namespace={}", backup.cluster.namespace),
    ];
    argv.extend(backup.cluster.kubeconfig_args());
    let args = csi_grpc::flags::try_parse_from::<ListerArgs, _, _>(argv.clone())
        .expect("the lister's flags");
    let mut table = Vec::new();
    let records = csi_inventory::snapshot_metadata::client::run(&args, &mut table)
        .await
        .expect("the lister lists");
    assert_eq!(records, 1);
    assert_eq!(
        String::from_utf8(table).unwrap(),
        "Record#   VolCapBytes  BlockMetadataType   ByteOffset     SizeBytes\n\
         ------- -------------- ----------------- -------------- --------------\n      \
         1        4194304   VARIABLE_LENGTH              0          65536\n      \
         1        4194304   VARIABLE_LENGTH        1048576           8192\n      \
         1        4194304   VARIABLE_LENGTH        3149824           8192\n"
    );

    let changes = vec![
        (16 * KI, block(0x44, 4 * KI)),
        (2 * MI, block(0x55, 4 * KI)),
        // The bytes it had: no change.
        (MI, block(0x22, 4 * KI)),
    ];
    write_blocks(&backup.device, &changes);
    backup.snapshot("second").await;
    let changed = vec![16 * KI..20 * KI, 2 * MI..2 * MI + 4 * KI];
    let by_name = Some(Previous::Name("first".into()));
    let delta = backup.records(&backup.query("second", by_name)).await;
    assert_eq!(ranges(&delta), changed);
    let by_handle = Some(Previous::Id(first.clone()));
    let delta = backup.records(&backup.query("second", by_handle)).await;
    assert_eq!(ranges(&delta), changed);

    // The delta as the binary's JSON.
    argv[4] = "second".into();
    argv.extend(["-P".to_string(), first, "-o".into(), "json".into()]);
    let args =
        csi_grpc::flags::try_parse_from::<ListerArgs, _, _>(argv).expect("the lister's flags");
    let mut json = Vec::new();
    csi_inventory::snapshot_metadata::client::run(&args, &mut json)
        .await
        .expect("the lister lists");
    let listed: serde_json::Value = serde_json::from_slice(&json).expect("a JSON list");
    let blocks: Vec<_> = listed
        .as_array()
        .expect("a list of records")
        .iter()
        .flat_map(|record| {
            record["block_metadata"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        blocks,
        vec![
            json!({"byte_offset": 16 * KI, "size_bytes": 4 * KI}),
            json!({"byte_offset": 2 * MI, "size_bytes": 4 * KI})
        ]
    );

    let mut from_2m = backup.query("second", None);
    from_2m.starting_offset = (2 * MI) as i64;
    let tail = backup.records(&from_2m).await;
    assert_eq!(
        ranges(&tail),
        vec![2 * MI..2 * MI + 4 * KI, 3 * MI + 4 * KI..3 * MI + 12 * KI]
    );
    backup.stop().await;
}

/// The sidecar authenticates every call's token (TokenReview, the object's audience) and
/// authorizes its user (SubjectAccessReview, get volumesnapshots in the namespace), with
/// upstream's codes and messages: no grant → PermissionDenied, a token for another audience or
/// garbage → Unauthenticated, no token → InvalidArgument.
#[tokio::test]
async fn callers_are_authenticated_and_authorized() {
    let Some(backup) = Backup::start("cbt-callers", SIZE).await else {
        return;
    };
    write_blocks(&backup.device, &first_writes());
    backup.snapshot("first").await;
    let query = backup.query("first", None);

    let denied = backup
        .lister
        .open(&query, Some(backup.account(INTRUDER)), 600)
        .await;
    let status = refused(denied).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("user does not have permissions to perform the operation"),
        "{status:?}"
    );

    let other_audience = backup
        .lister
        .token(&backup.account(BACKUP), "another-audience", 600)
        .await
        .expect("a token");
    for token in [other_audience, SecurityToken::new("garbage")] {
        let status = backup.refusal(&token, &query).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert_eq!(status.message(), "unauthenticated user");
    }
    let status = backup.refusal(&SecurityToken::new(""), &query).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "securityToken is missing");

    // The right token works on the same connection path.
    let token = backup.token().await;
    let client = connect(&backup.metadata.service).await.expect("a client");
    let mut stream = MetadataStream::open(client, &token, &query, None)
        .await
        .expect("the stream opens");
    assert!(stream.next().await.expect("a record").is_some());
    backup.stop().await;
}

/// A snapshot that does not exist or is not ready is Unavailable with upstream's message (and
/// the lister says so before calling when it resolves a previous snapshot's name); a delta
/// whose base is a snapshot of another volume gets the driver's own error, passed through.
#[tokio::test]
async fn unusable_snapshots_are_refused_and_the_drivers_error_passed_through() {
    let Some(backup) = Backup::start("cbt-refusals", SIZE).await else {
        return;
    };
    let cluster = &backup.cluster;
    write_blocks(&backup.device, &first_writes());
    let first = backup.snapshot("first").await;
    let token = backup.token().await;

    let status = backup.refusal(&token, &backup.query("missing", None)).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().starts_with(&format!(
            "failed to get VolumeSnapshot '{}/missing'",
            cluster.namespace
        )),
        "{status:?}"
    );

    // A snapshot of a claim that does not exist is never ready.
    cluster
        .create(
            &cluster.namespaced::<VolumeSnapshot>(),
            json!({"metadata": {"name": "pending"},
                "spec": {"source": {"persistentVolumeClaimName": "ghost"}}}),
        )
        .await;
    let status = backup.refusal(&token, &backup.query("pending", None)).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status.message(),
        "the VolumeSnapshot is not yet ready, name: pending"
    );
    let by_name = backup
        .open(&backup.query("first", Some(Previous::Name("pending".into()))))
        .await;
    assert!(
        matches!(&by_name, Err(ListerError::Resolve(_))),
        "the lister resolves the name first"
    );

    // The base of a delta from another volume: the driver's answer, as the driver gives it.
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            block_claim("other", &backup.class, SIZE),
        )
        .await;
    let other = cut_snapshot(cluster, &cluster.namespace, "other-snap", "other").await;
    let other = cluster
        .cluster_scoped::<VolumeSnapshotContent>()
        .get(&other)
        .await
        .expect("the other content")
        .status
        .and_then(|s| s.snapshot_handle)
        .expect("a handle");
    let mut driver = csi::snapshot_metadata_client::SnapshotMetadataClient::new(
        cluster.driver.controller.csi.channel(),
    );
    let direct = driver
        .get_metadata_delta(csi::GetMetadataDeltaRequest {
            base_snapshot_id: other.clone(),
            target_snapshot_id: first,
            ..Default::default()
        })
        .await;
    let expected = match direct {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("the driver answered a delta across volumes"),
                    Err(status) => break status,
                }
            }
        }
    };
    let relayed = backup
        .open(&backup.query("first", Some(Previous::Id(other))))
        .await;
    let status = refused(relayed).await;
    assert_eq!(
        (status.code(), status.message()),
        (expected.code(), expected.message())
    );
    backup.stop().await;
}

/// 64 separate 4 KiB blocks, every other one.
fn scattered_writes() -> Vec<(u64, Vec<u8>)> {
    (0..64u8)
        .map(|i| (u64::from(i) * 8 * KI, block(i + 1, 4 * KI)))
        .collect()
}

/// The files this process holds open whose path contains `text` (the driver runs in it).
fn open_files_with(text: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .expect("this process's descriptors")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|path| path.to_string_lossy().contains(text))
        .collect()
}

/// A VolumeSnapshot deleted (with its content and the driver's snapshot) while its blocks are
/// streamed one per message: the stream completes with the snapshot as it was or fails with a
/// status that says why, and afterwards nothing holds the deleted snapshot's data open and the
/// sidecar answers the next call that the snapshot is gone.
#[tokio::test]
async fn a_snapshot_deleted_while_streamed_leaves_nothing_behind() {
    let Some(backup) = Backup::start("cbt-deleted", SIZE).await else {
        return;
    };
    let cluster = &backup.cluster;
    let writes = scattered_writes();
    write_blocks(&backup.device, &writes);
    let handle = backup.snapshot("first").await;
    let mut query = backup.query("first", None);
    query.max_results = 1;
    let mut stream = backup.open(&query).await.expect("the stream opens");
    let first = stream
        .next()
        .await
        .expect("the first record")
        .expect("a record");
    assert_eq!(first.block_metadata.len(), 1);

    cluster
        .delete_and_wait(
            &cluster.namespaced::<VolumeSnapshot>(),
            "first",
            "the snapshot deleted",
        )
        .await;
    cluster
        .eventually_async("the driver's snapshot deleted", || async {
            let listed = cluster
                .driver
                .controller
                .csi
                .list_snapshots(
                    csi::ListSnapshotsRequest::default(),
                    std::time::Duration::from_secs(10),
                )
                .await
                .expect("ListSnapshots");
            !listed
                .entries
                .iter()
                .filter_map(|e| e.snapshot.as_ref())
                .any(|s| s.snapshot_id == handle)
        })
        .await;
    let mut records = vec![first];
    let ended = loop {
        match stream.next().await {
            Ok(Some(record)) => records.push(record),
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    match ended {
        None => assert_eq!(ranges(&records), written(&writes), "the snapshot as it was"),
        Some(error) => {
            let status = error.status().expect("a gRPC status");
            assert!(
                !matches!(status.code(), Code::Ok | Code::Unknown) && !status.message().is_empty(),
                "a clear failure: {status:?}"
            );
        }
    }
    drop(stream);
    cluster
        .eventually("nothing holds the snapshot's data open", || {
            open_files_with(&handle).is_empty()
        })
        .await;
    let token = backup.token().await;
    let status = backup.refusal(&token, &backup.query("first", None)).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    backup.stop().await;
}

/// A backup that goes away after the first message: the sidecar's request ends (its metrics
/// count it once: Canceled, with its log saying the client went away, when the driver was still
/// comparing; OK when the driver had already sent everything into the flow-control windows on
/// the way, which a loaded machine can make happen), the driver closes both images, and the
/// sidecar serves the next request. The delta reads 1 GiB (both images) before its second
/// change, to give the client's going away time to reach the driver.
#[tokio::test]
async fn a_client_that_goes_away_stops_the_sidecar_and_the_driver() {
    let logs = logs::capture("csi_snapshot_metadata=info");
    let Some(backup) = Backup::start("cbt-cancel", BIG).await else {
        return;
    };
    let cluster = &backup.cluster;
    let full: Vec<(u64, Vec<u8>)> = (0..512).map(|i| (i * MI, block(0xab, MI))).collect();
    write_blocks(&backup.device, &full);
    let base = backup.snapshot("full").await;
    write_blocks(
        &backup.device,
        &[
            (0, block(0x01, 4 * KI)),
            (512 * MI - 4 * KI, block(0x02, 4 * KI)),
        ],
    );
    let target = backup.snapshot("changed").await;
    let mut query = backup.query("changed", Some(Previous::Name("full".into())));
    query.max_results = 1;
    let mut stream = backup.open(&query).await.expect("the stream opens");
    let first = stream
        .next()
        .await
        .expect("the first record")
        .expect("a record");
    assert_eq!(ranges(&[first]), vec![0..4 * KI]);
    drop(stream);
    let target_label = format!("target_snapshot=\"{}/changed\"", cluster.namespace);
    let ended = |metrics: &str| -> Vec<String> {
        metrics
            .lines()
            .filter(|line| {
                line.starts_with("snapshot_metadata_controller_operations_seconds_count")
                    && line.contains(&target_label)
            })
            .map(str::to_string)
            .collect()
    };
    cluster
        .eventually_async("the sidecar's request ended", || async {
            !ended(&backup.metadata.metrics().await).is_empty()
        })
        .await;
    let samples = ended(&backup.metadata.metrics().await);
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert!(samples[0].ends_with(" 1"), "{samples:?}");
    if samples[0].contains("grpc_status_code=\"Canceled\"") {
        assert_eq!(logs.count("the client went away"), 1);
    } else {
        assert!(
            samples[0].contains("grpc_status_code=\"OK\""),
            "{samples:?}"
        );
    }
    cluster
        .eventually("the driver closed both images", || {
            open_files_with(&base).is_empty() && open_files_with(&target).is_empty()
        })
        .await;
    let again = backup.records(&backup.query("changed", None)).await;
    assert_eq!(ranges(&again), vec![0..512 * MI], "the sidecar serves on");
    backup.stop().await;
}
