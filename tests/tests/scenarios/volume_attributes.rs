//! VolumeAttributesClasses with csi-provisioner: a claim's class gives CreateVolume its
//! mutable parameters and names itself on the PV; a class of another driver is refused.

use csi_kinds::vac::VolumeAttributesClass;
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::{bound, bound_volume, claim, driver_state};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;

/// Creates the VolumeAttributesClass `name` of `driver` (deleted with the scenario).
pub(crate) async fn attributes_class(cluster: &Cluster, name: &str, driver: &str, iops: &str) {
    let resource = ApiResource::erase::<VolumeAttributesClass>(&());
    let classes: Api<DynamicObject> = Api::all_with(cluster.client.clone(), &resource);
    let mut class = DynamicObject::new(name, &resource);
    class.data = json!({"driverName": driver, "parameters": {"iops": iops}});
    cluster.delete_at_cleanup::<VolumeAttributesClass>(None, name);
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap_or_else(|error| panic!("creating VolumeAttributesClass {name}: {error}"));
}

#[tokio::test]
async fn a_claims_attributes_class_reaches_create_volume_and_its_pv() {
    let cluster = Cluster::start("provision-vac").await;
    if !cluster
        .serves("storage.k8s.io/v1", "volumeattributesclasses")
        .await
    {
        cluster.stop().await;
        return;
    }
    let provisioner = cluster.start_provisioner().await;
    let class_name = cluster
        .storage_class("vac", "Immediate", "Delete", json!({}))
        .await;
    let gold = format!("{}-gold", cluster.namespace);
    let foreign = format!("{}-foreign", cluster.namespace);
    attributes_class(&cluster, &gold, &cluster.driver_name, "3000").await;
    attributes_class(&cluster, &foreign, "other.example.com", "9000").await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();

    let mut data = claim("data", &class_name);
    data["spec"]["volumeAttributesClassName"] = json!(gold);
    cluster.create(&claims, data).await;
    let spec = bound_volume(&cluster, &claims, "data", "the claim with a class Bound").await;
    assert_eq!(
        spec.volume_attributes_class_name.as_deref(),
        Some(gold.as_str()),
        "the PV names the claim's class"
    );
    let handle = spec.csi.unwrap().volume_handle;
    assert_eq!(
        driver_state(&cluster).volumes[&handle].mutable_parameters,
        BTreeMap::from([("iops".to_string(), "3000".to_string())]),
        "CreateVolume got the class's parameters as mutable parameters"
    );

    let mut other = claim("other", &class_name);
    other["spec"]["volumeAttributesClassName"] = json!(foreign);
    cluster.create(&claims, other).await;
    let message = cluster
        .wait_for_event("other", "ProvisioningFailed", "does not match driver name")
        .await;
    assert_eq!(
        message,
        format!(
            "VAC {foreign} referenced in PVC is for driver other.example.com which does not match driver name {}",
            cluster.driver_name
        )
    );
    assert!(
        !bound(&claims.get("other").await.unwrap()),
        "no volume for a class of another driver"
    );

    provisioner.stop().await;
    cluster.stop().await;
}

pub(crate) fn current_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.current_volume_attributes_class_name.as_deref())
}

pub(crate) fn modify_status(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.modify_volume_status.as_ref())
        .map(|s| s.status.as_str())
}

pub(crate) async fn request_class(cluster: &Cluster, claim: &str, class: &str) {
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeAttributesClassName": class}})),
        )
        .await
        .expect("the claim names another class");
}

/// csi-resizer's modify controller: a bound claim naming another class has its volume
/// modified with ControllerModifyVolume (the PV and the claim's status then name the class); a
/// class that does not exist leaves the claim Pending; parameters the driver refuses leave it
/// Infeasible with a ModifyVolumeError condition, until the claim names a class that works.
#[tokio::test]
async fn a_claim_naming_another_class_has_its_volume_modified() {
    let cluster = Cluster::start("modify-vac").await;
    if !cluster
        .serves("storage.k8s.io/v1", "volumeattributesclasses")
        .await
    {
        cluster.stop().await;
        return;
    }
    let provisioner = cluster.start_provisioner().await;
    let resizer = cluster.start_resizer().await;
    let storage = cluster
        .storage_class("modify", "Immediate", "Delete", json!({}))
        .await;
    let gold = format!("{}-gold", cluster.namespace);
    let platinum = format!("{}-platinum", cluster.namespace);
    let refused = format!("{}-refused", cluster.namespace);
    attributes_class(&cluster, &gold, &cluster.driver_name, "3000").await;
    attributes_class(&cluster, &platinum, &cluster.driver_name, "6000").await;
    let resource = ApiResource::erase::<VolumeAttributesClass>(&());
    let classes: Api<DynamicObject> = Api::all_with(cluster.client.clone(), &resource);
    let mut tier = DynamicObject::new(&refused, &resource);
    // The reference driver accepts only the mutable parameter `iops`.
    tier.data = json!({"driverName": cluster.driver_name, "parameters": {"tier": "fast"}});
    cluster.delete_at_cleanup::<VolumeAttributesClass>(None, &refused);
    classes.create(&PostParams::default(), &tier).await.unwrap();
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut data = claim("data", &storage);
    data["spec"]["volumeAttributesClassName"] = json!(gold);
    cluster.create(&claims, data).await;
    let spec = bound_volume(&cluster, &claims, "data", "the claim Bound").await;
    let handle = spec.csi.unwrap().volume_handle;

    request_class(&cluster, "data", &platinum).await;
    let want = platinum.clone();
    cluster
        .wait_for(
            &claims,
            "data",
            "the claim's current class platinum",
            move |c| current_class(c) == Some(want.as_str()) && modify_status(c).is_none(),
        )
        .await;
    cluster
        .wait_for_event("data", "VolumeModifySuccessful", "successfully")
        .await;
    let pv_name = claims
        .get("data")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = cluster
        .cluster_scoped::<k8s_openapi::api::core::v1::PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    assert_eq!(
        pv.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some(platinum.as_str()),
        "the PV names the new class"
    );
    assert_eq!(
        driver_state(&cluster).volumes[&handle].mutable_parameters["iops"],
        "6000",
        "ControllerModifyVolume got the class's parameters"
    );

    let missing = format!("{}-missing", cluster.namespace);
    request_class(&cluster, "data", &missing).await;
    cluster
        .wait_for(&claims, "data", "the claim Pending a class", |c| {
            modify_status(c) == Some("Pending")
        })
        .await;
    cluster
        .wait_for_event("data", "VolumeModifyFailed", "does not exist")
        .await;

    request_class(&cluster, "data", &refused).await;
    let infeasible = cluster
        .wait_for(&claims, "data", "the modification Infeasible", |c| {
            modify_status(c) == Some("Infeasible")
        })
        .await;
    let conditions = infeasible.status.unwrap().conditions.unwrap_or_default();
    let error = conditions
        .iter()
        .find(|c| c.type_ == "ModifyVolumeError")
        .expect("a ModifyVolumeError condition");
    assert_eq!(error.reason.as_deref(), Some("InvalidArgument"));
    assert_eq!(
        current_class(&claims.get("data").await.unwrap()),
        Some(platinum.as_str()),
        "the volume keeps its class"
    );

    request_class(&cluster, "data", &gold).await;
    let want = gold.clone();
    let recovered = cluster
        .wait_for(&claims, "data", "back on a class that works", move |c| {
            current_class(c) == Some(want.as_str()) && modify_status(c).is_none()
        })
        .await;
    assert!(
        recovered
            .status
            .unwrap()
            .conditions
            .unwrap_or_default()
            .iter()
            .all(|c| c.type_ != "ModifyVolumeError" && c.type_ != "ModifyingVolume"),
        "the modify conditions are cleared"
    );
    assert_eq!(
        driver_state(&cluster).volumes[&handle].mutable_parameters["iops"],
        "3000"
    );

    resizer.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}
