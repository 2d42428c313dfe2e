//! A missing secret and a driver that is unavailable are reported as Events, and
//! provisioning recovers once they are fixed — with one volume per PV. A storage request that
//! is no size in bytes is reported, never sent to the driver. A volume whose claim and class
//! went away before its PV existed is not stranded, and one the provisioner cannot keep (or
//! whose PV the API server refuses) is deleted with its secret. A claim deleted while its
//! failures back off goes at once, and claims deleted while their volumes are made (the PV
//! racing the claim's deletion) leave none. A slow, throttling and failing API server costs no
//! volume.

use csi_suite_scenarios::fixtures::{bound, claim, secret};
use csi_suite_scenarios::{Cluster, Options, report_skip};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

/// Class parameters naming `secret` in the claim's namespace as the provisioner secret.
fn provisioner_secret(secret: &str) -> serde_json::Value {
    json!({
        "csi.storage.k8s.io/provisioner-secret-name": secret,
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
    })
}

/// Creates a class `<namespace>-<suffix>` with `parameters` and a claim `name` of it; returns
/// the class's name.
async fn claim_of_new_class(
    cluster: &Cluster,
    name: &str,
    suffix: &str,
    parameters: serde_json::Value,
) -> String {
    let class_name = cluster
        .storage_class(suffix, "Immediate", "Delete", parameters)
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim(name, &class_name),
        )
        .await;
    class_name
}

/// How many PV creates the scenario's components sent (refused ones too).
fn pv_creates(cluster: &Cluster) -> u64 {
    cluster
        .request_counts()
        .iter()
        .filter(|(key, _)| key.verb == "create" && key.resource == "persistentvolumes")
        .map(|(_, count)| count)
        .sum()
}

#[tokio::test]
async fn a_missing_secret_and_an_unavailable_driver_are_reported_then_recovered() {
    let cluster = Cluster::start("failures").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    claim_of_new_class(
        &cluster,
        "first",
        "secret",
        provisioner_secret("late-creds"),
    )
    .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let message = cluster
        .wait_for_event("first", "ProvisioningFailed", "late-creds")
        .await;
    assert!(message.contains("not found"), "{message}");
    assert!(
        proxy.create_volume_requests().is_empty(),
        "no CreateVolume without its secret"
    );
    secret(&cluster, "late-creds", "pw").await;
    cluster
        .wait_for(
            &claims,
            "first",
            "the claim Bound once the secret exists",
            bound,
        )
        .await;

    proxy.fail_with(Some((tonic::Code::Unavailable, "driver restarting")));
    claim_of_new_class(&cluster, "second", "plain", json!({})).await;
    let message = cluster
        .wait_for_event("second", "ProvisioningFailed", "driver restarting")
        .await;
    assert!(message.contains("Unavailable"), "{message}");
    proxy.fail_with(None);
    cluster
        .wait_for(
            &claims,
            "second",
            "the claim Bound once the driver is back",
            bound,
        )
        .await;
    let mut on_driver = cluster.driver_volumes().await;
    let mut handles: Vec<String> = cluster
        .driver_pvs()
        .await
        .into_iter()
        .filter_map(|pv| Some(pv.spec?.csi?.volume_handle))
        .collect();
    on_driver.sort();
    handles.sort();
    assert_eq!(on_driver, handles, "one volume per PV");
    provisioner.stop().await;
    cluster.stop().await;
}

/// A CreateVolume the driver refuses as infeasible (InvalidArgument) is reported as upstream
/// words it and not tried again until `--retry-interval-max` has passed (sig-storage-lib's
/// slow set), where other errors are retried from `--retry-interval-start` on.
#[tokio::test]
async fn an_infeasible_request_is_reported_and_retried_slowly() {
    let cluster = Cluster::start("infeasible").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let slow_retry = std::time::Duration::from_secs(8);
    let provisioner = cluster
        .start_provisioner_via(csi, |settings| settings.retry_max = slow_retry)
        .await;
    proxy.fail_with(Some((tonic::Code::InvalidArgument, "no such tier")));
    claim_of_new_class(&cluster, "refused", "tiered", json!({})).await;
    let message = cluster
        .wait_for_event("refused", "ProvisioningFailed", "no such tier")
        .await;
    assert_eq!(
        message,
        "Volume provisioning failed with infeasible error. Retries will be delayed. \
         rpc error: code = InvalidArgument desc = no such tier"
    );
    // Retried from the 200 ms start, the claim would have been tried four times by now.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        proxy.create_volume_requests().len(),
        1,
        "no retry before --retry-interval-max"
    );
    proxy.fail_with(None);
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .wait_for(
            &claims,
            "refused",
            "the claim Bound after the slow retry",
            bound,
        )
        .await;
    assert_eq!(proxy.create_volume_requests().len(), 2);
    provisioner.stop().await;
    cluster.stop().await;
}

/// Two claims whose CreateVolume fails back off for ten minutes (`--retry-interval-start`).
/// One fails for good (OutOfRange: the driver created nothing): the provisioner releases it
/// with the Event, so it is left as its user made it and, deleted after the provisioner is
/// gone, goes at once. The other fails as still in progress (Unavailable: a volume may be
/// on its way) and stays protected; deleted while it backs off, it is acted on at once, as
/// upstream's workqueue runs a changed claim at once: provisioned, released and its volume
/// deleted, instead of holding `kubectl delete` until the backoff ends.
#[tokio::test]
async fn a_claim_deleted_while_backing_off_goes_at_once() {
    let cluster = Cluster::start("deleted-in-backoff").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    // Class and claim first, so that the provisioner's first look at the claim finds its
    // class. Larger than the driver's maximum volume size: CreateVolume fails (OutOfRange).
    let class_name = cluster
        .storage_class("failing", "Immediate", "Delete", json!({}))
        .await;
    let mut doomed = claim("doomed", &class_name);
    doomed["spec"]["resources"]["requests"]["storage"] = json!("2Ti");
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, doomed).await;
    let backoff = std::time::Duration::from_secs(600);
    let provisioner = cluster
        .start_provisioner_via(csi, |settings| {
            settings.retry_start = backoff;
            settings.retry_max = backoff;
        })
        .await;
    cluster
        .wait_for_event(
            "doomed",
            "ProvisioningFailed",
            "rpc error: code = OutOfRange desc = ",
        )
        .await;
    // In the record of provisionings in flight, and no finalizer of ours on the claim.
    let protected = |claim: &PersistentVolumeClaim, in_flight: &[String]| {
        assert!(
            !claim
                .finalizers()
                .iter()
                .any(|f| f == "csi-suite.io/provisioning-protection"),
            "{:?}",
            claim.finalizers()
        );
        in_flight.contains(&claim.uid().unwrap())
    };
    let claim_now = claims.get("doomed").await.unwrap();
    assert!(
        !protected(&claim_now, &cluster.in_flight().await),
        "a final error releases the claim"
    );

    proxy.fail_with(Some((tonic::Code::Unavailable, "the backend is busy")));
    cluster
        .create(&claims, claim("in-flight", &class_name))
        .await;
    cluster
        .wait_for_event(
            "in-flight",
            "ProvisioningFailed",
            "rpc error: code = Unavailable desc = the backend is busy",
        )
        .await;
    let claim_now = claims.get("in-flight").await.unwrap();
    assert!(
        protected(&claim_now, &cluster.in_flight().await),
        "a volume may be on its way: the claim stays protected"
    );
    proxy.fail_with(None);
    cluster
        .delete_and_wait(&claims, "in-flight", "the deleted claim released at once")
        .await;
    // Done once its entry leaves the record: until then a CreateVolume of it may still come
    // (the retry of its provisioning, then the deletion of what it made).
    cluster
        .wait_nothing_provisioned("its volume deleted with its PV")
        .await;

    provisioner.stop().await;
    cluster
        .delete_and_wait(
            &claims,
            "doomed",
            "the released claim gone with no provisioner",
        )
        .await;
    assert!(cluster.driver_volumes().await.is_empty());
    cluster.stop().await;
}

/// A storage request in any form the API server stores is sent to the driver in whole bytes,
/// rounded up (1126400m is 1127 bytes); one that is no size in bytes (over int64) is a
/// ProvisioningFailed Event on the claim, never a CreateVolume of 0 bytes.
#[tokio::test]
async fn storage_requests_reach_the_driver_in_bytes_or_are_reported() {
    let cluster = Cluster::start("request-bytes").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let class = cluster
        .storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let sized = |name: &str, size: &str| {
        let mut claim = claim(name, &class);
        claim["spec"]["resources"]["requests"]["storage"] = json!(size);
        claim
    };

    let huge: PersistentVolumeClaim = csi_suite_scenarios::object(sized("huge", "1e30"));
    match claims.create(&PostParams::default(), &huge).await {
        Ok(_) => {
            let message = cluster
                .wait_for_event("huge", "ProvisioningFailed", "storage request")
                .await;
            assert!(
                message.contains("1e30") && message.contains("more than"),
                "{message}"
            );
            assert!(
                proxy.create_volume_requests().is_empty(),
                "no CreateVolume for a request over int64"
            );
        }
        Err(kube::Error::Api(status)) if status.code == 422 => report_skip(
            "storage_requests_reach_the_driver_in_bytes_or_are_reported (1e30)",
            &format!("the server refuses the request: {}", status.message),
        ),
        Err(error) => panic!("creating the claim huge: {error}"),
    }

    cluster.create(&claims, sized("milli", "1126400m")).await;
    cluster
        .wait_for(&claims, "milli", "the claim of 1126400m Bound", bound)
        .await;
    let sizes: Vec<i64> = proxy
        .create_volume_requests()
        .iter()
        .map(|r| r.capacity_range.as_ref().map_or(0, |c| c.required_bytes))
        .collect();
    assert!(!sizes.is_empty(), "the claim milli was provisioned");
    assert!(sizes.iter().all(|s| *s == 1127), "{sizes:?}");
    provisioner.stop().await;
    cluster.stop().await;
}

/// The provisioner dies while the driver creates a volume; before it comes back, the claim
/// and its StorageClass are deleted. The claim's entry in the record of provisionings in
/// flight is all that is left, and the new provisioner has no class to repeat CreateVolume
/// with: it uses the entry's, so the volume gets its PV, is deleted with it, and the record
/// forgets the claim.
#[tokio::test]
async fn a_claim_and_class_deleted_mid_provisioning_leave_no_volume() {
    let cluster = Cluster::start("stranded-class").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    proxy.hold_responses("CreateVolume");
    let first = cluster.start_provisioner_via(csi, |_| {}).await;
    let class_name = claim_of_new_class(&cluster, "data", "gone", json!({})).await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .eventually_async("the claim in the record", || async {
            !cluster.in_flight().await.is_empty()
        })
        .await;
    cluster
        .eventually_async("the volume created on the driver", || async {
            cluster.driver_volumes().await.len() == 1
        })
        .await;
    first.kill().await;
    proxy.release_responses();

    cluster
        .delete_and_wait(
            &cluster.cluster_scoped::<StorageClass>(),
            &class_name,
            "the class gone",
        )
        .await;
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let second = cluster.start_provisioner().await;
    cluster
        .wait_gone(&claims, "data", "the claim released and gone")
        .await;
    cluster
        .wait_nothing_provisioned("the volume deleted with its PV, the record forgets the claim")
        .await;
    second.stop().await;
    cluster.stop().await;
}

/// external-provisioner #1469: claims deleted while their CreateVolume is in flight, so the
/// PV's creation races the claim's deletion. Five rounds of 20 claims: the driver makes every
/// volume while its answer is held; half the claims are deleted before the answers come
/// back, half just after. Every volume the driver made goes with its PV, and the record of
/// provisionings in flight ends empty.
#[tokio::test]
async fn claims_deleted_while_their_volumes_are_made_leave_no_volume() {
    let cluster = Cluster::start("provision-delete-race").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let class_name = cluster
        .storage_class("race", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for round in 0..5 {
        proxy.hold_responses("CreateVolume");
        let names: Vec<String> = (0..20).map(|i| format!("race-{round}-{i}")).collect();
        for name in &names {
            cluster.create(&claims, claim(name, &class_name)).await;
        }
        cluster
            .eventually_async("every volume made, its answer held", || async {
                cluster.driver_volumes().await.len() == names.len()
            })
            .await;
        for name in names.iter().step_by(2) {
            claims.delete(name, &DeleteParams::default()).await.unwrap();
        }
        proxy.release_responses();
        for name in names.iter().skip(1).step_by(2) {
            claims.delete(name, &DeleteParams::default()).await.unwrap();
        }
        cluster
            .wait_nothing_provisioned("no volume, no PV and an empty record")
            .await;
        for name in &names {
            cluster.wait_gone(&claims, name, "the claim gone").await;
        }
    }
    provisioner.stop().await;
    cluster.stop().await;
}

/// A new volume the provisioner cannot keep (the driver says it is smaller than asked) is
/// deleted with the class's provisioner secret, as its CreateVolume had it; once the claim is
/// deleted, the volume is deleted once more and the claim goes instead of being provisioned
/// again.
#[tokio::test]
async fn an_unusable_new_volume_is_deleted_with_its_secret() {
    let cluster = Cluster::start("abandon-secret").await;
    let password = format!("pw-{}", cluster.namespace);
    secret(&cluster, "creds", &password).await;
    let (proxy, csi) = cluster.csi_proxy().await;
    proxy.shrink_created_volumes(true);
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    claim_of_new_class(&cluster, "data", "secret", provisioner_secret("creds")).await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .wait_for_event("data", "ProvisioningFailed", "less than requested capacity")
        .await;
    let deletes = proxy.delete_volume_requests();
    assert!(!deletes.is_empty(), "the unusable volume deleted");
    assert!(
        deletes
            .iter()
            .all(|d| d.secrets.get("password") == Some(&password)),
        "DeleteVolume carries the provisioner secret"
    );

    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(&claims, "data", "the claim released and gone")
        .await;
    // The claim goes at once; its entry in the record may still be finishing a retry (a
    // CreateVolume, then the DeleteVolume of the unusable volume) when it does.
    cluster
        .wait_nothing_provisioned("no volume and no PV left, the record empty")
        .await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// The API server refuses the PV of a new volume (422, five times in a row): the volume is
/// deleted after the fifth refusal and reported, and provisioning starts over with a new
/// volume, whose PV is accepted.
#[tokio::test]
async fn a_refused_pv_costs_its_volume_after_five_refusals() {
    let cluster = Cluster::start_with("pv-refused", Options::with_api_faults()).await;
    cluster.faults().fail_next(
        "POST",
        "persistentvolumes",
        http::StatusCode::UNPROCESSABLE_ENTITY,
        5,
        None,
    );
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    claim_of_new_class(&cluster, "data", "refused", json!({})).await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let message = cluster
        .wait_for_event("data", "ProvisioningFailed", "Deleting the volume")
        .await;
    assert!(
        message.starts_with(&format!(
            "Error creating provisioned PV object for claim {}/data: ",
            cluster.namespace
        )) && message.contains("injected failure"),
        "{message}"
    );
    let bound_claim = cluster
        .wait_for(&claims, "data", "the claim Bound to a new volume", bound)
        .await;
    let pv_name = bound_claim.spec.unwrap().volume_name.unwrap();
    let handle = cluster.volume_handle(&pv_name).await;
    let deleted: Vec<String> = proxy
        .delete_volume_requests()
        .into_iter()
        .map(|d| d.volume_id)
        .collect();
    assert_eq!(deleted.len(), 1, "one volume deleted: {deleted:?}");
    let pv_creates = pv_creates(&cluster);
    assert_eq!(pv_creates, 6, "five refused, then the new volume's PV");
    assert_ne!(deleted[0], handle, "not the one with a PV");
    assert_eq!(
        cluster.driver_volumes().await,
        [handle],
        "only the volume with a PV is left"
    );
    provisioner.stop().await;
    cluster.stop().await;
}

/// csi-provisioner under a slow and failing API server: every request 50 ms late, new PVs
/// throttled (429 with `Retry-After`), writes of its in-flight record and of PVs failing
/// (500, 503) and the open
/// watches cut three times, two resumes refused as expired (410 Gone). Every claim is still
/// provisioned once and Bound, and deleting the claims leaves no volume behind.
#[tokio::test]
async fn a_slow_and_failing_api_server_costs_no_volume() {
    const CLAIMS: usize = 10;
    let cluster = Cluster::start_with("api-unreliable", Options::with_api_faults()).await;
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("unreliable", "Immediate", "Delete", json!({}))
        .await;
    let faults = cluster.faults();
    faults.set_latency(std::time::Duration::from_millis(50));
    faults.fail_next(
        "POST",
        "persistentvolumes",
        http::StatusCode::TOO_MANY_REQUESTS,
        3,
        Some(1),
    );
    // The record of provisionings in flight refused: nothing is created until it is written.
    faults.fail_next(
        "POST",
        "leases",
        http::StatusCode::INTERNAL_SERVER_ERROR,
        1,
        None,
    );
    faults.fail_next(
        "PUT",
        "leases",
        http::StatusCode::INTERNAL_SERVER_ERROR,
        2,
        None,
    );
    faults.fail_next(
        "PATCH",
        "persistentvolumes",
        http::StatusCode::SERVICE_UNAVAILABLE,
        3,
        None,
    );
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for i in 0..CLAIMS {
        cluster
            .create(&claims, claim(&format!("c{i}"), &class_name))
            .await;
        if i == CLAIMS / 2 {
            faults.expire_watch_resumes(2);
            faults.cut_watches();
        }
    }
    faults.cut_watches();
    for i in 0..CLAIMS {
        cluster
            .wait_for(&claims, &format!("c{i}"), "the claim Bound", bound)
            .await;
    }
    let handles = |pvs: Vec<PersistentVolume>| -> Vec<String> {
        let mut handles: Vec<String> = pvs
            .into_iter()
            .filter_map(|pv| Some(pv.spec?.csi?.volume_handle))
            .collect();
        handles.sort();
        handles
    };
    let bound_handles = handles(cluster.driver_pvs().await);
    assert_eq!(bound_handles.len(), CLAIMS, "one PV per claim");
    let mut on_driver = cluster.driver_volumes().await;
    on_driver.sort();
    assert_eq!(on_driver, bound_handles, "one volume per PV, none more");
    let pv_creates = pv_creates(&cluster);
    assert!(
        pv_creates >= CLAIMS as u64 + 3,
        "the three throttled PV creates were sent again: {pv_creates}"
    );

    faults.cut_watches();
    for i in 0..CLAIMS {
        claims
            .delete(&format!("c{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    cluster
        .eventually_async("every PV and volume gone", || async {
            cluster.driver_pvs().await.is_empty() && cluster.driver_volumes().await.is_empty()
        })
        .await;
    // The PV patches failed are those of deletion (the finalizer's removal).
    assert_eq!(faults.unspent(), [] as [String; 0], "every fault met");
    faults.set_latency(std::time::Duration::ZERO);
    provisioner.stop().await;
    cluster.stop().await;
}
