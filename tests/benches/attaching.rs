//! csi-attacher under load: N VolumeAttachments (default 1000, `BENCH_ATTACHMENTS`) created at
//! once until all are attached, then all deleted until every one is gone (unpublished and
//! released). The real `csi-attacher` binary runs as its own process against kube-sim (or the
//! cluster of `KUBECONFIG`) and the reference driver (or the driver at `BENCH_CSI_ENDPOINT`),
//! with its default flags. Reports
//! VolumeAttachments/s, p50/p99, API requests per VolumeAttachment by verb and resource
//! (counted by kube-sim per client) and the attacher's peak RSS. Writes the "csi-attacher"
//! section of `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binary: `cargo build --release -p csi-attacher` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use csi_suite_scenarios::bench::{
    ApiServerUnderTest, DriverUnderTest, Footprint, Phase, SidecarProcess, client_requests,
    latencies, listed_watch, main_with_count, reached, record, sidecar_report, timed_requests,
    volumes_with_pvs,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

const HEADING: &str = "## csi-attacher";
const DRIVER: &str = "bench-attach.csi-suite.io";
const NODE: &str = "bench-node";
/// The attacher's client name in kube-sim's request counts (its User-Agent).
const CLIENT: &str = "csi-attacher";
const LIMIT: Duration = Duration::from_secs(180);
/// Objects created (and deleted) concurrently.
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_ATTACHMENTS", 1000, run)
}

fn pv_name(i: usize) -> String {
    format!("bench-attach-{i}")
}

fn va_name(i: usize) -> String {
    format!("bench-attach-{i}")
}

async fn run(count: usize) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("bench-attaching-")
        .tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[]).await?;
    let driver = DriverUnderTest::start(root.path(), DRIVER, NODE).await?;
    let client = api.client.clone();
    println!("preparing {count} volumes and PVs …");
    prepare(&client, &driver, count).await?;

    // Its caches: VolumeAttachments, PVs and CSINodes.
    let address = format!("--csi-address={}", driver.controller.display());
    let mut attacher = SidecarProcess::start(CLIENT, &[address], &api, root.path(), 3).await?;
    let attach = attach_phase(&api, &driver.name, count).await;
    let detach = match &attach {
        Ok(_) => detach_phase(&api, count).await,
        Err(_) => Err(anyhow::anyhow!("not run")),
    };
    if attach.is_err() || detach.is_err() {
        attacher.print_log_tail();
    }
    let rss = attacher.peak_rss_mib();
    let cpu = attacher.cpu_seconds();
    let driver_time = attacher
        .driver_latencies(&["ControllerPublishVolume", "ControllerUnpublishVolume"])
        .await;
    attacher.stop();
    let external = attacher.swapped() || driver.external();
    driver.stop().await;
    let phases = [attach?, detach?];
    let intro = format!(
        "{count} VolumeAttachments (one PV each, one node) created at once by {CLIENTS} concurrent clients, as the attach-detach controller would; the attacher runs with its default flags (`--worker-threads=10` per lane, no client-side QPS limit). Attach: until every VolumeAttachment is `attached`. Detach: all deleted at once, until every one is gone (ControllerUnpublishVolume done, finalizer removed). API requests are the attacher's own, per VolumeAttachment, counted by the API server per client (its User-Agent); watches are per run."
    );
    let mut report = sidecar_report(
        &intro,
        count,
        "VolumeAttachments",
        "VolumeAttachment",
        &phases,
        Footprint {
            sidecar: "csi-attacher",
            rss,
            binary_mib: attacher.binary_mib(),
        },
    );
    if let Some(seconds) = cpu {
        let _ = write!(
            report,
            "\nCPU time of the attacher (user + system, both phases): {seconds:.2} s.\n"
        );
    }
    if let Some(lines) = driver_time {
        let _ = write!(
            report,
            "\nTime in the driver (mean per call, from the attacher's `csi_sidecar_operations_seconds`): {lines}. With the default `--worker-threads=10`, ten calls are in flight per lane, so the rate is close to 10 / (time per call): the driver and the worker count bound it, not the API.\n"
        );
    }
    record(
        &api,
        external,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench attaching`; the release `csi-attacher` binary as its own process; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// The volumes at the driver, their PVs, and the node's CSINode (as registration writes it).
async fn prepare(client: &Client, driver: &DriverUnderTest, count: usize) -> anyhow::Result<()> {
    Api::<CSINode>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE}, "spec": {"drivers": [
                {"name": &driver.name, "nodeID": &driver.node_id}]}}))?,
        )
        .await?;
    let csi = driver.controller_connection().await?;
    volumes_with_pvs(client, &csi, &driver.name, count, CLIENTS, pv_name, None).await
}

/// Creates the VolumeAttachments at once and waits until all are attached.
async fn attach_phase(
    server: &ApiServerUnderTest,
    driver: &str,
    count: usize,
) -> anyhow::Result<Phase> {
    let api: Api<VolumeAttachment> = Api::all(server.client.clone());
    let before = server.counts().await;
    let mut events = std::pin::pin!(listed_watch(&api).await);
    let start = Instant::now();
    let created = timed_requests(count, CLIENTS, |i| {
        let api = api.clone();
        async move {
            let va: VolumeAttachment = serde_json::from_value(json!({
                "metadata": {"name": va_name(i)},
                "spec": {"attacher": driver, "nodeName": NODE,
                    "source": {"persistentVolumeName": pv_name(i)}}}))?;
            api.create(&PostParams::default(), &va).await?;
            Ok(va_name(i))
        }
    })
    .await?;
    let attached_at = reached(&mut events, count, "attached", LIMIT, |event| match event {
        watcher::Event::Apply(va) if va.status.as_ref().is_some_and(|s| s.attached) => {
            Some(va.name_any())
        }
        _ => None,
    })
    .await?;
    Ok(Phase {
        name: "attach",
        elapsed: start.elapsed(),
        latencies: latencies(&created, &attached_at),
        requests: client_requests(CLIENT, before, server.counts().await),
    })
}

/// Deletes every VolumeAttachment at once and waits until all are gone.
async fn detach_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Phase> {
    let api: Api<VolumeAttachment> = Api::all(server.client.clone());
    let before = server.counts().await;
    let mut events = std::pin::pin!(listed_watch(&api).await);
    let start = Instant::now();
    let deleted = timed_requests(count, CLIENTS, |i| {
        let api = api.clone();
        async move {
            api.delete(&va_name(i), &DeleteParams::default()).await?;
            Ok(va_name(i))
        }
    })
    .await?;
    let gone_at = reached(&mut events, count, "detached", LIMIT, |event| match event {
        watcher::Event::Delete(va) => Some(va.name_any()),
        _ => None,
    })
    .await?;
    Ok(Phase {
        name: "detach",
        elapsed: start.elapsed(),
        latencies: latencies(&deleted, &gone_at),
        requests: client_requests(CLIENT, before, server.counts().await),
    })
}
