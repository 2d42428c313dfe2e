//! The Event recorder under load: a provisioning burst of 1000 claims written to kube-sim's
//! in-process API server loses no Event and still aggregates repeats, and a queue that stays
//! full holds Warnings back instead of dropping them, while it drops and counts Normals.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use csi_sidecar::events::{EventRecorder, EventType, QUEUE_LENGTH};
use k8s_openapi::api::core::v1::{Event, Namespace, ObjectReference};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::Value;

const CLAIMS: usize = 1000;
const NAMESPACE: &str = "burst";

fn claim(i: usize) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(NAMESPACE.into()),
        name: Some(format!("claim-{i}")),
        uid: Some(format!("0000-{i}")),
        ..ObjectReference::default()
    }
}

/// What csi-provisioner records for claim `i`: `Provisioning` then `ProvisioningSucceeded`;
/// every tenth claim first fails twice, each attempt recording `Provisioning` again.
async fn provision(recorder: &EventRecorder, i: usize) {
    let claim = claim(i);
    let provisioning =
        format!("External provisioner is provisioning volume for claim \"{NAMESPACE}/claim-{i}\"");
    let attempts = if i.is_multiple_of(10) { 3 } else { 1 };
    for attempt in 1..=attempts {
        recorder
            .publish(&claim, EventType::Normal, "Provisioning", &provisioning)
            .await;
        if attempt < attempts {
            let failed = "failed to provision volume with StorageClass \"fast\": rpc error: \
                          code = ResourceExhausted desc = no space left";
            recorder
                .publish(&claim, EventType::Warning, "ProvisioningFailed", failed)
                .await;
        }
    }
    let succeeded = format!("Successfully provisioned volume pvc-{i}");
    recorder
        .publish(
            &claim,
            EventType::Normal,
            "ProvisioningSucceeded",
            &succeeded,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_claims_loses_no_event_and_aggregates_repeats() {
    let sim = kube_sim::ApiServer::start().await.expect("kube-sim starts");
    let client = sim.client();
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    // A real API server takes a few milliseconds to store an Event; one write at a time,
    // 2000 of them took 15 s here.
    sim.faults().set_latency(Duration::from_millis(5));
    let recorder = Arc::new(EventRecorder::new(
        client.clone(),
        "external-provisioner",
        "",
    ));

    // Eight workers, as the provisioner's, all at once with nothing else to wait for.
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let recorder = recorder.clone();
            tokio::spawn(async move {
                for i in (worker..CLAIMS).step_by(8) {
                    provision(&recorder, i).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let published = started.elapsed();
    recorder.flush().await;
    let drained = started.elapsed();
    sim.faults().set_latency(Duration::ZERO);

    let events = Api::<Event>::namespaced(client, NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    eprintln!(
        "{CLAIMS} claims: 2400 events published in {published:?}, {} Events written in \
         {drained:?}",
        events.len()
    );
    assert_eq!(recorder.dropped(), 0);
    let mut seen: HashMap<(String, String), Vec<(i32, String)>> = HashMap::new();
    for event in &events {
        let claim = event.involved_object.name.clone().unwrap();
        let reason = event.reason.clone().unwrap();
        let count = event.count.unwrap();
        seen.entry((claim, reason))
            .or_default()
            .push((count, event.type_.clone().unwrap()));
    }
    for i in 0..CLAIMS {
        let failed_first = i.is_multiple_of(10);
        let expected = [
            ("Provisioning", if failed_first { 3 } else { 1 }, "Normal"),
            ("ProvisioningSucceeded", 1, "Normal"),
        ];
        for (reason, count, kind) in expected {
            let recorded = seen.get(&(format!("claim-{i}"), reason.to_string()));
            assert_eq!(
                recorded,
                Some(&vec![(count, kind.to_string())]),
                "claim-{i} {reason}"
            );
        }
        let warning = seen.get(&(format!("claim-{i}"), "ProvisioningFailed".to_string()));
        if failed_first {
            assert_eq!(
                warning,
                Some(&vec![(2, "Warning".to_string())]),
                "claim-{i}"
            );
        } else {
            assert_eq!(warning, None, "claim-{i}");
        }
    }
    assert_eq!(events.len(), 2 * CLAIMS + CLAIMS / 10);
}

/// An API server that holds every request until `open` turns true, then creates what it is
/// sent; it notes the `type` of every Event created.
async fn gated_apiserver(
    open: tokio::sync::watch::Receiver<bool>,
) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let created: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = created.clone();
    let app = axum::Router::new().fallback(move |method: Method, body: axum::body::Bytes| {
        let mut open = open.clone();
        let log = log.clone();
        async move {
            let _ = open.wait_for(|open| *open).await;
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if method == Method::POST {
                log.lock()
                    .unwrap()
                    .push(body["type"].as_str().unwrap_or_default().to_string());
            }
            (StatusCode::CREATED, axum::Json(body))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (kube_sim::client(addr), created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_warnings_and_drops_normals_counted() {
    let (gate, open) = tokio::sync::watch::channel(false);
    let (client, created) = gated_apiserver(open).await;
    let recorder = Arc::new(EventRecorder::new(client, "external-attacher", ""));

    // The server answers nothing: the writes in flight, then the queue, fill up.
    let mut published = 0;
    let waited = loop {
        assert!(published < 3 * QUEUE_LENGTH, "the queue never filled");
        let started = Instant::now();
        recorder
            .publish(&claim(published), EventType::Normal, "Attached", "ok")
            .await;
        published += 1;
        if recorder.dropped() > 0 {
            break started.elapsed();
        }
    };
    assert_eq!(recorder.dropped(), 1);
    assert!(
        waited >= Duration::from_millis(500),
        "a Normal waits for room before it is dropped: {waited:?}"
    );
    // The queue is stuck: the next Normal is dropped without waiting again.
    let started = Instant::now();
    recorder
        .publish(&claim(published), EventType::Normal, "Attached", "ok")
        .await;
    published += 1;
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(recorder.dropped(), 2);

    // A Warning waits for room, longer than a Normal would.
    let warning = tokio::spawn({
        let recorder = recorder.clone();
        async move {
            recorder
                .publish(&claim(0), EventType::Warning, "AttachFailed", "timed out")
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!warning.is_finished(), "the Warning waits for room");

    gate.send_replace(true);
    tokio::time::timeout(Duration::from_secs(30), warning)
        .await
        .expect("the Warning is queued once the server answers")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), recorder.flush())
        .await
        .expect("the queue drains");
    assert_eq!(recorder.dropped(), 2);
    let created = created.lock().unwrap();
    let warnings = created.iter().filter(|t| *t == "Warning").count();
    assert_eq!(warnings, 1, "the Warning was written");
    assert_eq!(created.len(), published - 2 + 1, "all but the dropped");
}
