//! A full state filesystem (root only: a small tmpfs is mounted as the state directory): the
//! node instances are alive, so podmon must hear that they are connected, with no I/O in
//! progress, and never a lost node it would evacuate.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use csi_proto::podmon::v1::ValidateVolumeHostConnectivityRequest;

#[tokio::test]
async fn a_full_state_disk_does_not_look_like_a_lost_node() {
    if !root_or_skip("a_full_state_disk_does_not_look_like_a_lost_node") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &state,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=8m",
    )
    .unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let volume = create(c, "io", 1 << 20).await.volume_id;

    // A tenant fills the state filesystem through its volume.
    let mut filler =
        std::fs::File::create(state.join("volumes").join(&volume).join("fill")).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let full = loop {
        if let Err(error) = filler.write_all(&chunk) {
            break error;
        }
    };
    assert_eq!(
        full.raw_os_error(),
        Some(rustix::io::Errno::NOSPC.raw_os_error())
    );
    drop(filler);

    // Longer than a heartbeat may be stale.
    tokio::time::sleep(csi_hostpath::identity::HEARTBEAT_STALE + Duration::from_secs(1)).await;
    let answer = c
        .validate_volume_host_connectivity(
            ValidateVolumeHostConnectivityRequest {
                volume_ids: vec![volume],
                node_id: "node-a".into(),
                io_sample_time_seconds: 1,
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    assert!(
        answer.connected,
        "a live node on a full disk is connected: {:?}",
        answer.messages
    );
    assert!(!answer.ios_in_progress, "{:?}", answer.messages);
    cluster.stop().await;
}
