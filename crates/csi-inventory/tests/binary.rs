//! The `csi-inventory` binary as operators run it: against kube-sim (through a kubeconfig)
//! and the reference driver's controller socket. A clean inventory exits 0; orphans and
//! missing volumes exit 3 with a report (paged with `--max-entries=2`, progress on stderr);
//! `import` prints (`--dry-run`) or creates the PV and refuses a second one; `--serve` serves
//! the findings as gauges; garbage on the socket is a clear error, exit 1. A volume whose data
//! is gone is reported abnormal from a v1.13 driver's health RPCs and from a v1.12 driver's
//! volume conditions alike.

use std::path::Path;
use std::process::{Command, Output};

use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube_sim_harness::{eventually, free_address, http_get, spawn};
use serde_json::json;

const DRIVER: &str = "bin.inventory.test";
const MI: i64 = 1 << 20;

fn inventory(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_csi-inventory"))
        .args(args)
        .output()
        .expect("csi-inventory runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn create_volume(driver: &LocalCluster, name: &str) -> String {
    csi_hostpath::local::create_plain_volume(
        &driver.controller.csi,
        name,
        MI,
        std::time::Duration::from_secs(30),
    )
    .await
    .unwrap()
    .volume_id
}

fn flags(socket: &Path, kubeconfig: &Path) -> Vec<String> {
    vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ]
}

fn with(mut base: Vec<String>, first: &[&str], rest: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = first.iter().map(|s| s.to_string()).collect();
    args.append(&mut base);
    args.extend(rest.iter().map(|s| s.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread")]
async fn reports_exit_codes_imports_and_serves() {
    let root = tempfile::tempdir().unwrap();
    let (sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(root.path()).await;
    let client = sim.client();
    let driver = LocalCluster::start(root.path(), &["node-a"], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await
    .unwrap();
    let base = flags(driver.controller.endpoint.path(), &kubeconfig);

    let clean = inventory(&with(base.clone(), &["report"], &[]));
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stderr));
    assert!(
        text(&clean.stdout).contains("Clean"),
        "{}",
        text(&clean.stdout)
    );

    let mut ids = Vec::new();
    for n in 0..25 {
        ids.push(create_volume(&driver, &format!("vol-{n}")).await);
    }
    let post = PostParams::default();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (name, handle) in [("pv-kept", ids[0].as_str()), ("pv-lost", "no-such-volume")] {
        pvs.create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "inventoried",
                    "csi": {"driver": DRIVER, "volumeHandle": handle}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    }
    let found = inventory(&with(
        base.clone(),
        &["report"],
        &["--max-entries=2", "-o", "json"],
    ));
    assert_eq!(found.status.code(), Some(3), "{}", text(&found.stderr));
    let report: serde_json::Value = serde_json::from_slice(&found.stdout).unwrap();
    assert_eq!(report["volumesOnStorage"], 25, "every page was read");
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "orphaned").count(), 24);
    assert_eq!(kinds.iter().filter(|k| **k == "missing").count(), 1);
    assert_eq!(report["classes"]["inventoried"]["persistentVolumes"], 2);
    assert!(
        text(&found.stderr).contains("ListVolumes: 24 entries in 12 pages so far"),
        "progress on stderr: {}",
        text(&found.stderr)
    );

    Api::<StorageClass>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "inventoried"},
                "provisioner": DRIVER, "parameters": {"csi.storage.k8s.io/fstype": "ext4"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let import = |extra: &[&str]| {
        let mut rest = vec![
            ids[1].as_str(),
            "--name=pv-imported",
            "--storage-class=inventoried",
        ];
        rest.extend(extra);
        inventory(&with(base.clone(), &["import"], &rest))
    };
    let dry = import(&["--dry-run", "--claim=shop/data"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
    let printed = text(&dry.stdout);
    assert!(
        printed.contains(&format!("volumeHandle: {}", ids[1])),
        "{printed}"
    );
    assert!(
        printed.contains("fsType: ext4") && printed.contains("name: data"),
        "{printed}"
    );
    assert!(
        pvs.get_opt("pv-imported").await.unwrap().is_none(),
        "a dry run creates nothing"
    );
    let created = import(&[]);
    assert_eq!(created.status.code(), Some(0), "{}", text(&created.stderr));
    assert!(text(&created.stdout).contains("persistentvolume/pv-imported created"));
    let imported = pvs.get("pv-imported").await.unwrap().spec.unwrap();
    assert_eq!(imported.csi.unwrap().volume_handle, ids[1]);
    assert_eq!(
        imported.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    let again = import(&[]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("already has the PersistentVolume pv-imported"),
        "{}",
        text(&again.stderr)
    );

    let address = free_address();
    let _served = spawn(
        env!("CARGO_BIN_EXE_csi-inventory"),
        with(
            base.clone(),
            &["report", "--serve"],
            &[&format!("--http-endpoint={address}"), "--scan-interval=1s"],
        ),
    );
    eventually("the findings served as gauges", || async move {
        let (status, body) = http_get(address, "/metrics").await?;
        (status == 200
            && body.contains("csi_inventory_findings{kind=\"orphaned\"} 23")
            && body.contains("csi_inventory_findings{kind=\"missing\"} 1")
            && body.contains("csi_sidecar_operations_seconds_count{driver_name=\"bin.inventory.test\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/ListVolumes\""))
        .then_some(())
    })
    .await;

    let garbage = root.path().join("garbage.sock");
    let listener = std::os::unix::net::UnixListener::bind(&garbage).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            use std::io::Write;
            let mut stream = stream;
            let _ = stream.write_all(b"this is not HTTP/2\n");
        }
    });
    let refused = inventory(&with(
        flags(&garbage, &kubeconfig),
        &["report"],
        &["--timeout=2s"],
    ));
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("CSI driver"),
        "{}",
        text(&refused.stderr)
    );
}

/// A volume whose data is gone is reported abnormal with the driver's reason, whichever volume
/// health API the driver serves: CSI v1.13's ControllerListVolumeHealth, or v1.12's
/// `volume_condition` in ListVolumes.
async fn an_abnormal_volume_is_reported(api: csi_hostpath::health::HealthApi, reason: &str) {
    let root = tempfile::tempdir().unwrap();
    let (_sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(root.path()).await;
    let driver = LocalCluster::start(root.path(), &["node-a"], |config| {
        config.driver_name = DRIVER.to_string();
        config.volume_health = api;
    })
    .await
    .unwrap();
    // One healthy volume beside it: only the sick one is abnormal.
    create_volume(&driver, "healthy").await;
    let sick = create_volume(&driver, "sick").await;
    let data = csi_hostpath::state::Store::open(&driver.state_dir)
        .unwrap()
        .volume_data(&sick, csi_hostpath::state::Layout::Directory);
    std::fs::remove_dir_all(&data).expect("the volume's data removed");

    let base = flags(driver.controller.endpoint.path(), &kubeconfig);
    let found = inventory(&with(base, &["report"], &["-o", "json"]));
    assert_eq!(found.status.code(), Some(3), "{}", text(&found.stderr));
    let report: serde_json::Value = serde_json::from_slice(&found.stdout).unwrap();
    let abnormal: Vec<&serde_json::Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "abnormal")
        .collect();
    assert_eq!(abnormal.len(), 1, "{report:#}");
    assert_eq!(abnormal[0]["volumeId"], sick.as_str());
    let message = abnormal[0]["message"].as_str().unwrap();
    assert!(message.contains(reason), "{message}");
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abnormal_volume_of_a_v1_13_driver_is_reported() {
    an_abnormal_volume_is_reported(csi_hostpath::health::HealthApi::V1_13, "VolumeDataMissing")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abnormal_volume_of_a_v1_12_driver_is_reported() {
    an_abnormal_volume_is_reported(csi_hostpath::health::HealthApi::V1_12, "VolumeDataMissing")
        .await;
}
