//! csi-provisioner under load: N claims (default 1000, `BENCH_CLAIMS`) created at once until all
//! are Bound, then all deleted until every PV is gone. The real `csi-provisioner` binary runs as
//! its own process against kube-sim (or the cluster of `KUBECONFIG`) and the reference driver,
//! with its default flags. Reports claims/s, p50/p99 time to Bound, API requests per volume by
//! verb and resource (counted by kube-sim per client; on a real server, all clients' requests
//! from its `apiserver_request_total`), the provisioner's peak RSS and its mean time in the
//! driver. Writes the "csi-provisioner" section of `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binary: `cargo build --release -p csi-provisioner` (`make bench` does it).
//!
//! To compare with another provisioner and driver (see `csi_suite_scenarios::bench`):
//! - `BENCH_PROVISIONER=/path/to/csi-provisioner`: that binary instead of our release build
//!   (upstream kubernetes-csi/external-provisioner takes the same flags);
//! - `BENCH_PROVISIONER_ARGS="--kube-api-qps=1000 --kube-api-burst=1000"`: extra flags;
//! - `BENCH_CSI_ENDPOINT=/path/to/socket`: a running driver (Identity, Controller and Node on
//!   that socket, e.g. csi-driver-host-path's `hostpathplugin --endpoint unix:///tmp/hp.sock
//!   --nodeid bench-node`) instead of the reference driver. The class names the driver's name
//!   (GetPluginInfo); the Node `bench-node` and its CSINode carry the node ID and topology that
//!   NodeGetInfo answers.
//!
//! The floor any provisioner is held to on a server: `BENCH_PROVISIONER` naming the
//! `provisioning_floor` example (`cargo build --release -p csi-suite-scenarios --example
//! provisioning_floor`), which only creates the PVs and deletes the Released ones;
//! `PROVISIONING_FLOOR_RECORD` adds a record of each provisioning in flight (on its claim or in
//! a Lease), to measure what one costs.
//!
//! `BENCH_BINDING_MODE=WaitForFirstConsumer` makes the class delay binding: each claim is created
//! with the `volume.kubernetes.io/selected-node` annotation the scheduler sets for a pod's claim
//! (the Node `bench-node`), so the provisioner provisions for that node's topology.
//!
//! Such a run is printed, never written to `BENCHMARKS.md`; neither is a run on a real cluster.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, DriverUnderTest, Footprint, Phase, SidecarProcess, client_requests,
    latencies, main_with_count, record, sidecar_report, timed_requests,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube_sim::roles::Role;
use serde_json::json;

const HEADING: &str = "## csi-provisioner";
const NAMESPACE: &str = "bench";
const CLASS: &str = "bench";
const DRIVER: &str = "bench.csi-suite.io";
const NODE: &str = "bench-node";
/// The provisioner's client name in kube-sim's request counts (its User-Agent).
const CLIENT: &str = "csi-provisioner";
const LIMIT: Duration = Duration::from_secs(120);
/// Claims created concurrently.
const CREATORS: usize = 64;
/// The annotation the scheduler sets on a delayed-binding claim of a pod it placed.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The class's `volumeBindingMode`: `BENCH_BINDING_MODE`, `Immediate` unless it names
/// `WaitForFirstConsumer`.
fn binding_mode() -> anyhow::Result<&'static str> {
    match std::env::var("BENCH_BINDING_MODE").as_deref() {
        Err(_) | Ok("Immediate") => Ok("Immediate"),
        Ok("WaitForFirstConsumer") => Ok("WaitForFirstConsumer"),
        Ok(other) => bail!("BENCH_BINDING_MODE={other}: Immediate or WaitForFirstConsumer"),
    }
}

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_CLAIMS", 1000, run)
}

async fn run(claims: usize) -> anyhow::Result<()> {
    let mode = binding_mode()?;
    let root = tempfile::Builder::new()
        .prefix("bench-provisioning-")
        .tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[Role::PvBinder]).await?;
    let driver = DriverUnderTest::start(root.path(), DRIVER, NODE).await?;
    let client = api.client.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    // The node the driver runs on, as its registration would have published it.
    let keys: Vec<&String> = driver.topology.keys().collect();
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": NODE, "labels": &driver.topology}}),
            )?,
        )
        .await?;
    Api::<CSINode>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE}, "spec": {"drivers": [
                {"name": &driver.name, "nodeID": &driver.node_id, "topologyKeys": keys}]}}))?,
        )
        .await?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": CLASS}, "provisioner": &driver.name,
                "reclaimPolicy": "Delete", "volumeBindingMode": mode}),
            )?,
        )
        .await?;

    // Its caches: claims, PVs, classes, CSINodes, Nodes and VolumeAttachments.
    let address = format!("--csi-address={}", driver.controller.display());
    let mut provisioner = SidecarProcess::start(CLIENT, &[address], &api, root.path(), 6).await?;

    let provision = provision_phase(&api, claims, mode).await;
    let delete = match &provision {
        Ok(_) => delete_phase(&api, &driver.name, claims).await,
        Err(_) => Err(anyhow::anyhow!("not run")),
    };
    if provision.is_err() || delete.is_err() {
        provisioner.print_log_tail();
    }
    let rss = provisioner.peak_rss_mib();
    let cpu = provisioner.cpu_seconds();
    let driver_time = provisioner
        .driver_latencies(&["CreateVolume", "DeleteVolume"])
        .await;
    provisioner.stop();
    // Only the default set-up (Immediate) is the section of BENCHMARKS.md.
    let external = provisioner.swapped() || driver.external() || mode != "Immediate";
    let setup = setup(&provisioner, &driver, api.sim.is_some());
    driver.stop().await;
    let phases = [provision?, delete?];
    let mut report = report(claims, mode, &setup, &phases, rss, provisioner.binary_mib());
    if let Some(seconds) = cpu {
        let _ = write!(
            report,
            "\nCPU time of the provisioner (user + system, both phases): {seconds:.2} s.\n"
        );
    }
    if let Some(lines) = driver_time {
        let _ = write!(
            report,
            "\nTime in the driver (mean per call, from the provisioner's `csi_sidecar_operations_seconds`): {lines}.\n"
        );
    }
    record(
        &api,
        external,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench provisioning`; the release `csi-provisioner` binary as its own process; kube-sim with the pv-binder role and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// Creates the claims at once and waits until all are Bound.
async fn provision_phase(
    server: &ApiServerUnderTest,
    claims: usize,
    mode: &str,
) -> anyhow::Result<Phase> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(server.client.clone(), NAMESPACE);
    let before = server.counts().await;
    let mut bound_at: HashMap<String, Instant> = HashMap::new();
    let watch = watcher::watcher(api.clone(), watcher::Config::default());
    let mut events = std::pin::pin!(watch);
    // The watch is open before the first create, so no Bound transition is missed.
    events.next().await;
    let delayed = mode == "WaitForFirstConsumer";
    let start = Instant::now();
    let created = timed_requests(claims, CREATORS, |i| {
        let api = api.clone();
        async move {
            let name = format!("claim-{i}");
            let annotations = if delayed {
                json!({SELECTED_NODE: NODE})
            } else {
                json!({})
            };
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Mi"}}}}))?;
            api.create(&PostParams::default(), &claim).await?;
            Ok(name)
        }
    })
    .await?;
    while bound_at.len() < claims {
        let event = tokio::time::timeout(LIMIT, events.next())
            .await
            .context("claims still unbound")?;
        let objects = match event {
            Some(Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim))) => {
                vec![claim]
            }
            Some(Ok(_)) => continue,
            Some(Err(error)) => bail!("watching claims: {error}"),
            None => bail!("the claim watch ended"),
        };
        for claim in objects {
            let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Bound") {
                bound_at
                    .entry(claim.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    }
    let elapsed = start.elapsed();
    Ok(Phase {
        name: "provision",
        elapsed,
        latencies: latencies(&created, &bound_at),
        requests: client_requests(CLIENT, before, server.counts().await),
    })
}

/// Deletes every claim and waits until every PV is gone (DeleteVolume done).
async fn delete_phase(
    server: &ApiServerUnderTest,
    driver: &str,
    claims: usize,
) -> anyhow::Result<Phase> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(server.client.clone(), NAMESPACE);
    let volumes: Api<PersistentVolume> = Api::all(server.client.clone());
    let before = server.counts().await;
    let start = Instant::now();
    timed_requests(claims, CREATORS, |i| {
        let api = api.clone();
        async move {
            let name = format!("claim-{i}");
            api.delete(&name, &DeleteParams::default()).await?;
            Ok(name)
        }
    })
    .await?;
    loop {
        let left = volumes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == driver)
            })
            .count();
        if left == 0 {
            break;
        }
        // The limit grows with the claims: 10 000 take longer to delete than 1000.
        let thousands = u32::try_from(claims.div_ceil(1000)).unwrap_or(u32::MAX);
        if start.elapsed() > LIMIT.saturating_mul(thousands) {
            bail!("{left} PVs still exist");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Phase {
        name: "delete",
        elapsed: start.elapsed(),
        latencies: Vec::new(),
        requests: client_requests(CLIENT, before, server.counts().await),
    })
}

/// Which provisioner, flags, driver and binder the run used, and whose requests are counted.
fn setup(provisioner: &SidecarProcess, driver: &DriverUnderTest, sim: bool) -> String {
    let binary = if provisioner.external {
        format!("`{}`", provisioner.binary.display())
    } else {
        "our release build".to_string()
    };
    let flags = if provisioner.extra_args.is_empty() {
        "its default flags (`--worker-threads=100`; ours has no client-side QPS limit)".to_string()
    } else {
        format!("`{}`, else its defaults", provisioner.extra_args.join(" "))
    };
    let driver = if driver.external() {
        format!(
            "the driver `{}` at `{}`",
            driver.name,
            driver.controller.display()
        )
    } else {
        "the reference driver".to_string()
    };
    let (binder, requests) = if sim {
        (
            "kube-sim's pv-binder binding the claim to the new PV, as kube-controller-manager does",
            "the provisioner's own, per volume, counted by the API server per client (its User-Agent)",
        )
    } else {
        (
            "kube-controller-manager binding the claim to the new PV",
            "every client's (provisioner, kube-controller-manager and this benchmark together: a real server counts no clients apart), per volume, from its `apiserver_request_total`",
        )
    };
    format!(
        "the provisioner is {binary} with {flags}, calling {driver}. Time to Bound includes {binder}. Deletion: all claims deleted at once, until every PV is gone (DeleteVolume done). API requests are {requests}; watches are per run, not per volume."
    )
}

fn report(
    claims: usize,
    mode: &str,
    setup: &str,
    phases: &[Phase],
    rss: Option<f64>,
    binary_mib: f64,
) -> String {
    let article = if mode == "Immediate" { "an" } else { "a" };
    let intro = format!(
        "{claims} claims of {article} {mode} class created at once by {CREATORS} concurrent clients; {setup}"
    );
    sidecar_report(
        &intro,
        claims,
        "volumes",
        "volume",
        phases,
        Footprint {
            sidecar: "csi-provisioner",
            rss,
            binary_mib,
        },
    )
}
