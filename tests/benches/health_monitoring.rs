//! csi-health-monitor against N bound volumes (default 100, `BENCH_VOLUMES`), one in ten of
//! which loses its data behind the driver's back, then gets it back: until every such claim has
//! its Warning `VolumeConditionAbnormal`, through a steady stretch of passes with the condition
//! unchanged, and until every one has its Normal `VolumeConditionNormal`. The release
//! `csi-health-monitor` runs as its own process against kube-sim (or the cluster of
//! `KUBECONFIG`) and the reference driver serving the VolumeCondition of CSI v1.12 (what
//! upstream's external-health-monitor v0.18 reads; `BENCH_VOLUME_HEALTH=v1.13` serves the v1.13
//! RPCs instead), listing every `PASS` (2 s); `BENCH_HEALTH_MONITOR` (and `_ARGS`) runs another
//! binary instead, e.g. upstream's. Reports the time to every Event, the API requests per
//! monitored volume in each phase (the steady phase: what each pass costs with nothing new to
//! tell) and the peak RSS. `BENCH_DUMP=/path/file.json` writes every Event of the run's claims
//! (type, reason, message, count), for comparison with another implementation. Writes the
//! "csi-health-monitor" section of `BENCHMARKS.md`. Nothing asserts a timing.
//!
//! Needs the binary: `cargo build --release -p csi-health-monitor` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use csi_health_monitor::health::{ABNORMAL, NORMAL};
use csi_hostpath::health::HealthApi;
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, BoundClaims, Footprint, Phase, SidecarProcess, client_requests,
    crds_and_namespace, main_with_count, record, sidecar_report, start_with_reference_driver,
    volumes_with_pvs,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const HEADING: &str = "## csi-health-monitor";
const DRIVER: &str = "bench-health.csi-suite.io";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench-health";
/// The interval of the monitor's passes in this benchmark.
const PASS: Duration = Duration::from_secs(2);
/// Passes of the steady phase.
const STEADY_PASSES: u32 = 5;
/// One volume in this many loses its data.
const SICK_EVERY: usize = 10;
/// The longest wait for every Event of a phase.
const LIMIT: Duration = Duration::from_secs(120);
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_VOLUMES", 100, run)
}

fn name(i: usize) -> String {
    format!("bench-health-{i}")
}

async fn run(count: usize) -> anyhow::Result<()> {
    let api_version = match std::env::var("BENCH_VOLUME_HEALTH").as_deref() {
        Ok("v1.13") => HealthApi::V1_13,
        _ => HealthApi::V1_12,
    };
    let (root, api, driver) =
        start_with_reference_driver("bench-health-", DRIVER, NODE, |config| {
            config.volume_health = api_version;
        })
        .await?;
    println!("preparing {count} volumes, PVs and bound claims …");
    crds_and_namespace(&api.client, Vec::new(), NAMESPACE).await?;
    let bound = BoundClaims {
        namespace: NAMESPACE,
        class: "",
        status: json!({"phase": "Bound"}),
    };
    volumes_with_pvs(
        &api.client,
        &driver.controller.csi,
        DRIVER,
        count,
        CLIENTS,
        name,
        Some(bound),
    )
    .await?;
    // The monitor watches Bound PVs: bound here as the PV controller would (kube-sim runs no
    // binder for this benchmark).
    let pvs: Api<PersistentVolume> = Api::all(api.client.clone());
    futures::stream::iter(0..count)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                let bound = json!({"status": {"phase": "Bound"}});
                pvs.patch_status(&name(i), &PatchParams::default(), &Patch::Merge(&bound))
                    .await
            }
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let store = csi_hostpath::state::Store::open(&driver.state_dir)?;
    let state = store.read()?;
    let sick: Vec<(String, std::path::PathBuf)> = (0..count)
        .step_by(SICK_EVERY)
        .filter_map(|i| {
            let volume = state.volumes.values().find(|v| v.name == name(i))?;
            let data = store.volume_data(&volume.id, volume.layout());
            Some((name(i), data))
        })
        .collect();

    let address = format!(
        "--csi-address={}",
        driver.controller.endpoint.path().display()
    );
    let interval = format!("{}s", PASS.as_secs());
    let args = [
        address,
        format!("--list-volumes-interval={interval}"),
        format!("--monitor-interval={interval}"),
    ];
    let mut monitor =
        SidecarProcess::start("csi-health-monitor", &args, &api, root.path(), 1).await?;
    let client = monitor.client();
    let phases = async {
        let abnormal = phase(&api, &client, "abnormal", &sick, ABNORMAL, |data| {
            std::fs::rename(data, data.with_extension("away"))
        })
        .await?;
        let before = api.counts().await;
        let start = Instant::now();
        tokio::time::sleep(PASS * STEADY_PASSES).await;
        let steady = Phase {
            name: "steady",
            elapsed: start.elapsed(),
            latencies: Vec::new(),
            requests: client_requests(&client, before, api.counts().await),
        };
        let recovered = phase(&api, &client, "recovered", &sick, NORMAL, |data| {
            std::fs::rename(data.with_extension("away"), data)
        })
        .await?;
        if let Some(path) = std::env::var_os("BENCH_DUMP") {
            dump(&api, std::path::Path::new(&path)).await?;
        }
        anyhow::Ok(vec![abnormal, steady, recovered])
    }
    .await;
    if phases.is_err() {
        monitor.print_log_tail();
    }
    let rss = monitor.peak_rss_mib();
    monitor.stop();
    driver.stop().await;
    let phases = phases?;
    let generation = match api_version {
        HealthApi::V1_12 => "CSI v1.12's VolumeCondition",
        _ => "CSI v1.13's health RPCs",
    };
    let intro = format!(
        "{count} bound volumes of a driver serving {generation}, the monitor passing every {interval} (`--list-volumes-interval`, `--monitor-interval`); one volume in {SICK_EVERY} ({}) loses its data behind the driver's back (abnormal: until every such claim has `{ABNORMAL}`), stays so for {STEADY_PASSES} passes (steady), then gets it back (recovered: until every one has `{NORMAL}`). API requests are the monitor's own, per monitored volume, counted by the API server per client (its User-Agent); watches are per run.",
        sick.len()
    );
    let report = sidecar_report(
        &intro,
        count,
        "volumes",
        "volume",
        &phases,
        Footprint {
            sidecar: "csi-health-monitor",
            rss,
            binary_mib: monitor.binary_mib(),
        },
    );
    record(
        &api,
        monitor.swapped(),
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench health_monitoring`; the release `csi-health-monitor` as its own process; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// Does `change` to each sick volume's data, and waits until each claim has an Event `reason`;
/// the latencies from the change to the Event.
async fn phase(
    api: &ApiServerUnderTest,
    client: &str,
    name: &'static str,
    sick: &[(String, std::path::PathBuf)],
    reason: &str,
    change: impl Fn(&std::path::Path) -> std::io::Result<()>,
) -> anyhow::Result<Phase> {
    let before = api.counts().await;
    let start = Instant::now();
    for (_, data) in sick {
        change(data)?;
    }
    let events: Api<Event> = Api::namespaced(api.client.clone(), NAMESPACE);
    let mut told: HashMap<String, Instant> = HashMap::new();
    while told.len() < sick.len() {
        if start.elapsed() > LIMIT {
            anyhow::bail!("{} claims still without {reason}", sick.len() - told.len());
        }
        for event in events.list(&ListParams::default()).await?.items {
            if event.reason.as_deref() == Some(reason)
                && let Some(claim) = event.involved_object.name
            {
                told.entry(claim).or_insert_with(Instant::now);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut latencies: Vec<Duration> = told.values().map(|at| *at - start).collect();
    latencies.sort();
    Ok(Phase {
        name,
        elapsed: start.elapsed(),
        latencies,
        requests: client_requests(client, before, api.counts().await),
    })
}

/// Every Event of the run's claims: type, reason, message and count, sorted.
async fn dump(api: &ApiServerUnderTest, path: &std::path::Path) -> anyhow::Result<()> {
    let events: Api<Event> = Api::namespaced(api.client.clone(), NAMESPACE);
    let mut lines: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{} {} {} {}: {} (count {}, from {})",
                e.involved_object.name.unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.involved_object.kind.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or(1),
                e.source.and_then(|s| s.component).unwrap_or_default(),
            )
        })
        .collect();
    lines.sort();
    std::fs::write(path, lines.join("\n") + "\n")?;
    println!("the Events: {}", path.display());
    Ok(())
}
