//! The SnapshotMetadata service of the real driver over its Unix socket: streams of several
//! messages, starting offsets, the spec's error codes, a client that goes away and a snapshot
//! deleted while its stream runs. The volumes' images are written directly (no mounts, no root).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use csi::snapshot_metadata_client::SnapshotMetadataClient;
use csi::volume_capability::access_mode::Mode;
use csi_grpc::conn::{CsiChannel, CsiConnection};
use csi_hostpath::local::LocalCluster;
use csi_proto::csi::v1 as csi;
use tonic::{Code, Status};

const KIB: i64 = 1 << 10;
const MIB: i64 = 1 << 20;

async fn block_volume(c: &CsiConnection, name: &str, bytes: i64) -> String {
    c.create_volume(
        create_request(name, bytes, block(Mode::SingleNodeWriter)),
        T,
    )
    .await
    .unwrap()
    .volume
    .unwrap()
    .volume_id
}

async fn snapshot(c: &CsiConnection, name: &str, volume: &str) -> String {
    let request = csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: volume.into(),
        ..Default::default()
    };
    c.create_snapshot(request, T)
        .await
        .unwrap()
        .snapshot
        .unwrap()
        .snapshot_id
}

fn image(cluster: &LocalCluster, volume: &str) -> PathBuf {
    cluster
        .state_dir
        .join("volumes")
        .join(format!("{volume}.img"))
}

fn snapshot_image(cluster: &LocalCluster, snapshot: &str) -> PathBuf {
    cluster
        .state_dir
        .join("snapshots")
        .join(format!("{snapshot}.img"))
}

/// Writes `length` bytes of `byte` at each offset, as a tenant of the volume would.
fn write(path: &Path, offsets: impl IntoIterator<Item = i64>, length: i64, byte: u8) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let bytes = vec![byte; length as usize];
    for at in offsets {
        file.write_all_at(&bytes, at as u64).unwrap();
    }
    file.sync_all().unwrap();
}

fn client(c: &CsiConnection) -> SnapshotMetadataClient<CsiChannel> {
    SnapshotMetadataClient::new(c.channel())
}

fn allocated(snapshot: &str, offset: i64, max: i32) -> csi::GetMetadataAllocatedRequest {
    csi::GetMetadataAllocatedRequest {
        snapshot_id: snapshot.into(),
        starting_offset: offset,
        max_results: max,
        secrets: [("key".to_string(), "secret-value".to_string())].into(),
    }
}

fn delta(base: &str, target: &str, offset: i64, max: i32) -> csi::GetMetadataDeltaRequest {
    csi::GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        starting_offset: offset,
        max_results: max,
        secrets: Default::default(),
    }
}

/// What one message of either RPC says: type, capacity, tuples.
type Message = (i32, i64, Vec<(i64, i64)>);

fn tuples(list: &[csi::BlockMetadata]) -> Vec<(i64, i64)> {
    list.iter().map(|t| (t.byte_offset, t.size_bytes)).collect()
}

/// Every message of a stream, as (type, capacity, tuples).
async fn collect<M>(
    started: Result<tonic::Response<tonic::Streaming<M>>, Status>,
    says: fn(&M) -> Message,
) -> Result<Vec<Message>, Status> {
    let mut stream = started?.into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await? {
        messages.push(says(&message));
    }
    Ok(messages)
}

async fn all_allocated(
    c: &CsiConnection,
    request: csi::GetMetadataAllocatedRequest,
) -> Result<Vec<Message>, Status> {
    let started = client(c).get_metadata_allocated(request).await;
    collect(started, |m| {
        let list = tuples(&m.block_metadata);
        (m.block_metadata_type, m.volume_capacity_bytes, list)
    })
    .await
}

async fn all_delta(
    c: &CsiConnection,
    request: csi::GetMetadataDeltaRequest,
) -> Result<Vec<Message>, Status> {
    let started = client(c).get_metadata_delta(request).await;
    collect(started, |m| {
        let list = tuples(&m.block_metadata);
        (m.block_metadata_type, m.volume_capacity_bytes, list)
    })
    .await
}

/// The tuples of a stream, checked against the spec: every message of the type and capacity
/// given and at most `max` tuples, the tuples ascending and apart.
fn checked(messages: &[Message], capacity: i64, max: usize) -> Vec<(i64, i64)> {
    let variable = csi::BlockMetadataType::VariableLength as i32;
    for (kind, bytes, list) in messages {
        assert_eq!((*kind, *bytes), (variable, capacity));
        assert!(list.len() <= max, "{} tuples, max {max}", list.len());
    }
    let all: Vec<_> = messages.iter().flat_map(|m| m.2.clone()).collect();
    for pair in all.windows(2) {
        assert!(pair[0].0 + pair[0].1 < pair[1].0, "{pair:?}");
    }
    all
}

/// File descriptors of this process (whose driver instances run in it) open on `path`,
/// deleted or not.
fn open_fds_to(path: &Path) -> usize {
    let deleted = format!("{} (deleted)", path.display());
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target == path || target.to_string_lossy() == deleted)
        .count()
}

/// Waits (bounded) until nothing holds `path` open.
async fn closed(path: &Path) -> bool {
    for _ in 0..200 {
        if open_fds_to(path) == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn allocated_and_changed_ranges_stream_in_several_messages() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let capacity = 64 * MIB;
    let volume = block_volume(c, "cbt", capacity).await;
    let data = image(&cluster, &volume);
    // 100 extents of 4 KiB, 512 KiB apart.
    let extents: Vec<i64> = (0..100).map(|i| i * 512 * KIB).collect();
    write(&data, extents.iter().copied(), 4 * KIB, 1);
    let first = snapshot(c, "first", &volume).await;
    // Every other extent rewritten with the same bytes (unchanged), every third with others,
    // and a new extent.
    write(&data, extents.iter().copied().step_by(2), 4 * KIB, 1);
    let rewritten: Vec<i64> = extents.iter().copied().step_by(3).collect();
    write(&data, rewritten.iter().copied(), 4 * KIB, 2);
    write(&data, [60 * MIB], 8 * KIB, 3);
    let second = snapshot(c, "second", &volume).await;

    // Allocated: 100 extents in messages of at most 7.
    let messages = all_allocated(c, allocated(&first, 0, 7)).await.unwrap();
    assert_eq!(messages.len(), 15);
    let all = checked(&messages, capacity, 7);
    let want: Vec<_> = extents.iter().map(|at| (*at, 4 * KIB)).collect();
    assert_eq!(all, want);
    // From the middle of extent 50: it starts there.
    let from = 50 * 512 * KIB + 100;
    let messages = all_allocated(c, allocated(&first, from, 0)).await.unwrap();
    let all = checked(&messages, capacity, 256);
    assert_eq!(all[0], (from, 4 * KIB - 100));
    assert_eq!(all[1..], want[51..]);

    // Delta: the extents written with other bytes and the new one.
    let mut changed: Vec<_> = rewritten.iter().map(|at| (*at, 4 * KIB)).collect();
    changed.push((60 * MIB, 8 * KIB));
    let messages = all_delta(c, delta(&first, &second, 0, 0)).await.unwrap();
    assert_eq!(checked(&messages, capacity, 256), changed);
    let messages = all_delta(c, delta(&first, &second, 0, 1)).await.unwrap();
    assert_eq!(messages.len(), changed.len());
    assert_eq!(checked(&messages, capacity, 1), changed);
    // From inside a changed extent: that extent, from its block.
    let from = rewritten[11] + 5;
    let messages = all_delta(c, delta(&first, &second, from, 0)).await.unwrap();
    assert_eq!(checked(&messages, capacity, 256), changed[11..]);
    // Nothing changed, or nothing past the offset: one message without tuples.
    for request in [
        delta(&first, &first, 0, 0),
        delta(&first, &second, 61 * MIB, 0),
        delta(&first, &second, capacity, 0),
    ] {
        let messages = all_delta(c, request).await.unwrap();
        assert_eq!(messages.len(), 1);
        assert!(checked(&messages, capacity, 256).is_empty());
    }
    cluster.stop().await;
}

#[tokio::test]
async fn an_ext4_volume_is_answered_from_its_image() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let mut capability = mount(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut capability.access_type {
        m.fs_type = "ext4".into();
    }
    let capacity = 32 * MIB;
    let volume = c
        .create_volume(create_request("ext4", capacity, capability), T)
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let formatted = snapshot(c, "formatted", &volume).await;
    // The filesystem's metadata is allocated, not the whole image.
    let messages = all_allocated(c, allocated(&formatted, 0, 0)).await.unwrap();
    let all = checked(&messages, capacity, 256);
    let bytes: i64 = all.iter().map(|t| t.1).sum();
    assert!(0 < bytes && bytes < capacity, "{bytes} bytes allocated");
    write(&image(&cluster, &volume), [30 * MIB], 4 * KIB, 9);
    let written = snapshot(c, "written", &volume).await;
    let messages = all_delta(c, delta(&formatted, &written, 0, 0))
        .await
        .unwrap();
    assert_eq!(checked(&messages, capacity, 256), [(30 * MIB, 4 * KIB)]);
    cluster.stop().await;
}

#[tokio::test]
async fn refusals_carry_the_spec_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let volume = block_volume(c, "one", 4 * MIB).await;
    let other = block_volume(c, "two", 4 * MIB).await;
    let first = snapshot(c, "first", &volume).await;
    let second = snapshot(c, "second", &volume).await;
    let elsewhere = snapshot(c, "elsewhere", &other).await;
    let directory = create(c, "directory", 4 * MIB).await.volume_id;
    let tarred = snapshot(c, "tarred", &directory).await;

    let table = [
        (allocated("", 0, 0), Code::InvalidArgument),
        (allocated(&first, 0, -1), Code::InvalidArgument),
        (allocated(&first, -1, 0), Code::OutOfRange),
        (allocated(&first, 4 * MIB + 1, 0), Code::OutOfRange),
        (allocated("unknown", 0, 0), Code::NotFound),
        (allocated(&tarred, 0, 0), Code::FailedPrecondition),
    ];
    for (request, want) in table {
        let got = all_allocated(c, request.clone()).await;
        assert_eq!(code(got), want, "{request:?}");
    }
    let table = [
        (delta("", &second, 0, 0), Code::InvalidArgument),
        (delta(&first, "", 0, 0), Code::InvalidArgument),
        (delta(&first, &second, 0, -3), Code::InvalidArgument),
        (delta(&first, &elsewhere, 0, 0), Code::InvalidArgument),
        (delta(&second, &first, 0, 0), Code::InvalidArgument),
        (delta(&first, &second, -4096, 0), Code::OutOfRange),
        (delta(&first, &second, 4 * MIB + 1, 0), Code::OutOfRange),
        (delta("unknown", &second, 0, 0), Code::NotFound),
        (delta(&first, "unknown", 0, 0), Code::NotFound),
        (delta(&tarred, &tarred, 0, 0), Code::FailedPrecondition),
    ];
    for (request, want) in table {
        let got = all_delta(c, request.clone()).await;
        assert_eq!(code(got), want, "{request:?}");
    }
    let status = all_delta(c, delta(&first, &elsewhere, 0, 0))
        .await
        .unwrap_err();
    assert!(
        status
            .message()
            .contains("not snapshots of the same volume"),
        "{}",
        status.message()
    );

    // Served and advertised by controllers only.
    let services = |node: bool| csi_grpc::conn::Services {
        plugin: true,
        controller: !node,
        node,
    };
    let plugin = csi_grpc::conn::DriverInfo::discover(c, T, services(false))
        .await
        .unwrap();
    assert!(plugin.plugin.snapshot_metadata_service);
    let node = &cluster.node("node-a").csi;
    let on_node = csi_grpc::conn::DriverInfo::discover(node, T, services(true))
        .await
        .unwrap();
    assert!(!on_node.plugin.snapshot_metadata_service);
    assert_eq!(
        code(all_allocated(node, allocated(&first, 0, 0)).await),
        Code::Unimplemented
    );
    cluster.stop().await;
}

/// What a test of a running stream has: the snapshot (`count` extents of 4 KiB, 16 KiB
/// apart), its image, its extents, and its GetMetadataAllocated stream of `max` tuples a
/// message, started.
struct Streaming {
    snapshot: String,
    image: PathBuf,
    extents: Vec<(i64, i64)>,
    stream: tonic::Streaming<csi::GetMetadataAllocatedResponse>,
}

async fn streaming(cluster: &LocalCluster, count: i64, max: i32) -> Streaming {
    let c = &cluster.controller.csi;
    let volume = block_volume(c, "many", 64 * MIB).await;
    let offsets: Vec<i64> = (0..count).map(|i| i * 16 * KIB).collect();
    write(
        &image(cluster, &volume),
        offsets.iter().copied(),
        4 * KIB,
        7,
    );
    let snapshot = snapshot(c, "many", &volume).await;
    let stream = client(c)
        .get_metadata_allocated(allocated(&snapshot, 0, max))
        .await
        .unwrap()
        .into_inner();
    Streaming {
        image: snapshot_image(cluster, &snapshot),
        snapshot,
        extents: offsets.iter().map(|at| (*at, 4 * KIB)).collect(),
        stream,
    }
}

#[tokio::test]
async fn a_client_that_goes_away_stops_the_stream_and_its_reading() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let mut running = streaming(&cluster, 2000, 1).await;
    for want in running.extents[..2].iter().copied() {
        let message = running.stream.message().await.unwrap().unwrap();
        assert_eq!(tuples(&message.block_metadata), [want]);
    }
    let (id, path, extents) = (&running.snapshot, &running.image, &running.extents);
    assert_eq!(open_fds_to(path), 1, "the stream reads the image");
    drop(running.stream);
    assert!(closed(path).await, "the image is still open");
    // The driver serves on.
    let c = &cluster.controller.csi;
    let messages = all_allocated(c, allocated(id, extents[1999].0, 0))
        .await
        .unwrap();
    assert_eq!(checked(&messages, 64 * MIB, 256), extents[1999..]);
    cluster.stop().await;
}

#[tokio::test]
async fn a_snapshot_deleted_while_streamed_is_streamed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let Streaming {
        snapshot: id,
        image: path,
        extents,
        mut stream,
    } = streaming(&cluster, 500, 10).await;
    let mut got = tuples(&stream.message().await.unwrap().unwrap().block_metadata);
    let c = &cluster.controller.csi;
    c.delete_snapshot(
        csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        },
        T,
    )
    .await
    .unwrap();
    assert!(!path.exists(), "deleted");
    while let Some(message) = stream.message().await.unwrap() {
        got.extend(tuples(&message.block_metadata));
    }
    assert_eq!(got, extents);
    assert_eq!(open_fds_to(&path), 0, "closed when the stream ended");
    assert_eq!(
        code(all_allocated(c, allocated(&id, 0, 0)).await),
        Code::NotFound
    );
    cluster.stop().await;
}
