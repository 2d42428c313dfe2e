//! Dynamic provisioning with csi-provisioner: claims of a class become volumes on the driver
//! and bound PVs, deleted claims give their volumes back, bad classes are reported.

use csi_suite_scenarios::fixtures::{bound, claim, handle_of, is_running, pod, pv_nodes};
use csi_suite_scenarios::rbac::{self, Rule};
use csi_suite_scenarios::service_accounts::{claim_patch_refused, skip_without_service_accounts};
use csi_suite_scenarios::{Cluster, Options, report_skip, skip_without_root};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const PROVISIONING_PROTECTION: &str = "csi-suite.io/provisioning-protection";
const PROVISIONING_CLASS: &str = "csi-suite.io/provisioning-class";

/// Deletes claim `name` and waits until its PV `pv_name` is gone and the driver no longer has
/// the volume `handle`.
async fn claim_deleted_with_its_volume(cluster: &Cluster, name: &str, pv_name: &str, handle: &str) {
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<PersistentVolume>(),
            pv_name,
            "the PV deleted with its volume",
        )
        .await;
    assert!(
        !cluster.driver_volumes().await.iter().any(|v| v == handle),
        "no leaked volume"
    );
}

#[tokio::test]
async fn dynamic_provisioning_creates_binds_and_deletes_volumes() {
    let cluster = Cluster::start("provision-immediate").await;
    // Another driver's claim with the same finalizer, already bound: its own provisioner's to
    // release, not ours.
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .create(
            &claims,
            json!({"metadata": {"name": "foreign", "finalizers": [PROVISIONING_PROTECTION],
                    "annotations": {"volume.kubernetes.io/storage-provisioner": "other.example.com"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                    "volumeName": "pvc-of-another-driver",
                    "resources": {"requests": {"storage": "1Mi"}}}}),
        )
        .await;
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("fast", "Immediate", "Delete", json!({"kind": "fast"}))
        .await;
    let created: PersistentVolumeClaim = cluster
        .create(&cluster.namespaced(), claim("data", &class_name))
        .await;
    let claim = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the claim Bound to a new volume",
            bound,
        )
        .await;
    let pv_name = claim.spec.unwrap().volume_name.unwrap();
    assert_eq!(
        pv_name,
        format!("pvc-{}", created.uid().unwrap()),
        "named <prefix>-<claim uid>"
    );
    // Released once the PV exists: nothing of ours stays on the claim.
    cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the provisioning protection and its class record removed",
            |c| {
                !c.finalizers().iter().any(|f| f == PROVISIONING_PROTECTION)
                    && !c.annotations().contains_key(PROVISIONING_CLASS)
            },
        )
        .await;
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    assert!(pv.finalizers().contains(&FINALIZER.to_string()));
    assert_eq!(
        pv.annotations()["pv.kubernetes.io/provisioned-by"],
        cluster.driver_name
    );
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Mi");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert!(
        spec.node_affinity.is_some(),
        "the driver reports topology, so the PV has node affinity"
    );
    let handle = spec.csi.unwrap().volume_handle;
    assert!(cluster.driver_volumes().await.contains(&handle));
    let events = cluster.events().await;
    let succeeded = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
        .unwrap_or_else(|| panic!("no ProvisioningSucceeded in {events:?}"));
    // sig-storage-lib's recorder: `<provisioner>_<host>_<uuid>`.
    let source = succeeded
        .source
        .as_ref()
        .and_then(|s| s.component.as_deref())
        .unwrap_or_default();
    let host = csi_sidecar::leader::hostname();
    let instance = source
        .strip_prefix(&format!("{}_{host}_", cluster.driver_name))
        .unwrap_or_else(|| panic!("Event source {source:?}"));
    assert!(
        uuid::Uuid::parse_str(instance).is_ok(),
        "Event source {source:?}"
    );

    claim_deleted_with_its_volume(&cluster, "data", &pv_name, &handle).await;
    let foreign = claims.get("foreign").await.unwrap();
    assert!(
        foreign
            .finalizers()
            .iter()
            .any(|f| f == PROVISIONING_PROTECTION),
        "another driver's claim keeps its finalizer: {:?}",
        foreign.finalizers()
    );
    claims
        .patch(
            "foreign",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    provisioner.stop().await;
    cluster.stop().await;
}

/// A claim's provisioning writes no claim: the record of provisionings in flight, one Lease
/// written for many claims at once, protects the volume being created. Counted on the
/// scenario's own requests: kube-sim's, or the fault proxy's on a real cluster
/// (kube-controller-manager binds there): no claim patch, and at most one record write per
/// claim entered (fewer when claims come together), leaving batched with them. Their deletion
/// patches each PV once.
#[tokio::test]
async fn no_claim_is_written_while_the_pv_controller_binds_it() {
    const CLAIMS: usize = 20;
    let cluster = Cluster::start_with("provision-writes", Options::with_api_faults()).await;
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("writes", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let names: Vec<String> = (0..CLAIMS).map(|i| format!("data-{i}")).collect();
    for name in &names {
        cluster.create(&claims, claim(name, &class_name)).await;
    }
    for name in &names {
        cluster
            .wait_for(&claims, name, "the claim Bound and released", |c| {
                bound(c) && !c.finalizers().iter().any(|f| f == PROVISIONING_PROTECTION)
            })
            .await;
    }
    let counts = cluster.request_counts();
    let count = |verbs: &[&str], resource: &str| -> u64 {
        counts
            .iter()
            .filter(|(key, _)| {
                key.client == rbac::PROVISIONER
                    && verbs.contains(&key.verb.as_str())
                    && key.resource == resource
            })
            .map(|(_, count)| count)
            .sum()
    };
    assert_eq!(
        count(&["patch", "update"], "persistentvolumeclaims"),
        0,
        "claim writes of {CLAIMS} claims"
    );
    let record_writes = count(&["create", "update"], "leases");
    assert!(
        (1..=2 * CLAIMS as u64).contains(&record_writes),
        "{record_writes} record writes for {CLAIMS} claims"
    );
    eprintln!("{record_writes} record writes for {CLAIMS} claims");
    for name in &names {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
    }
    cluster
        .eventually_async("the volumes deleted", || async {
            cluster.driver_volumes().await.is_empty() && cluster.driver_pvs().await.is_empty()
        })
        .await;
    // Deletion: one finalizer removal per PV, by value, so pv-protection's own removal at the
    // same moment fails nothing (no retry, no GET).
    let counts = cluster.request_counts();
    let count = |verb: &str| -> u64 {
        counts
            .iter()
            .filter(|(key, _)| {
                key.client == rbac::PROVISIONER
                    && key.verb == verb
                    && key.resource == "persistentvolumes"
            })
            .map(|(_, count)| count)
            .sum()
    };
    assert_eq!(
        count("patch"),
        CLAIMS as u64,
        "PV patches of {CLAIMS} deletions"
    );
    assert_eq!(count("get"), 0, "PV reads");
    provisioner.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn dynamic_provisioning_waits_for_the_first_consumer_and_follows_its_node() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("provision-wffc").await;
    let provisioner = cluster.start_provisioner().await;
    let attacher = cluster.start_attacher().await;
    let class_name = cluster
        .storage_class("local", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim("data", &class_name),
        )
        .await;
    cluster
        .create(
            &cluster.namespaced::<Pod>(),
            pod("app", &cluster.node("node-c"), Some("data"), true),
        )
        .await;
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod Running on a provisioned volume",
            is_running,
        )
        .await;
    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("data")
        .await
        .unwrap();
    assert_eq!(
        claim.annotations()["volume.kubernetes.io/selected-node"],
        cluster.node("node-c")
    );
    let values = pv_nodes(&cluster, &claim).await;
    assert_eq!(
        values.first().map(String::as_str),
        Some(cluster.node("node-c").as_str()),
        "provisioned on the selected node (its term first)"
    );
    cluster
        .namespaced::<Pod>()
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(&cluster.namespaced::<Pod>(), "app", "the pod removed")
        .await;
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A bad class is reported without a CreateVolume; fixing it lets the claim through.
#[tokio::test]
async fn dynamic_provisioning_reports_an_unknown_reserved_parameter() {
    let cluster = Cluster::start("provision-bad-class").await;
    let provisioner = cluster.start_provisioner().await;
    let parameters = json!({"csi.storage.k8s.io/no-such-key": "x"});
    let class_name = cluster
        .storage_class("bad", "Immediate", "Delete", parameters)
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim("data", &class_name),
        )
        .await;
    let message = cluster
        .wait_for_event("data", "ProvisioningFailed", "no-such-key")
        .await;
    assert!(
        message.contains("csi.storage.k8s.io/no-such-key"),
        "{message}"
    );
    assert!(
        cluster.driver_volumes().await.is_empty(),
        "no CreateVolume for a bad class"
    );
    // Class parameters are immutable: the administrator fixes the class by recreating it,
    // and the claim's retries pick it up.
    let classes = cluster.cluster_scoped::<StorageClass>();
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(&classes, &class_name, "the bad class gone")
        .await;
    cluster
        .storage_class("bad", "Immediate", "Delete", json!({}))
        .await;
    cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the claim Bound with the fixed class",
            bound,
        )
        .await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// Malformed classes and claims are refused with upstream's texts (compared side by side with
/// upstream external-provisioner v6.3.0 on v1.19.16), each after the Normal `Provisioning`
/// Event as upstream, and nothing reaches the driver.
#[tokio::test]
async fn malformed_classes_and_claims_are_refused_as_upstream() {
    let cluster = Cluster::start("provision-refusals").await;
    let provisioner = cluster.start_provisioner().await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let cases = [
        (
            "fstypes",
            json!({"fstype": "ext4", "csi.storage.k8s.io/fstype": "xfs"}),
            "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys".to_string(),
        ),
        (
            "ns-only",
            json!({"csi.storage.k8s.io/provisioner-secret-namespace": "default"}),
            "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified".to_string(),
        ),
        (
            "bad-token",
            json!({"csi.storage.k8s.io/node-stage-secret-name": "${pvc.foo}",
                "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}"}),
            "error resolving value \"${pvc.foo}\": invalid tokens: [\"pvc.foo\"]".to_string(),
        ),
    ];
    for (name, parameters, _) in &cases {
        let class_name = cluster
            .storage_class(name, "Immediate", "Delete", parameters.clone())
            .await;
        cluster.create(&claims, claim(name, &class_name)).await;
    }
    let plain = cluster
        .storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    let mut selector = claim("selector", &plain);
    selector["spec"]["selector"] = json!({"matchLabels": {"tier": "gold"}});
    cluster.create(&claims, selector).await;
    let refusals: Vec<(String, String)> = cases
        .into_iter()
        .map(|(name, _, message)| (name.to_string(), message))
        .chain([(
            "selector".to_string(),
            "claim Selector is not supported".to_string(),
        )])
        .collect();
    // A class the provisioner's cache does not have yet is retried, not reported (the API
    // server's binder reports a class that does not exist).
    let late_class = format!("{}-late", cluster.namespace);
    let mut late = claim("late-class", &late_class);
    late["metadata"]["annotations"] =
        json!({"volume.kubernetes.io/storage-provisioner": cluster.driver_name});
    cluster.create(&claims, late).await;
    for (name, expected) in &refusals {
        let message = cluster
            .wait_for_event(name, "ProvisioningFailed", expected)
            .await;
        assert_eq!(&message, expected, "{name}");
        let namespace = &cluster.namespace;
        cluster
            .wait_for_event(
                name,
                "Provisioning",
                &format!(
                    "External provisioner is provisioning volume for claim \"{namespace}/{name}\""
                ),
            )
            .await;
    }
    assert!(
        cluster.driver_volumes().await.is_empty(),
        "no CreateVolume for a refused claim"
    );
    assert!(cluster.driver_pvs().await.is_empty(), "no PV");
    cluster
        .storage_class("late", "Immediate", "Delete", json!({}))
        .await;
    cluster
        .wait_for(
            &claims,
            "late-class",
            "the claim Bound once its class exists",
            bound,
        )
        .await;
    let events = cluster.events().await;
    for event in events {
        let component = event.source.as_ref().and_then(|s| s.component.as_deref());
        if event.reason.as_deref() != Some("ProvisioningFailed")
            || component == Some("persistentvolume-controller")
        {
            continue;
        }
        let failure = (
            event.involved_object.name.unwrap_or_default(),
            event.message.unwrap_or_default(),
        );
        assert!(
            refusals.contains(&failure),
            "an unexpected Warning: {failure:?}"
        );
    }
    provisioner.stop().await;
    cluster.stop().await;
}

/// A data source of another kind is left to its populator: one Normal `Provisioning` Event
/// from csi-provisioner's own recorder ("external-provisioner"), no CreateVolume.
#[tokio::test]
async fn dynamic_provisioning_leaves_other_data_sources_to_their_populator() {
    let cluster = Cluster::start("provision-populator").await;
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("populated", "Immediate", "Delete", json!({}))
        .await;
    let mut populated = claim("data", &class_name);
    // A populator is named in dataSourceRef: a server drops it from dataSource.
    populated["spec"]["dataSourceRef"] =
        json!({"apiGroup": "populators.example.com", "kind": "SamplePopulator", "name": "src"});
    let created: PersistentVolumeClaim = cluster
        .create(&cluster.namespaced::<PersistentVolumeClaim>(), populated)
        .await;
    if created.spec.and_then(|s| s.data_source_ref).is_none() {
        report_skip(
            "dynamic_provisioning_leaves_other_data_sources_to_their_populator",
            "PersistentVolumeClaim spec.dataSourceRef not served (dropped: AnyVolumeDataSource is on from v1.24)",
        );
        provisioner.stop().await;
        cluster.stop().await;
        return;
    }
    cluster
        .wait_for_event(
            "data",
            "Provisioning",
            "Assuming an external populator will provision the volume",
        )
        .await;
    let events = cluster.events().await;
    let sources: Vec<&str> = events
        .iter()
        .filter(|e| {
            e.message.as_deref() == Some("Assuming an external populator will provision the volume")
        })
        .filter_map(|e| e.source.as_ref()?.component.as_deref())
        .collect();
    assert_eq!(sources, ["external-provisioner"]);
    assert!(cluster.driver_volumes().await.is_empty(), "no CreateVolume");
    provisioner.stop().await;
    cluster.stop().await;
}

/// Kill the provisioner at random moments while claims are created and half of them deleted;
/// at the end the driver holds exactly the volumes of the existing PVs (none leaked, none lost).
#[tokio::test]
async fn dynamic_provisioning_survives_kills_without_leaking_volumes() {
    const CLAIMS: usize = 100;
    let cluster = Cluster::start("provision-kill").await;
    let class_name = cluster
        .storage_class("kill", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for i in 0..CLAIMS {
        cluster
            .create(&claims, claim(&format!("c{i}"), &class_name))
            .await;
    }
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let mut random = move |bound: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % bound
    };
    let mut deleted = 0;
    for round in 0..12 {
        let provisioner = cluster.start_provisioner().await;
        tokio::time::sleep(std::time::Duration::from_millis(20 + random(200))).await;
        // Delete some claims while provisioning may be half way.
        while deleted < CLAIMS / 2 && random(3) > 0 {
            claims
                .delete(&format!("c{}", deleted * 2), &DeleteParams::default())
                .await
                .unwrap();
            deleted += 1;
        }
        provisioner.kill().await;
        eprintln!("round {round}: killed; {deleted} claims deleted so far");
    }
    while deleted < CLAIMS / 2 {
        claims
            .delete(&format!("c{}", deleted * 2), &DeleteParams::default())
            .await
            .unwrap();
        deleted += 1;
    }
    let provisioner = cluster.start_provisioner().await;
    let deadline = std::time::Instant::now() + csi_suite_scenarios::step_timeout();
    loop {
        let remaining = claims.list(&ListParams::default()).await.unwrap().items;
        let pvs = cluster.driver_pvs().await;
        let all_bound = remaining.len() == CLAIMS / 2 && remaining.iter().all(bound);
        let mut handles: Vec<String> = pvs
            .iter()
            .filter_map(|pv| Some(pv.spec.clone()?.csi?.volume_handle))
            .collect();
        let mut on_driver = cluster.driver_volumes().await;
        handles.sort();
        on_driver.sort();
        if all_bound && pvs.len() == CLAIMS / 2 && handles == on_driver {
            break;
        }
        if std::time::Instant::now() > deadline {
            cluster.dump().await;
            panic!(
                "not converged: {} claims ({} bound), {} PVs, driver volumes {} (PV handles {})",
                remaining.len(),
                remaining.iter().filter(|c| bound(c)).count(),
                pvs.len(),
                on_driver.len(),
                handles.len()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    provisioner.stop().await;
    cluster.stop().await;
}

/// Issue 58's proof that the record of provisionings in flight leaks nothing: a burst of
/// claims, the provisioner SIGKILLed at 100 random points of it — CreateVolume answers 30 ms
/// late, so many kills land between a volume's creation and its PV — claims deleted at
/// random moments (also while their CreateVolume is in flight), and the record's writes
/// refused now and then. At the end every remaining claim is Bound, the driver holds exactly
/// the volumes of the PVs, and once every claim is deleted no volume, PV or entry is left.
#[tokio::test]
async fn a_hundred_kills_in_a_burst_leave_no_volume_behind() {
    const ROUNDS: usize = 100;
    const PER_ROUND: usize = 2;
    let cluster = Cluster::start_with("provision-kills", Options::with_api_faults()).await;
    let (proxy, csi) = cluster.csi_proxy().await;
    proxy.delay_responses(Some(("CreateVolume", std::time::Duration::from_millis(30))));
    let class_name = cluster
        .storage_class("kills", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let faults = cluster.faults();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("seed {seed}");
    let mut random = move |bound: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % bound
    };
    let mut deleted = 0;
    for round in 0..ROUNDS {
        for i in 0..PER_ROUND {
            cluster
                .create(&claims, claim(&format!("r{round}-{i}"), &class_name))
                .await;
        }
        if random(8) == 0 {
            faults.fail_next(
                "PUT",
                "leases",
                http::StatusCode::INTERNAL_SERVER_ERROR,
                1,
                None,
            );
        }
        let provisioner = cluster.start_provisioner_via(csi.clone(), |_| {}).await;
        tokio::time::sleep(std::time::Duration::from_millis(random(150))).await;
        if random(3) == 0 {
            let name = format!("r{}-{}", random(round as u64 + 1), random(PER_ROUND as u64));
            match claims.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => panic!("deleting {name}: {error}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(random(60))).await;
        }
        provisioner.kill().await;
    }
    eprintln!("{ROUNDS} kills, {deleted} claims deleted on the way");
    proxy.delay_responses(None);
    let provisioner = cluster.start_provisioner_via(csi.clone(), |_| {}).await;
    let deadline = std::time::Instant::now() + csi_suite_scenarios::step_timeout();
    loop {
        let remaining = claims.list(&ListParams::default()).await.unwrap().items;
        let pvs = cluster.driver_pvs().await;
        let mut handles: Vec<String> = pvs
            .iter()
            .filter_map(|pv| Some(pv.spec.clone()?.csi?.volume_handle))
            .collect();
        let mut on_driver = cluster.driver_volumes().await;
        handles.sort();
        on_driver.sort();
        let converged =
            remaining.iter().all(bound) && pvs.len() == remaining.len() && handles == on_driver;
        if converged {
            break;
        }
        if std::time::Instant::now() > deadline {
            cluster.dump().await;
            panic!(
                "not converged: {} claims ({} bound), {} PVs, driver volumes {} (PV handles {})",
                remaining.len(),
                remaining.iter().filter(|c| bound(c)).count(),
                pvs.len(),
                on_driver.len(),
                handles.len()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    // Some 170 claims and PVs go through the PV controller's protection finalizers, which
    // kube-sim's releases one object at a time: longer than one step.
    let deadline = std::time::Instant::now() + 4 * csi_suite_scenarios::step_timeout();
    loop {
        let volumes = cluster.driver_volumes().await.len();
        let pvs = cluster.driver_pvs().await.len();
        let entries = cluster.in_flight().await.len();
        if volumes + pvs + entries == 0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            cluster.dump().await;
            panic!("left after deletion: {volumes} volumes, {pvs} PVs, {entries} entries");
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    provisioner.stop().await;
    cluster.stop().await;
}

/// Retain keeps the volume after the claim goes; the provisioner's finalizer is not kept on a
/// Retain PV (nothing for it to delete).
#[tokio::test]
async fn dynamic_provisioning_retain_keeps_the_volume() {
    let cluster = Cluster::start("provision-retain").await;
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("keep", "Immediate", "Retain", json!({}))
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim("data", &class_name),
        )
        .await;
    let bound_claim = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the claim Bound",
            bound,
        )
        .await;
    let pv_name = bound_claim.spec.unwrap().volume_name.unwrap();
    let volumes = cluster.cluster_scoped::<PersistentVolume>();
    let pv = cluster
        .wait_for(
            &volumes,
            &pv_name,
            "the provisioner's finalizer dropped for Retain",
            |pv| !pv.finalizers().contains(&FINALIZER.to_string()),
        )
        .await;
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let released = |pv: &PersistentVolume| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    };
    cluster
        .wait_for(&volumes, &pv_name, "the PV Released", released)
        .await;
    // The signal that the provisioner has handled the Released Retain PV: a Delete PV released
    // after it (the watch delivers the two in that order) is deleted, which takes longer than
    // leaving one alone.
    let marker = cluster
        .storage_class("drop", "Immediate", "Delete", json!({}))
        .await;
    cluster
        .create(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            claim("marker", &marker),
        )
        .await;
    let marker_pv = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "marker",
            "the marker claim Bound",
            bound,
        )
        .await
        .spec
        .and_then(|spec| spec.volume_name)
        .expect("the marker's PV");
    cluster
        .delete_and_wait(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "marker",
            "the marker claim gone",
        )
        .await;
    cluster
        .wait_gone(&volumes, &marker_pv, "the provisioner deleted the later PV")
        .await;
    assert!(
        volumes.get_opt(&pv_name).await.unwrap().is_some(),
        "a Retain PV stays"
    );
    assert!(
        cluster.driver_volumes().await.contains(&handle),
        "and so does its volume"
    );
    provisioner.stop().await;
    cluster.stop().await;
}

/// A drop-in replacement runs under the upstream sidecar's RBAC: external-provisioner's
/// `deploy/kubernetes/rbac.yaml` grants claims `update` but not `patch` (the Go provisioner
/// reads and updates), where our chart grants `patch`. Our provisioning protection then writes
/// its finalizer and class record by GET and update, and the claim is provisioned, released
/// and deleted as under our chart. Real clusters only: kube-sim enforces no RBAC.
#[tokio::test]
async fn dynamic_provisioning_under_upstream_rbac() {
    const SCENARIO: &str = "dynamic_provisioning_under_upstream_rbac";
    if skip_without_service_accounts(SCENARIO) {
        return;
    }
    let cluster = Cluster::start("upstream-rbac").await;
    // external-provisioner v6.3.0's ClusterRole external-provisioner-runner and Role
    // external-provisioner-cfg (bound cluster-wide here: the scenario's namespace is not the
    // release's).
    let upstream = Rule::of_role(&json!({"rules": [
        {"apiGroups": [""], "resources": ["persistentvolumes"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"],
            "verbs": ["get", "list", "watch", "update"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
            "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"],
            "verbs": ["list", "watch", "create", "update", "patch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"],
            "verbs": ["get", "list", "watch", "update"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshotcontents"],
            "verbs": ["get", "list"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["csinodes"],
            "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"],
            "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "watch", "list", "delete", "update", "create"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["csistoragecapacities"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]},
    ]}));
    let account = "upstream-provisioner";
    let client = cluster
        .service_account_client(rbac::PROVISIONER, account, &upstream)
        .await;
    let class_name = cluster
        .storage_class("fast", "Immediate", "Delete", json!({"kind": "fast"}))
        .await;
    cluster
        .create::<PersistentVolumeClaim>(&cluster.namespaced(), claim("data", &class_name))
        .await;
    if !claim_patch_refused(&client, &cluster.namespace, "data", SCENARIO).await {
        cluster.stop().await;
        return;
    }

    let provisioner = cluster
        .start_provisioner_as(client, cluster.driver.controller.csi.clone(), |_| {})
        .await;
    let bound_claim = cluster
        .wait_for(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "data",
            "the claim Bound and released by a provisioner that may only update claims",
            |c| {
                bound(c)
                    && !c.finalizers().iter().any(|f| f == PROVISIONING_PROTECTION)
                    && !c.annotations().contains_key(PROVISIONING_CLASS)
            },
        )
        .await;
    let pv_name = bound_claim.spec.unwrap().volume_name.unwrap();
    let handle = handle_of(&cluster, &pv_name).await;
    assert!(cluster.driver_volumes().await.contains(&handle));

    claim_deleted_with_its_volume(&cluster, "data", &pv_name, &handle).await;
    provisioner.stop().await;
    cluster.stop().await;
}
