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
//! Needs the binaries (`cargo build --release -p cosi`; `make bench` does it) and moto
//! (`scripts/install-moto.sh`).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cosi::api::{Bucket, BucketAccess, BucketAccessClass, BucketClaim, BucketClass};
use cosi::s3::driver::S3Driver;
use csi_sidecar::conn::Endpoint;
use csi_suite_scenarios::bench::{
    ApiServerUnderTest, Footprint, Phase, SidecarProcess, client_requests, latencies, listed_watch,
    main_with_count, reached, record, sidecar_report, timed_requests,
};
use csi_suite_scenarios::fixtures::install_cosi_crds;
use csi_suite_scenarios::moto::Moto;
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
/// The longest wait for the next object to get there (a stuck binary fails the run).
const LIMIT: Duration = Duration::from_secs(120);
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
        async move { cosi::s3::serve::serve(driver, &socket, stop).await }
    });

    // Their caches: claims, classes and Buckets; Buckets, accesses, claims and access classes.
    let mut controller = SidecarProcess::start(CONTROLLER, &[], &api, root.path(), 3).await?;
    let address = format!("--driver-addr=unix://{}", socket.path().display());
    let mut sidecar = SidecarProcess::start(SIDECAR, &[address], &api, root.path(), 4).await?;
    let grant = grant_phase(&api, count).await;
    let teardown = match &grant {
        Ok(_) => teardown_phase(&api, count).await,
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
    let phases = [grant?, teardown?];
    let intro = format!(
        "{count} BucketClaims of a Delete class and a BucketAccess (Key) for each, created at once by {CLIENTS} concurrent clients, until every access's credentials Secret exists (grant); then every access and claim deleted at once, until every Bucket is gone (teardown: credentials revoked, buckets deleted at the S3 server). cosi-controller and cosi-provisioner run with their default flags (leader election, 40 workers); the driver is cosi-s3 on moto with IAM enforced (each access an IAM user, policy and key). Latency: from a claim's creation to its Secret, and from its deletion to its Bucket gone. API requests are the sidecar's own, per claim (a claim, its Bucket, its access and Secret), counted by the API server per client (its User-Agent)."
    );
    let mut report = sidecar_report(
        &intro,
        count,
        "claims",
        "claim",
        &phases,
        Footprint {
            sidecar: SIDECAR,
            rss: sidecar_rss,
            binary_mib: sidecar.binary_mib(),
        },
    );
    let _ = writeln!(
        report,
        "\nPeak RSS of {CONTROLLER}: {}; binary size: {:.1} MiB (release).",
        controller_rss.map_or("n/a".to_string(), |r| format!("{r:.1} MiB")),
        controller.binary_mib()
    );
    if let Some(lines) = driver_time {
        let _ = writeln!(
            report,
            "\nTime in the driver (mean per call, from the sidecar's `csi_sidecar_operations_seconds`): {lines}."
        );
    }
    record(
        &api,
        sidecar.external || controller.external || !sidecar.extra_args.is_empty(),
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

/// Every claim and its access at once, until each access's Secret exists.
async fn grant_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Phase> {
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
    let granted = reached(&mut events, count, "granted", LIMIT, |event| match event {
        watcher::Event::Apply(secret) | watcher::Event::InitApply(secret) => {
            Some(secret.name_any())
        }
        _ => None,
    })
    .await?;
    Ok(Phase {
        name: "grant",
        elapsed: start.elapsed(),
        latencies: latencies(&asked, &granted),
        requests: client_requests(SIDECAR, before, server.counts().await),
    })
}

/// Every access and claim deleted at once, until each claim's Bucket is gone.
async fn teardown_phase(server: &ApiServerUnderTest, count: usize) -> anyhow::Result<Phase> {
    let client = &server.client;
    let claims: Api<BucketClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let accesses: Api<BucketAccess> = Api::namespaced(client.clone(), NAMESPACE);
    let buckets: Api<Bucket> = Api::all(client.clone());
    // Which Bucket is whose: the claim's name from the Bucket's reference.
    let before = server.counts().await;
    let mut events = std::pin::pin!(listed_watch(&buckets).await);
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
    let gone = reached(&mut events, count, "deleted", LIMIT, |event| match event {
        watcher::Event::Delete(bucket) => bucket.spec.bucket_claim.name.clone(),
        _ => None,
    })
    .await?;
    Ok(Phase {
        name: "teardown",
        elapsed: start.elapsed(),
        latencies: latencies(&asked, &gone),
        requests: client_requests(SIDECAR, before, server.counts().await),
    })
}
