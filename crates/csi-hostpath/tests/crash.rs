//! Crash safety: the real `csi-hostpath` binary is SIGKILLed at random points of a burst of
//! CreateVolume/DeleteVolume calls, restarted on the same state directory, and its state is
//! checked: every acknowledged create is there with its data, every acknowledged delete is
//! gone, no creation is left half done, and no data exists without a record. Every other
//! round also leaves a half-written change at the end of the state file, as a power cut
//! in the middle of an append would.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_grpc::conn::CsiConnection;
use csi_hostpath::state::{Phase, Store, Volume};
use csi_proto::csi::v1 as csi;

fn spawn_driver(root: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .args(["--mode=controller", "--nodeid=controller"])
        .arg(format!(
            "--endpoint=unix://{}",
            root.join("csi.sock").display()
        ))
        .arg(format!("--statedir={}", root.join("state").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn client(root: &Path) -> CsiConnection {
    connect_ready(&root.join("csi.sock")).await
}

fn random_below(limit: u64) -> u64 {
    RandomState::new().hash_one(std::time::Instant::now()) % limit
}

#[tokio::test]
async fn sigkill_during_a_burst_loses_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // name → volume id, for creates the driver acknowledged and not yet deleted.
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    let mut next = 0;
    for round in 0..5 {
        let mut driver = spawn_driver(root);
        let csi = client(root).await;
        // Kill after a random delay while up to 8 calls are in flight.
        let kill_after = Duration::from_millis(50 + random_below(400));
        let started = std::time::Instant::now();
        while started.elapsed() < kill_after {
            let mut calls = Vec::new();
            for _ in 0..4 {
                next += 1;
                let name = format!("vol-{next}");
                let create = csi.create_volume(
                    create_request(&name, 1 << 20, mount(Mode::SingleNodeWriter)),
                    T,
                );
                calls.push((
                    name,
                    true,
                    Box::pin(async move { create.await.map(|r| r.volume.unwrap().volume_id) })
                        as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
                ));
            }
            let victims: Vec<(String, String)> = live
                .iter()
                .take(2)
                .map(|(n, id)| (n.clone(), id.clone()))
                .collect();
            for (name, id) in victims {
                let delete = csi.delete_volume(
                    csi::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        ..Default::default()
                    },
                    T,
                );
                calls.push((
                    name,
                    false,
                    Box::pin(async move { delete.await.map(|_| id) }),
                ));
            }
            let results = futures::future::join_all(
                calls
                    .into_iter()
                    .map(|(name, is_create, call)| async move { (name, is_create, call.await) }),
            )
            .await;
            for (name, is_create, result) in results {
                match (is_create, result) {
                    (true, Ok(id)) => {
                        live.insert(name, id);
                    }
                    (false, Ok(id)) => {
                        live.remove(&name);
                        deleted.insert(id);
                    }
                    (_, Err(status)) => panic!("{name}: {status}"),
                }
            }
            if round % 2 == 1 && started.elapsed() * 2 > kill_after {
                // Kill mid-flight: start calls and kill before they answer.
                for _ in 0..4 {
                    next += 1;
                    let csi = csi.clone();
                    let name = format!("vol-{next}");
                    tokio::spawn(async move {
                        let _ = csi
                            .create_volume(
                                create_request(&name, 1 << 20, mount(Mode::SingleNodeWriter)),
                                T,
                            )
                            .await;
                    });
                }
                tokio::time::sleep(Duration::from_millis(random_below(5))).await;
                break;
            }
        }
        driver.kill().unwrap();
        driver.wait().unwrap();
        if round % 2 == 0 {
            // A power cut in the middle of appending a change no client was told of leaves
            // part of its line: the restarted driver must ignore it and append after it.
            use std::io::Write as _;
            std::fs::OpenOptions::new()
                .append(true)
                .open(root.join("state/state.log"))
                .unwrap()
                .write_all(br#"{"volumes":{"torn-by-a-power-cut":{"id":"#)
                .unwrap();
        }
    }

    // Restart and audit.
    let mut driver = spawn_driver(root);
    let csi = client(root).await;
    let listed = csi
        .list_volumes(csi::ListVolumesRequest::default(), T)
        .await
        .unwrap();
    let listed: BTreeSet<String> = listed
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect();
    for (name, id) in &live {
        assert!(
            listed.contains(id),
            "acknowledged volume {name} ({id}) is missing after the crash"
        );
        assert!(
            root.join("state/volumes").join(id).is_dir(),
            "volume {id} lost its data"
        );
    }
    for id in &deleted {
        assert!(
            !listed.contains(id),
            "acknowledged deletion of {id} was undone"
        );
    }
    let state = Store::open(&root.join("state")).unwrap().read().unwrap();
    let recorded: BTreeSet<String> = state.volumes.keys().cloned().collect();
    for entry in std::fs::read_dir(root.join("state/volumes")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            recorded.contains(&name),
            "data {name} has no record: leaked"
        );
    }
    let unfinished: Vec<&Volume> = state
        .volumes
        .values()
        .filter(|v| v.phase != Phase::Ready)
        .collect();
    assert!(
        unfinished.is_empty(),
        "interrupted creations are rolled back and interrupted deletions finished at startup: {unfinished:?}"
    );
    eprintln!(
        "audited {} live volumes, {} deletions, {} records",
        live.len(),
        deleted.len(),
        recorded.len()
    );
    driver.kill().unwrap();
    driver.wait().unwrap();
}
