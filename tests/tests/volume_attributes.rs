//! VolumeAttributesClasses with csi-provisioner: a claim's class gives CreateVolume its
//! mutable parameters and names itself on the PV; a class of another driver is refused.

use csi_provisioner::vac::VolumeAttributesClass;
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::{bound, bound_volume, claim, driver_state};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;
use std::collections::BTreeMap;

/// Creates the VolumeAttributesClass `name` of `driver` (deleted with the scenario).
async fn attributes_class(cluster: &Cluster, name: &str, driver: &str, iops: &str) {
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
