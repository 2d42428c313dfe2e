//! kube-sim's own quantity and name rules, seen through the API server's answers: by default
//! against a fresh kube-sim; with `KUBE_SIM_COMPARE_KUBECONFIG=/path` the same tests run
//! against a real cluster. Inputs are apimachinery's test vectors (pkg/api/resource
//! quantity_test.go, pkg/util/validation validation_test.go).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume};
use kube::api::{Api, DeleteParams, PostParams};
use kube_sim_harness::server_under_test;
use serde_json::json;

const FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const SUFFIX: &str = "unable to parse quantity's suffix";
const NUMERIC: &str = "unable to parse numeric part of quantity";
const POSITIVE: &str = "must be greater than zero";

/// A suffix no other run of this test shares (cluster-scoped names must not collide).
fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// The code and message of an answer (200 for success).
fn answer<T>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("not an API error: {other}"),
    }
}

// A PV's capacity is decoded as ParseQuantity reads it (400 with its error), then must be
// positive (422): forms without a digit are zero, binary suffixes of 2^50 and more need one.
#[tokio::test]
async fn persistent_volume_capacities_are_parsed_as_parse_quantity_does() {
    let (client, _sim) = server_under_test().await;
    let api: Api<PersistentVolume> = Api::all(client);
    let run = unique();
    let rows = [
        ("1Gi", 200, ""),
        ("1.5Gi", 200, ""),
        ("100.035Ki", 200, ""),
        ("0.5Mi", 200, ""),
        ("1e3", 200, ""),
        ("1.3E+6", 200, ""),
        ("1.G", 200, ""),
        (".001", 200, ""),
        ("0.000000000001Ki", 200, ""),
        ("1.1.M", 400, FORMAT),
        ("1+1.0M", 400, FORMAT),
        ("aoeu", 400, FORMAT),
        ("0.1am", 400, FORMAT),
        ("0.1mi", 400, SUFFIX),
        ("1i", 400, SUFFIX),
        ("-3.01e-", 400, SUFFIX),
        ("Pi", 400, NUMERIC),
        ("-Ei", 400, NUMERIC),
        (
            "0",
            422,
            "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
        ),
        (
            "Gi",
            422,
            "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
        ),
        (
            "-",
            422,
            "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
        ),
        (
            ".",
            422,
            "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
        ),
        (
            "-1",
            422,
            "spec.capacity[storage]: Invalid value: -1: must be a valid resource quantity",
        ),
        (
            "-0.5",
            422,
            "spec.capacity[storage]: Invalid value: -1: must be a valid resource quantity",
        ),
        ("-1Gi", 422, POSITIVE),
    ];
    for (i, (capacity, code, message)) in rows.into_iter().enumerate() {
        let name = format!("quantity-{run}-{i}");
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": capacity},
                "csi": {"driver": "quantity.example.com", "volumeHandle": "h"}}
        }))
        .unwrap();
        let (got, said) = answer(api.create(&PostParams::default(), &volume).await);
        assert_eq!(got, code, "{capacity}: {said}");
        assert!(said.contains(message), "{capacity}: {said}");
        if got == 200 {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
    }
}

// Object names are DNS-1123 subdomains, namespace names DNS-1123 labels
// (TestIsDNS1123Subdomain, TestIsDNS1123Label).
#[tokio::test]
async fn names_are_dns1123_as_apimachinery_validates_them() {
    let (client, _sim) = server_under_test().await;
    let run = unique();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = format!("names-{run}");
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let good = [
        "a".to_string(),
        "a--1--2--b".into(),
        "0".into(),
        "1-a".into(),
        "a.1".into(),
        "1--a--b--2.1".into(),
        "11.22.33.44.55".into(),
        "a".repeat(253),
    ];
    let bad = [
        "A".to_string(),
        "aBc".into(),
        "a-".into(),
        "-1".into(),
        "a_b".into(),
        "a.".into(),
        ".a".into(),
        "a..b".into(),
        "ab.A".into(),
        "a@b".into(),
        "a:b".into(),
        "a".repeat(254),
    ];
    for name in good.iter().chain(&bad) {
        let object: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let (code, message) = answer(config_maps.create(&PostParams::default(), &object).await);
        if good.contains(name) {
            assert_eq!(code, 200, "{name}: {message}");
        } else {
            assert_eq!(code, 422, "{name}: {message}");
            let field = format!("metadata.name: Invalid value: {name:?}");
            assert!(message.contains(&field), "{name}: {message}");
        }
    }
    // A namespace is a label: no dots, at most 63 characters.
    let padded =
        |length: usize| format!("{namespace}-{}", "a".repeat(length - namespace.len() - 1));
    for (name, code) in [
        (format!("{namespace}-2"), 200),
        (format!("{namespace}.a"), 422),
        (padded(63), 200),
        (padded(64), 422),
    ] {
        let object: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let (got, message) = answer(namespaces.create(&PostParams::default(), &object).await);
        assert_eq!(got, code, "{name}: {message}");
        if got == 200 {
            namespaces
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}
