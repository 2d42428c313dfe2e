//! COSI under load: N BucketClaims (default 200, `BENCH_BUCKETS`) and a BucketAccess for each,
//! created at once, until every access's credentials Secret exists; then all deleted at once,
//! until every Bucket is gone (buckets deleted at the S3 server, credentials revoked). The
//! release `cosi-controller` and `cosi-provisioner` run as their own processes (default flags:
//! leader election, 40 workers) against kube-sim (or the cluster of `KUBECONFIG`) and the
//! sample driver cosi-s3 on a real S3 server (moto, IAM enforced: every access mints an IAM
//! user and key). Reports claims/s, p50/p99 from claim to Secret, both binaries' peak RSS and
//! the sidecar's API requests per claim. Writes the "COSI" section of `BENCHMARKS.md`. Nothing
//! asserts a timing.
//!
//! `BENCH_COSI_CONTROLLER` / `BENCH_COSI_PROVISIONER` run other binaries instead, e.g.
//! upstream's (kubernetes-sigs/container-object-storage-interface): such a binary gets
//! `--kubeconfig` (the sidecar also `--driver-addr=unix://…`, the flag both sidecars take) and
//! the flags of `BENCH_COSI_CONTROLLER_ARGS` / `BENCH_COSI_PROVISIONER_ARGS`, but no
//! `--http-endpoint` (upstream's have none, and refuse flags they do not know); its API
//! requests are counted under its file name (a Go client's User-Agent). Such a run is printed,
//! never written to `BENCHMARKS.md`.
//!
//! Needs the binaries (`cargo build --release -p cosi`; `make bench` does it) and moto
//! (`scripts/install-moto.sh`).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cosi_s3::driver::S3Driver;
use csi_grpc::conn::Endpoint;
use csi_kinds::objectstorage::{Bucket, BucketAccess, BucketAccessClass, BucketClaim, BucketClass};
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, Footprint, Phase, SidecarProcess, client_requests, latencies, listed_watch,
    main_with_count, record, sidecar_report, timed_requests,
};
use csi_suite_scenarios::fixtures::install_cosi_crds;
use csi_suite_scenarios::moto::Moto;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const HEADING: &str = "## COSI";
const DRIVER: &str = "s3.bench.cosi.csi-suite.io";
const NAMESPACE: &str = "bench-buckets";
const CLASS: &str = "bench-buckets";
const ACCESS_CLASS: &str = "bench-keys";
/// The sidecar's client name in kube-sim's request counts (its User-Agent).
const SIDECAR: &str = "cosi-provisioner";
const CONTROLLER: &str = "cosi-controller";
/// The longest wait for the next object to get there: past it, the objects left are reported
/// as never done, and the run is not recorded.
const LIMIT: Duration = Duration::from_secs(60);
/// Objects created (and deleted) concurrently.
const CLIENTS: usize = 64;

fn main() -> anyhow::Result<()> {
    main_with_count("BENCH_BUCKETS", 200, run)
}

fn name(i: usize) -> String {
    format!("bench-bucket-{i}")
}

fn secret(i: usize) -> String {
    format!("bench-bucket-{i}-creds")
}

/// The claim whose credentials Secret `secret` is (a real cluster's namespace also holds its
/// ServiceAccount's token Secret).
fn claim_of_secret(secret: &str) -> Option<String> {
    secret
        .strip_suffix("-creds")
        .filter(|claim| claim.starts_with("bench-bucket-"))
        .map(str::to_string)
}

async fn run(count: usize) -> anyhow::Result<()> {
    let root = tempfile::Builder::new().prefix("bench-cosi-").tempdir()?;
    let api = ApiServerUnderTest::start(root.path(), &[]).await?;
    let client = api.client.clone();
    install_cosi_crds(&client).await;
    prepare(&client).await?;
    let moto = Moto::start()
        .await
        .ok_or_else(|| anyhow::anyhow!("needs moto: scripts/install-moto.sh"))?;
    let socket = Endpoint::from_path(root.path().join("cosi.sock"))?;
    let stop_driver = CancellationToken::new();
    let driver = S3Driver {
        name: DRIVER.to_string(),
        client: moto.admin.clone(),
    };
    tokio::spawn({
        let (socket, stop) = (socket.clone(), stop_driver.clone());
        async move { cosi_s3::serve::serve(driver, &socket, stop).await }
    });

    // Their caches: claims, classes and Buckets; Buckets, accesses, claims and access classes.
    let mut controller =
        SidecarProcess::start_with(CONTROLLER, &[], &api, root.path(), 3, false).await?;
    let address = format!("--driver-addr=unix://{}", socket.path().display());
    let mut sidecar =
        SidecarProcess::start_with(SIDECAR, &[address], &api, root.path(), 4, false).await?;
    let grant = grant_phase(&api, &sidecar.client(), count).await;
    let teardown = match &grant {
        Ok(_) => teardown_phase(&api, &sidecar.client(), count).await,
        Err(_) => Err(anyhow::anyhow!("not run: the grant phase failed")),
    };
    if grant.is_err() || teardown.is_err() {
        controller.print_log_tail();
        sidecar.print_log_tail();
    }
    let (sidecar_rss, controller_rss) = (sidecar.peak_rss_mib(), controller.peak_rss_mib());
    let driver_time = sidecar
        .driver_latencies(&[
            "DriverCreateBucket",
            "DriverGrantBucketAccess",
            "DriverRevokeBucketAccess",
            "DriverDeleteBucket",
        ])
        .await;
    sidecar.stop();
    controller.stop();
    stop_driver.cancel();
    let ((grant, never_granted), (teardown, left)) = (grant?, teardown?);
    let phases = [grant, teardown];
    let binaries = if controller.swapped() || sidecar.swapped() {
        format!(
            "The controller is {} and the sidecar {}",
            controller.describe(),
            sidecar.describe()
        )
    } else {
        format!(
            "{CONTROLLER} and {SIDECAR} run with their default flags (leader election, 40 workers)"
        )
    };
    let intro = format!(
        "{count} BucketClaims of a Delete class and a BucketAccess (Key) for each, created at once by {CLIENTS} concurrent clients, until every access's credentials Secret exists (grant); then every access and claim deleted at once, until every Bucket and every credentials Secret is gone (teardown: credentials revoked, buckets deleted at the S3 server). {binaries}; the driver is cosi-s3 on moto with IAM enforced (each access an IAM user, policy and key). Latency: from a claim's creation to its Secret, and from its deletion to its Bucket and Secret gone. API requests are the sidecar's own, per claim (a claim, its Bucket, its access and Secret), counted by the API server per client (its User-Agent)."
    );
    let sidecar_name = sidecar.client();
    let mut report = sidecar_report(
        &intro,
        count,
        "claims",
        "claim",
        &phases,
        Footprint {
            sidecar: &sidecar_name,
            rss: sidecar_rss,
            binary_mib: sidecar.binary_mib(),
        },
    );
    let _ = writeln!(
        report,
        "\nPeak RSS of {}: {}; binary size: {:.1} MiB.",
        controller.client(),
        controller_rss.map_or("n/a".to_string(), |r| format!("{r:.1} MiB")),
        controller.binary_mib()
    );
    let incomplete = never_granted > 0 || left != (0, 0);
    if incomplete {
        let _ = writeln!(
            report,
            "\n**Incomplete** (nothing changed for {} s): {never_granted} of {count} accesses never got their Secret; after the teardown {} Buckets and {} credentials Secrets were left. Rates and percentiles above are over the objects that got there.",
            LIMIT.as_secs(),
            left.0,
            left.1
        );
    }
    if let Some(lines) = driver_time {
        let _ = writeln!(
            report,
            "\nTime in the driver (mean per call, from the sidecar's `csi_sidecar_operations_seconds`): {lines}."
        );
    }
    record(
        &api,
        sidecar.swapped() || controller.swapped() || incomplete,
        HEADING,
        "`make bench` (`cargo bench -p csi-suite-scenarios --bench object_storage`; the release `cosi-controller` and `cosi-provisioner` binaries as their own processes; kube-sim, cosi-s3 in the benchmark's process and moto beside it, all on the same CPUs)",
        &report,
    )
}

/// The namespace and the two classes.
async fn prepare(client: &Client) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    Api::<BucketClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": CLASS}, "driverName": DRIVER,
                "deletionPolicy": "Delete"}))?,
        )
        .await?;
    Api::<BucketAccessClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ACCESS_CLASS},
                "driverName": DRIVER, "authenticationType": "Key"}))?,
        )
        .await?;
    Ok(())
}

/// Every claim and its access at once, until each access's Secret exists; also how many never
/// got one.
async fn grant_phase(
    server: &ApiServerUnderTest,
    sidecar: &str,
    count: usize,
) -> anyhow::Result<(Phase, usize)> {
    let client = &server.client;
    let claims: Api<BucketClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let accesses: Api<BucketAccess> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let before = server.counts().await;
    let mut events = std::pin::pin!(listed_watch(&secrets).await);
    let start = Instant::now();
    let asked = timed_requests(count, CLIENTS, |i| {
        let (claims, accesses) = (claims.clone(), accesses.clone());
        async move {
            let claim: BucketClaim = serde_json::from_value(json!({
                "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
                "metadata": {"name": name(i)},
                "spec": {"bucketClassName": CLASS, "protocols": ["S3"]}}))?;
            claims.create(&PostParams::default(), &claim).await?;
            let access: BucketAccess = serde_json::from_value(json!({
                "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketAccess",
                "metadata": {"name": name(i)},
                "spec": {"bucketClaimName": name(i), "bucketAccessClassName": ACCESS_CLASS,
                         "credentialsSecretName": secret(i), "protocol": "S3"}}))?;
            accesses.create(&PostParams::default(), &access).await?;
            Ok(secret(i))
        }
    })
    .await?;
    let granted = until_stalled(&mut events, count, |event| match event {
        watcher::Event::Apply(secret) | watcher::Event::InitApply(secret) => {
            claim_of_secret(&secret.name_any()).map(|_| secret.name_any())
        }
        _ => None,
    })
    .await?;
    let phase = Phase {
        name: "grant",
        elapsed: last(start, &granted),
        latencies: latencies(&asked, &granted),
        requests: client_requests(sidecar, before, server.counts().await),
    };
    Ok((phase, count - granted.len()))
}

/// When each of at most `count` objects reached the state `done` recognises (by the name it
/// returns), until all have or none has for [`LIMIT`].
async fn until_stalled<K>(
    events: &mut (impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin),
    count: usize,
    done: impl Fn(watcher::Event<K>) -> Option<String>,
) -> anyhow::Result<HashMap<String, Instant>> {
    let mut at: HashMap<String, Instant> = HashMap::new();
    let mut progress = Instant::now();
    while at.len() < count {
        let Some(left) = LIMIT.checked_sub(progress.elapsed()) else {
            break;
        };
        let Ok(event) = tokio::time::timeout(left, events.next()).await else {
            break;
        };
        match event {
            Some(Ok(event)) => {
                if let Some(name) = done(event) {
                    at.entry(name).or_insert_with(|| {
                        progress = Instant::now();
                        progress
                    });
                }
            }
            Some(Err(error)) => anyhow::bail!("watching: {error}"),
            None => anyhow::bail!("the watch ended"),
        }
    }
    Ok(at)
}

/// From `start` to the last of `at` (to now when none got there).
fn last(start: Instant, at: &HashMap<String, Instant>) -> Duration {
    at.values().max().map_or_else(
        || start.elapsed(),
        |last| last.saturating_duration_since(start),
    )
}

/// Every access and claim deleted at once, until each claim's Bucket and credentials Secret
/// are gone. Ours deletes a Bucket only once its accesses are revoked (their Secrets gone);
/// upstream's v0.2.2 may delete the Bucket first and revoke after, so both are waited for.
/// Also how many Buckets and Secrets were left.
async fn teardown_phase(
    server: &ApiServerUnderTest,
    sidecar: &str,
    count: usize,
) -> anyhow::Result<(Phase, (usize, usize))> {
    let client = &server.client;
    let claims: Api<BucketClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let accesses: Api<BucketAccess> = Api::namespaced(client.clone(), NAMESPACE);
    let buckets: Api<Bucket> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let before = server.counts().await;
    let mut bucket_events = std::pin::pin!(listed_watch(&buckets).await);
    let mut secret_events = std::pin::pin!(listed_watch(&secrets).await);
    // The credentials Secrets there are (an access never granted has none).
    let granted = secrets
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|secret| claim_of_secret(&secret.name_any()).is_some())
        .count();
    let start = Instant::now();
    let asked = timed_requests(count, CLIENTS, |i| {
        let (claims, accesses) = (claims.clone(), accesses.clone());
        async move {
            accesses.delete(&name(i), &DeleteParams::default()).await?;
            claims.delete(&name(i), &DeleteParams::default()).await?;
            Ok(name(i))
        }
    })
    .await?;
    // Which Bucket is whose: the claim's name from the Bucket's reference.
    let buckets_gone = until_stalled(&mut bucket_events, count, |event| match event {
        watcher::Event::Delete(bucket) => bucket.spec.bucket_claim.name.clone(),
        _ => None,
    });
    let secrets_gone = until_stalled(&mut secret_events, granted, |event| match event {
        watcher::Event::Delete(secret) => claim_of_secret(&secret.name_any()),
        _ => None,
    });
    let (buckets_gone, secrets_gone) = tokio::try_join!(buckets_gone, secrets_gone)?;
    let gone = both(&buckets_gone, &secrets_gone);
    let phase = Phase {
        name: "teardown",
        elapsed: last(start, &gone),
        latencies: latencies(&asked, &gone),
        requests: client_requests(sidecar, before, server.counts().await),
    };
    let left = (count - buckets_gone.len(), granted - secrets_gone.len());
    Ok((phase, left))
}

/// Per claim, when its Bucket is gone and its Secret too (if it had one).
fn both(
    buckets: &HashMap<String, Instant>,
    secrets: &HashMap<String, Instant>,
) -> HashMap<String, Instant> {
    buckets
        .iter()
        .map(|(name, at)| {
            (
                name.clone(),
                secrets.get(name).map_or(*at, |s| (*at).max(*s)),
            )
        })
        .collect()
}
