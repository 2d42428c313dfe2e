//! csi-snapshot-metadata relaying changed block metadata (issue 59): a block volume of
//! `BENCH_CBT_MIB` MiB (default 1024) of the reference driver, half of it written in scattered
//! 64 KiB runs, snapshot 1, a quarter of it rewritten in scattered 64 KiB runs, snapshot 2; then
//! GetMetadataDelta (snapshot 1 → 2) and GetMetadataAllocated (snapshot 2) through the sidecar,
//! the client reading every streamed response. The release binary runs as its own process,
//! against kube-sim (or the cluster of `KUBECONFIG`), with the reference driver in this process.
//! With `BENCH_SNAPSHOT_METADATA=/path/to/binary` (e.g. upstream's csi-snapshot-metadata) that
//! binary runs too, by turns with ours, `BENCH_CBT_RUNS` times each (default 5), with the same
//! flags (`BENCH_SNAPSHOT_METADATA_ARGS` adds flags to both); and both answer the same list of
//! requests (allowed, denied, wrong audience, missing, not ready, ...), whose codes, messages,
//! results and times are printed side by side. The snapshots are pre-provisioned objects with
//! the status snapshot-controller would write (no controller runs); what the benchmark made in
//! the API server is deleted at its end.
//!
//! Reports medians of wall time, the sidecar's CPU seconds and peak RSS, responses, block
//! entries and bytes relayed, the sidecar's API requests per call, binary sizes, and the
//! driver's share (the same calls made straight to the driver). Only a run of ours alone on
//! kube-sim is written to the "csi-snapshot-metadata" section of `BENCHMARKS.md`. Nothing
//! asserts a timing.
//!
//! Needs the `openssl` command (the sidecar's TLS certificate) and the binary:
//! `cargo build --release -p csi-snapshot-metadata` (`make bench` does it).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_hostpath::local::LocalCluster;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_proto::csi::v1 as csi;
use csi_proto::snapshotmetadata as api;
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, Requests, SidecarProcess, client_requests, crds_and_namespace,
    create_when_served, main_with_count, record,
};
use futures::{Stream, StreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use prost::Message as _;
use serde_json::json;

const HEADING: &str = "## csi-snapshot-metadata";
const SIDECAR: &str = "csi-snapshot-metadata";
const DRIVER: &str = "bench-cbt.csi-suite.io";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench-cbt";
const AUDIENCE: &str = "bench-cbt-audience";
/// The backup application's ServiceAccount (allowed `get` on volumesnapshots in `NAMESPACE`),
/// and one without any permission.
const BACKUP: &str = "backup";
const INTRUDER: &str = "intruder";
/// The unit of writes: the base data and the rewrite are scattered runs of this size.
const RUN: u64 = 64 << 10;
/// Calls of each kind per run (the sidecar's CPU time is counted in 10 ms ticks).
const CALLS: usize = 10;
/// The measured calls: GetMetadataDelta (snapshot 1 → 2), GetMetadataAllocated (snapshot 2),
/// and the delta again with one tuple per message (the relay's cost per message; the driver's
/// scan is the same).
const KINDS: [&str; 3] = ["delta", "allocated", "delta, max_results=1"];
/// Times each side-by-side request is sent (its answer's time is their median).
const ANSWER_REPEATS: usize = 5;
/// The longest wait for one call (the whole stream).
const CALL_LIMIT: Duration = Duration::from_secs(600);

type MetadataClient =
    api::snapshot_metadata_client::SnapshotMetadataClient<tonic::transport::Channel>;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_CBT_MIB", 1024, run)
}

/// Everything the calls need, set up once for all binaries.
struct Setup {
    root: tempfile::TempDir,
    api: ApiServerUnderTest,
    driver: LocalCluster,
    tls: Tls,
    /// Tokens of `BACKUP` for `AUDIENCE`, of `BACKUP` for another audience, of `INTRUDER`.
    tokens: Tokens,
    /// CSI handles: snapshot 1 and 2 of the volume, and a snapshot of another volume.
    base_handle: String,
    other_handle: String,
    volume_bytes: u64,
    /// What was written: bytes before snapshot 1, bytes rewritten between the snapshots, bytes
    /// allocated in snapshot 2.
    written: u64,
    rewritten: u64,
    allocated: u64,
}

struct Tokens {
    backup: String,
    wrong_audience: String,
    intruder: String,
}

async fn run(mib: usize) -> anyhow::Result<()> {
    let runs: usize = std::env::var("BENCH_CBT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let other = std::env::var_os("BENCH_SNAPSHOT_METADATA").map(PathBuf::from);
    let mut binaries = vec![(SidecarProcess::ours(SIDECAR)?, false)];
    binaries.extend(other.map(|path| (path, true)));

    let setup = prepare(mib as u64 * (1 << 20)).await?;
    let result = measure(&setup, &binaries, runs).await;
    let Setup { api, driver, .. } = setup;
    driver.stop().await;
    clean_up(&api.client).await?;
    let (report, swapped) = result?;
    record(
        &api,
        swapped,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench snapshot_metadata`; the release `csi-snapshot-metadata` as its own process; kube-sim and the reference driver in the benchmark's process, all on the same CPUs)",
        &report,
    )
}

/// The API objects, the TLS certificate, the tokens, the volume, its data and its snapshots.
async fn prepare(volume_bytes: u64) -> anyhow::Result<Setup> {
    let root = tempfile::Builder::new()
        .prefix("bench-snapshot-metadata-")
        .tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[]).await?;
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await?;
    let client = api.client.clone();
    crds_and_namespace(&client, csi_kinds::snapshot::crds(), NAMESPACE).await?;
    let class: VolumeSnapshotClass = serde_json::from_value(json!({
        "metadata": {"name": "bench-cbt", "annotations": {
            "snapshot.storage.kubernetes.io/is-default-class": "true"}},
        "driver": DRIVER, "deletionPolicy": "Retain"}))?;
    create_when_served(&Api::all(client.clone()), &class).await?;
    let tokens = tokens(&client).await?;
    let tls = Tls::generate(root.path())?;

    println!("writing a {} MiB block volume …", volume_bytes >> 20);
    let csi_conn = &driver.controller.csi;
    let volume = create_block_volume(csi_conn, "bench-cbt-volume", volume_bytes).await?;
    let image = driver
        .state_dir
        .join("volumes")
        .join(format!("{}.img", volume.volume_id));
    let runs = volume_bytes / RUN;
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let base: Vec<u64> = (0..runs).filter(|_| rng.next() & 1 == 1).collect();
    write_runs(&image, &base, 1)?;
    let base_handle = create_snapshot(csi_conn, "bench-cbt-1", &volume.volume_id).await?;
    // A quarter of all runs, scattered: a partial Fisher-Yates shuffle picks them.
    let mut order: Vec<u64> = (0..runs).collect();
    let count = order.len() / 4;
    for i in 0..count {
        let j = i + (rng.next() as usize) % (order.len() - i);
        order.swap(i, j);
    }
    let mut rewrite = order[..count].to_vec();
    rewrite.sort_unstable();
    write_runs(&image, &rewrite, 2)?;
    let target_handle = create_snapshot(csi_conn, "bench-cbt-2", &volume.volume_id).await?;
    let mut allocated: Vec<u64> = base.iter().chain(&rewrite).copied().collect();
    allocated.sort_unstable();
    allocated.dedup();

    // Another volume's snapshot (a wrong base), and a snapshot whose object is not ready.
    let other = create_block_volume(csi_conn, "bench-cbt-other", 4 << 20).await?;
    let other_handle = create_snapshot(csi_conn, "bench-cbt-other", &other.volume_id).await?;
    for (name, handle, driver, ready) in [
        ("snap-1", &base_handle, DRIVER, true),
        ("snap-2", &target_handle, DRIVER, true),
        ("snap-other", &other_handle, DRIVER, true),
        ("snap-unready", &target_handle, DRIVER, false),
        ("snap-foreign", &target_handle, "foreign.csi-suite.io", true),
    ] {
        pre_provisioned(&client, name, (handle, driver), ready).await?;
    }
    Ok(Setup {
        root,
        api,
        driver,
        tls,
        tokens,
        base_handle,
        other_handle,
        volume_bytes,
        written: base.len() as u64 * RUN,
        rewritten: rewrite.len() as u64 * RUN,
        allocated: allocated.len() as u64 * RUN,
    })
}

/// Runs every binary by turns `runs` times (its process started afresh each time), then the
/// requests of [`cases`] once per binary; the report and whether another binary ran.
async fn measure(
    setup: &Setup,
    binaries: &[(PathBuf, bool)],
    runs: usize,
) -> anyhow::Result<(String, bool)> {
    let mut measured: Vec<Vec<RunResult>> = binaries.iter().map(|_| Vec::new()).collect();
    let mut answers: Vec<Vec<Answer>> = Vec::new();
    let mut driver_runs = Vec::new();
    for round in 0..runs {
        for (which, binary) in binaries.iter().enumerate() {
            println!("run {}: {}", round + 1, binary.0.display());
            let sidecar = Sidecar::start(setup, binary.clone()).await?;
            let result = sidecar.measure(setup).await;
            let result = sidecar.finish(result)?;
            measured[which].push(result);
        }
        for _ in 0..CALLS {
            driver_runs.push(driver_share(setup).await?);
        }
    }
    for binary in binaries {
        let sidecar = Sidecar::start(setup, binary.clone()).await?;
        let result = sidecar.answers(setup).await;
        answers.push(sidecar.finish(result)?);
    }
    let names: Vec<String> = binaries
        .iter()
        .map(|(path, external)| {
            if *external {
                format!("`{}`", path.display())
            } else {
                "ours".to_string()
            }
        })
        .collect();
    let sizes: Vec<f64> = binaries
        .iter()
        .map(|(path, _)| std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / 1048576.0))
        .collect();
    let report = report(
        setup,
        runs,
        &names,
        &sizes,
        &measured,
        &driver_runs,
        &answers,
    );
    Ok((report, binaries.len() > 1))
}

/// One sidecar process, and a client connected to it over TLS.
struct Sidecar {
    process: SidecarProcess,
    client: MetadataClient,
}

impl Sidecar {
    /// Starts `binary` on a free port with the flags both implementations share, and waits
    /// until it answers an allowed call.
    async fn start(setup: &Setup, binary: (PathBuf, bool)) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let args = vec![
            format!(
                "--csi-address={}",
                setup.driver.controller.endpoint.path().display()
            ),
            format!("--port={port}"),
            format!("--tls-cert={}", setup.tls.cert.display()),
            format!("--tls-key={}", setup.tls.key.display()),
            format!("--audience={AUDIENCE}"),
        ];
        let process = SidecarProcess::start_binary(
            SIDECAR,
            binary,
            &args,
            &setup.api,
            setup.root.path(),
            0,
            true,
        )
        .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let mut client = setup.tls.connect(port).await?;
                let request = allocated_request(&setup.tokens.backup, "snap-2", 0, 1);
                let mut stream = client
                    .get_metadata_allocated(request)
                    .await
                    .map_err(|status| anyhow::anyhow!("{status}"))?
                    .into_inner();
                stream
                    .next()
                    .await
                    .context("no response")?
                    .map_err(|status| anyhow::anyhow!("{status}"))?;
                Ok::<_, anyhow::Error>(client)
            };
            match attempt.await {
                Ok(client) => return Ok(Self { process, client }),
                Err(error) if Instant::now() > deadline => {
                    process.print_log_tail();
                    let mut process = process;
                    process.stop();
                    bail!("{SIDECAR} did not answer within 30 s: {error}");
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// `CALLS` times each of [`KINDS`], by turns.
    async fn measure(&self, setup: &Setup) -> anyhow::Result<RunResult> {
        let mut calls: [Vec<Call>; 3] = Default::default();
        for _ in 0..CALLS {
            for (kind, measured) in calls.iter_mut().enumerate() {
                measured.push(self.call(setup, measured_request(setup, kind)).await?);
            }
        }
        Ok(RunResult {
            calls,
            peak_rss: None,
        })
    }

    /// Times one call read to its end, with the sidecar's CPU seconds and API requests.
    async fn call(&self, setup: &Setup, request: Request) -> anyhow::Result<Call> {
        let before = setup.api.counts().await;
        let cpu = self.process.cpu_seconds();
        let start = Instant::now();
        let summary = tokio::time::timeout(CALL_LIMIT, send(self.client.clone(), request))
            .await
            .context("the call did not end")?;
        let elapsed = start.elapsed();
        let cpu = self.process.cpu_seconds().zip(cpu).map(|(a, b)| a - b);
        let after = setup.api.counts().await;
        if let Some((code, message)) = &summary.status {
            bail!("the call failed: {code:?}: {message}");
        }
        Ok(Call {
            elapsed,
            cpu,
            summary,
            requests: client_requests(&self.process.client(), before, after),
        })
    }

    /// The answers to every request of [`cases`].
    async fn answers(&self, setup: &Setup) -> anyhow::Result<Vec<Answer>> {
        let mut answers = Vec::new();
        for case in cases(setup) {
            let mut times = Vec::new();
            let mut summary = None;
            for _ in 0..ANSWER_REPEATS {
                let start = Instant::now();
                let answer = send(self.client.clone(), case.request.clone()).await;
                times.push(start.elapsed().as_secs_f64());
                summary.get_or_insert(answer);
            }
            answers.push(Answer {
                case: case.name,
                summary: summary.unwrap_or_default(),
                seconds: median(times).unwrap_or_default(),
            });
        }
        Ok(answers)
    }

    /// Stops the process (its log's tail after a failure); `result` with its peak RSS.
    fn finish<T: WithRss>(mut self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        if result.is_err() {
            self.process.print_log_tail();
        }
        let rss = self.process.peak_rss_mib();
        self.process.stop();
        result.map(|r| r.with_rss(rss))
    }
}

trait WithRss {
    fn with_rss(self, rss: Option<f64>) -> Self;
}

impl WithRss for RunResult {
    fn with_rss(mut self, rss: Option<f64>) -> Self {
        self.peak_rss = rss;
        self
    }
}

impl WithRss for Vec<Answer> {
    fn with_rss(self, _: Option<f64>) -> Self {
        self
    }
}

/// A measured run of one binary.
struct RunResult {
    /// The calls of each of [`KINDS`].
    calls: [Vec<Call>; 3],
    peak_rss: Option<f64>,
}

struct Call {
    elapsed: Duration,
    cpu: Option<f64>,
    summary: Summary,
    requests: Option<Requests>,
}

/// What a stream brought: responses, block entries, their bytes, the message bytes on the
/// wire (protobuf), the first and last entries, and how it ended.
#[derive(Default, PartialEq)]
struct Summary {
    responses: usize,
    entries: usize,
    block_bytes: i64,
    message_bytes: usize,
    first: Vec<(i64, i64)>,
    last: Vec<(i64, i64)>,
    status: Option<(tonic::Code, String)>,
}

impl Summary {
    fn failed(status: tonic::Status) -> Self {
        Self {
            status: Some((status.code(), status.message().to_string())),
            ..Self::default()
        }
    }

    fn describe(&self) -> String {
        let ending = match &self.status {
            None => "OK".to_string(),
            Some((code, message)) => format!("{code:?}: {message}"),
        };
        format!(
            "{ending}; {} responses, {} entries, {} bytes; first {:?}, last {:?}",
            self.responses, self.entries, self.block_bytes, self.first, self.last
        )
    }
}

async fn summarise(
    stream: impl Stream<Item = Result<(usize, Vec<(i64, i64)>), tonic::Status>>,
) -> Summary {
    let mut summary = Summary::default();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok((bytes, entries)) => {
                summary.responses += 1;
                summary.message_bytes += bytes;
                summary.entries += entries.len();
                summary.block_bytes += entries.iter().map(|(_, size)| size).sum::<i64>();
                if summary.first.len() < 3 {
                    summary
                        .first
                        .extend(entries.iter().take(3 - summary.first.len()));
                }
                summary.last.extend(&entries);
                let keep = summary.last.len().saturating_sub(3);
                summary.last.drain(..keep);
            }
            Err(status) => {
                summary.status = Some((status.code(), status.message().to_string()));
                break;
            }
        }
    }
    summary
}

/// Sends `request` and reads its stream to the end.
async fn send(mut client: MetadataClient, request: Request) -> Summary {
    let sizes = |r: &[api::BlockMetadata], len: usize| (len, entries(r));
    match request {
        Request::Allocated(request) => match client.get_metadata_allocated(request).await {
            Ok(stream) => {
                let stream = stream.into_inner();
                summarise(stream.map(|r| r.map(|r| sizes(&r.block_metadata, r.encoded_len()))))
                    .await
            }
            Err(status) => Summary::failed(status),
        },
        Request::Delta(request) => match client.get_metadata_delta(request).await {
            Ok(stream) => {
                let stream = stream.into_inner();
                summarise(stream.map(|r| r.map(|r| sizes(&r.block_metadata, r.encoded_len()))))
                    .await
            }
            Err(status) => Summary::failed(status),
        },
    }
}

fn entries(blocks: &[api::BlockMetadata]) -> Vec<(i64, i64)> {
    blocks
        .iter()
        .map(|b| (b.byte_offset, b.size_bytes))
        .collect()
}

/// The same calls straight to the driver: its share of the wall time (delta, allocated,
/// delta with `max_results=1`).
async fn driver_share(setup: &Setup) -> anyhow::Result<[Duration; 3]> {
    let mut client = csi::snapshot_metadata_client::SnapshotMetadataClient::new(
        setup.driver.controller.csi.channel(),
    );
    let target = target_handle(setup).await?;
    let delta = |max_results| csi::GetMetadataDeltaRequest {
        base_snapshot_id: setup.base_handle.clone(),
        target_snapshot_id: target.clone(),
        max_results,
        ..Default::default()
    };
    let start = Instant::now();
    let mut stream = client.get_metadata_delta(delta(0)).await?.into_inner();
    while stream.message().await?.is_some() {}
    let whole = start.elapsed();
    let start = Instant::now();
    let request = csi::GetMetadataAllocatedRequest {
        snapshot_id: target.clone(),
        ..Default::default()
    };
    let mut stream = client.get_metadata_allocated(request).await?.into_inner();
    while stream.message().await?.is_some() {}
    let allocated = start.elapsed();
    let start = Instant::now();
    let mut stream = client.get_metadata_delta(delta(1)).await?.into_inner();
    while stream.message().await?.is_some() {}
    Ok([whole, allocated, start.elapsed()])
}

async fn target_handle(setup: &Setup) -> anyhow::Result<String> {
    let contents: Api<VolumeSnapshotContent> = Api::all(setup.api.client.clone());
    contents
        .get("snap-2")
        .await?
        .status
        .and_then(|s| s.snapshot_handle)
        .context("snap-2 has no handle")
}

#[derive(Clone)]
enum Request {
    Allocated(api::GetMetadataAllocatedRequest),
    Delta(api::GetMetadataDeltaRequest),
}

struct Case {
    name: &'static str,
    request: Request,
}

struct Answer {
    case: &'static str,
    summary: Summary,
    /// The median time to the stream's end.
    seconds: f64,
}

/// The request of the measured call of `kind` ([`KINDS`]).
fn measured_request(setup: &Setup, kind: usize) -> Request {
    let token = &setup.tokens.backup;
    match kind {
        0 => Request::Delta(delta_request(token, &setup.base_handle, "snap-2")),
        1 => Request::Allocated(allocated_request(token, "snap-2", 0, 0)),
        _ => Request::Delta(api::GetMetadataDeltaRequest {
            max_results: 1,
            ..delta_request(token, &setup.base_handle, "snap-2")
        }),
    }
}

fn allocated_request(
    token: &str,
    snapshot: &str,
    starting_offset: i64,
    max_results: i32,
) -> api::GetMetadataAllocatedRequest {
    api::GetMetadataAllocatedRequest {
        security_token: token.to_string(),
        namespace: NAMESPACE.to_string(),
        snapshot_name: snapshot.to_string(),
        starting_offset,
        max_results,
    }
}

fn delta_request(token: &str, base: &str, target: &str) -> api::GetMetadataDeltaRequest {
    api::GetMetadataDeltaRequest {
        security_token: token.to_string(),
        namespace: NAMESPACE.to_string(),
        base_snapshot_id: base.to_string(),
        target_snapshot_name: target.to_string(),
        starting_offset: 0,
        max_results: 0,
    }
}

/// The requests both binaries answer: every way a call can go wrong that the sidecar (not the
/// driver) decides, and the driver's answers relayed.
fn cases(setup: &Setup) -> Vec<Case> {
    let tokens = &setup.tokens;
    let allocated = |name, request| Case {
        name,
        request: Request::Allocated(request),
    };
    let delta = |name, request| Case {
        name,
        request: Request::Delta(request),
    };
    let past_end = setup.volume_bytes as i64 + (1 << 20);
    // Whole-volume allocated calls that differ in the caller's token or the snapshot named.
    let refused = [
        ("token not a token", "not-a-token", "snap-2"),
        (
            "token for another audience",
            &tokens.wrong_audience,
            "snap-2",
        ),
        ("denied (no RBAC)", &tokens.intruder, "snap-2"),
        ("missing snapshot", &tokens.backup, "absent"),
        ("not-ready snapshot", &tokens.backup, "snap-unready"),
        ("snapshot of another driver", &tokens.backup, "snap-foreign"),
    ]
    .map(|(name, token, snapshot)| allocated(name, allocated_request(token, snapshot, 0, 0)));
    let mut cases = vec![
        allocated(
            "allocated",
            allocated_request(&tokens.backup, "snap-2", 0, 0),
        ),
        delta(
            "delta",
            delta_request(&tokens.backup, &setup.base_handle, "snap-2"),
        ),
        allocated(
            "allocated, max_results=1",
            allocated_request(&tokens.backup, "snap-2", 0, 1),
        ),
        delta(
            "delta, max_results=1",
            api::GetMetadataDeltaRequest {
                max_results: 1,
                ..delta_request(&tokens.backup, &setup.base_handle, "snap-2")
            },
        ),
        allocated(
            "allocated from the middle (offset 1 MiB + 1)",
            allocated_request(&tokens.backup, "snap-2", (1 << 20) + 1, 0),
        ),
        allocated(
            "allocated, offset past the end",
            allocated_request(&tokens.backup, "snap-2", past_end, 0),
        ),
        delta(
            "delta, offset past the end",
            api::GetMetadataDeltaRequest {
                starting_offset: past_end,
                ..delta_request(&tokens.backup, &setup.base_handle, "snap-2")
            },
        ),
        allocated(
            "negative max_results",
            allocated_request(&tokens.backup, "snap-2", 0, -1),
        ),
        allocated(
            "negative offset",
            allocated_request(&tokens.backup, "snap-2", -1, 0),
        ),
        allocated("no token", allocated_request("", "snap-2", 0, 0)),
        allocated(
            "no namespace",
            api::GetMetadataAllocatedRequest {
                namespace: String::new(),
                ..allocated_request(&tokens.backup, "snap-2", 0, 0)
            },
        ),
        allocated(
            "no snapshot name",
            allocated_request(&tokens.backup, "", 0, 0),
        ),
        delta(
            "delta, no base",
            delta_request(&tokens.backup, "", "snap-2"),
        ),
        delta(
            "delta, no target",
            delta_request(&tokens.backup, &setup.base_handle, ""),
        ),
        delta(
            "delta, target of another driver",
            delta_request(&tokens.backup, &setup.base_handle, "snap-foreign"),
        ),
        delta(
            "delta, base of another volume",
            delta_request(&tokens.backup, &setup.other_handle, "snap-2"),
        ),
        delta(
            "delta, unknown base",
            delta_request(&tokens.backup, "no-such-snapshot", "snap-2"),
        ),
        delta(
            "delta, base = target",
            delta_request(&tokens.backup, &setup.base_handle, "snap-1"),
        ),
    ];
    cases.extend(refused);
    cases
}

/// The report: setup, the medians per binary, the driver's share, and the answers side by
/// side.
fn report(
    setup: &Setup,
    runs: usize,
    names: &[String],
    sizes: &[f64],
    measured: &[Vec<RunResult>],
    driver_runs: &[[Duration; 3]],
    answers: &[Vec<Answer>],
) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut out = format!(
        "A {:.0} MiB block volume of the reference driver: {:.0} MiB written in scattered 64 KiB runs, snapshot 1, {:.0} MiB (a quarter) rewritten in scattered 64 KiB runs, snapshot 2 ({:.0} MiB allocated). Per run each binary is started afresh (`--audience`, `--port`, `--tls-cert`, `--tls-key`, `--csi-address`, `--kubeconfig`, `--http-endpoint`; defaults otherwise), answers one warm-up call, then GetMetadataDelta (snapshot 1 → 2), GetMetadataAllocated (snapshot 2) and GetMetadataDelta with `max_results=1` (one tuple per message) are each read to the end by one client over TLS; {CALLS} calls of each by turns; binaries by turns, {runs} runs each; wall time: the median of all calls, sidecar CPU: the mean per call (`/proc`, 10 ms ticks).\n\n",
        mib(setup.volume_bytes),
        mib(setup.written),
        mib(setup.rewritten),
        mib(setup.allocated),
    );
    let _ = writeln!(
        out,
        "| binary | call | wall time (median) | sidecar CPU (mean) | responses | entries | bytes listed | message bytes | API requests per call |\n|---|---|---:|---:|---:|---:|---:|---:|---|"
    );
    for (name, results) in names.iter().zip(measured) {
        for (kind, call) in KINDS.iter().enumerate() {
            let calls: Vec<&Call> = results.iter().flat_map(|r| &r.calls[kind]).collect();
            let wall = median(calls.iter().map(|c| c.elapsed.as_secs_f64()).collect());
            let cpu: Vec<f64> = calls.iter().filter_map(|c| c.cpu).collect();
            let cpu = (!cpu.is_empty()).then(|| cpu.iter().sum::<f64>() / cpu.len() as f64);
            let last = calls.last().map(|c| &c.summary);
            let requests = calls
                .last()
                .and_then(|c| c.requests.as_ref())
                .map_or("(not counted)".to_string(), describe_requests);
            let _ = writeln!(
                out,
                "| {name} | {call} | {} | {} | {} | {} | {} | {} | {requests} |",
                wall.map_or("n/a".into(), |w| format!("{:.1} ms", w * 1e3)),
                cpu.map_or("n/a".into(), |c| format!("{:.1} ms", c * 1e3)),
                last.map_or(0, |s| s.responses),
                last.map_or(0, |s| s.entries),
                last.map_or(0, |s| s.block_bytes),
                last.map_or(0, |s| s.message_bytes),
            );
        }
    }
    let share = |i: usize| {
        median(driver_runs.iter().map(|d| d[i].as_secs_f64()).collect())
            .map_or("n/a".into(), |w| format!("{:.1} ms", w * 1e3))
    };
    let _ = writeln!(
        out,
        "\nThe driver alone (the same calls over its socket, no sidecar, medians of {} calls each): delta {}, allocated {}, delta with `max_results=1` {}.\n",
        driver_runs.len(),
        share(0),
        share(1),
        share(2),
    );
    let _ = writeln!(
        out,
        "| binary | peak RSS (median) | binary size |\n|---|---:|---:|"
    );
    for ((name, results), size) in names.iter().zip(measured).zip(sizes) {
        let rss = median(results.iter().filter_map(|r| r.peak_rss).collect());
        let _ = writeln!(
            out,
            "| {name} | {} | {size:.1} MiB |",
            rss.map_or("n/a".into(), |r| format!("{r:.1} MiB"))
        );
    }
    if answers.len() > 1 {
        let _ = writeln!(
            out,
            "\nThe same requests, answered by each (in brackets: the median time of {ANSWER_REPEATS}):\n"
        );
        let _ = writeln!(out, "| request | {} | same |", names.join(" | "));
        let _ = writeln!(out, "|---|{}---|", "---|".repeat(names.len()));
        for (i, answer) in answers[0].iter().enumerate() {
            let row: Vec<String> = answers
                .iter()
                .map(|a| {
                    let a = &a[i];
                    format!("{} ({:.1} ms)", a.summary.describe(), a.seconds * 1e3)
                })
                .collect();
            let same = answers.iter().all(|a| a[i].summary == answer.summary);
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                answer.case,
                row.join(" | "),
                if same { "yes" } else { "**no**" }
            );
        }
    }
    out
}

fn describe_requests(requests: &Requests) -> String {
    let whose = if requests.all_clients {
        " (all clients)"
    } else {
        ""
    };
    let list: Vec<String> = requests
        .by_request
        .iter()
        .map(|(request, n)| format!("{request} {n}"))
        .collect();
    format!("{}{whose}", list.join(", "))
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// A small deterministic generator: the same runs are written in every benchmark run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes 64 KiB runs at `runs` (indexes) of the image, each filled with bytes that depend on
/// the run and the `generation` (never zero, never the same in two generations).
fn write_runs(image: &Path, runs: &[u64], generation: u8) -> anyhow::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .with_context(|| format!("opening {}", image.display()))?;
    let mut buffer = vec![0u8; RUN as usize];
    for &run in runs {
        let fill = (run as u8) | 1;
        buffer.iter_mut().enumerate().for_each(|(i, byte)| {
            *byte = fill.wrapping_add(i as u8).wrapping_mul(generation) | 1;
        });
        buffer[0] = generation;
        file.write_at(&buffer, run * RUN)?;
    }
    file.sync_all()?;
    Ok(())
}

async fn create_block_volume(
    csi: &csi_grpc::conn::CsiConnection,
    name: &str,
    bytes: u64,
) -> anyhow::Result<csi::Volume> {
    let capability = csi_kinds::capability::volume_capability(
        &csi_kinds::capability::AccessKind::Block,
        csi::volume_capability::access_mode::Mode::SingleNodeWriter,
    );
    let request = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        ..Default::default()
    };
    csi.create_volume(request, Duration::from_secs(60))
        .await?
        .volume
        .context("CreateVolume returned no volume")
}

async fn create_snapshot(
    csi: &csi_grpc::conn::CsiConnection,
    name: &str,
    volume: &str,
) -> anyhow::Result<String> {
    let request = csi::CreateSnapshotRequest {
        name: name.to_string(),
        source_volume_id: volume.to_string(),
        ..Default::default()
    };
    Ok(csi
        .create_snapshot(request, Duration::from_secs(300))
        .await?
        .snapshot
        .context("CreateSnapshot returned no snapshot")?
        .snapshot_id)
}

/// A pre-provisioned VolumeSnapshotContent of `handle` at `driver` and its VolumeSnapshot
/// `name`, both with the status snapshot-controller would give them (`ready` or not yet).
async fn pre_provisioned(
    client: &Client,
    name: &str,
    (handle, driver): (&str, &str),
    ready: bool,
) -> anyhow::Result<()> {
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), NAMESPACE);
    let content: VolumeSnapshotContent = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"deletionPolicy": "Retain", "driver": driver,
            "source": {"snapshotHandle": handle},
            "volumeSnapshotRef": {"name": name, "namespace": NAMESPACE}}}))?;
    contents.create(&PostParams::default(), &content).await?;
    let snapshot: VolumeSnapshot = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"source": {"volumeSnapshotContentName": name}}}))?;
    snapshots.create(&PostParams::default(), &snapshot).await?;
    let params = PatchParams::default();
    contents
        .patch_status(
            name,
            &params,
            &Patch::Merge(
                json!({"status": {"snapshotHandle": handle, "readyToUse": ready,
                "restoreSize": 0}}),
            ),
        )
        .await?;
    snapshots
        .patch_status(
            name,
            &params,
            &Patch::Merge(json!({"status": {"boundVolumeSnapshotContentName": name,
                "readyToUse": ready}})),
        )
        .await?;
    Ok(())
}

/// Deletes what the benchmark made in the API server (a real cluster keeps it otherwise): the
/// namespace, the contents and the class.
async fn clean_up(client: &Client) -> anyhow::Result<()> {
    let params = kube::api::DeleteParams::default();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(NAMESPACE, &params)
        .await?;
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    for name in [
        "snap-1",
        "snap-2",
        "snap-other",
        "snap-unready",
        "snap-foreign",
    ] {
        contents.delete(name, &params).await?;
    }
    Api::<VolumeSnapshotClass>::all(client.clone())
        .delete("bench-cbt", &params)
        .await?;
    Ok(())
}

/// The ServiceAccounts, the backup application's Role and RoleBinding, and the tokens.
async fn tokens(client: &Client) -> anyhow::Result<Tokens> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    for name in [BACKUP, INTRUDER] {
        let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        accounts.create(&PostParams::default(), &account).await?;
    }
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": BACKUP},
        "rules": [{"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"],
            "verbs": ["get", "list"]}]}))?;
    Api::<Role>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": BACKUP},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": BACKUP},
        "subjects": [{"kind": "ServiceAccount", "name": BACKUP, "namespace": NAMESPACE}]}))?;
    Api::<RoleBinding>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &binding)
        .await?;
    let token = |name: &'static str, audience: &'static str| {
        let accounts = accounts.clone();
        async move {
            let request: TokenRequest = serde_json::from_value(json!({
                "spec": {"audiences": [audience], "expirationSeconds": 3600}}))?;
            let answer = accounts
                .create_token_request(name, &PostParams::default(), &request)
                .await
                .with_context(|| format!("TokenRequest for {name}"))?;
            answer
                .status
                .map(|s| s.token)
                .context("TokenRequest answered no token")
        }
    };
    Ok(Tokens {
        backup: token(BACKUP, AUDIENCE).await?,
        wrong_audience: token(BACKUP, "another-audience").await?,
        intruder: token(INTRUDER, AUDIENCE).await?,
    })
}

/// The sidecar's serving certificate for `localhost` and 127.0.0.1, signed by a CA of its own
/// (made with the `openssl` command).
struct Tls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Tls {
    fn generate(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("tls");
        std::fs::create_dir_all(&dir)?;
        let path = |name: &str| dir.join(name).display().to_string();
        std::fs::write(
            dir.join("san.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let steps: [Vec<String>; 3] = [
            ["req", "-x509"]
                .iter()
                .chain(&ec)
                .map(|s| s.to_string())
                .chain(
                    [
                        "-keyout",
                        &path("ca.key"),
                        "-out",
                        &path("ca.crt"),
                        "-days",
                        "1",
                        "-subj",
                        "/CN=bench-cbt-ca",
                    ]
                    .map(str::to_string),
                )
                .collect(),
            ["req"]
                .iter()
                .chain(&ec)
                .map(|s| s.to_string())
                .chain(
                    [
                        "-keyout",
                        &path("tls.key"),
                        "-out",
                        &path("tls.csr"),
                        "-subj",
                        "/CN=localhost",
                    ]
                    .map(str::to_string),
                )
                .collect(),
            [
                "x509",
                "-req",
                "-in",
                &path("tls.csr"),
                "-CA",
                &path("ca.crt"),
                "-CAkey",
                &path("ca.key"),
                "-CAcreateserial",
                "-out",
                &path("tls.crt"),
                "-days",
                "1",
                "-extfile",
                &path("san.cnf"),
            ]
            .map(str::to_string)
            .to_vec(),
        ];
        for args in steps {
            let output = std::process::Command::new("openssl")
                .args(&args)
                .output()
                .context("running openssl")?;
            if !output.status.success() {
                bail!(
                    "openssl {}: {}",
                    args[0],
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        Ok(Self {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        })
    }

    /// A client of the sidecar on `port` that trusts only this CA.
    async fn connect(&self, port: u16) -> anyhow::Result<MetadataClient> {
        let channel =
            csi_grpc::tls::connect(&format!("localhost:{port}"), &std::fs::read(&self.ca)?).await?;
        Ok(MetadataClient::new(channel).max_decoding_message_size(usize::MAX))
    }
}
