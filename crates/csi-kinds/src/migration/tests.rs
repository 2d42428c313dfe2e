use serde_json::{Value, json};

use super::*;

fn class(provisioner: &str, parameters: Value, allowed: Value) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "gp2"},
        "provisioner": provisioner,
        "parameters": parameters,
        "allowedTopologies": allowed,
        "reclaimPolicy": "Delete",
    }))
    .unwrap()
}

fn pv(value: Value) -> PersistentVolume {
    serde_json::from_value(value).unwrap()
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

#[test]
fn plugins_and_drivers() {
    for plugin in Plugin::ALL {
        assert_eq!(Plugin::for_driver(plugin.csi_driver()), Some(plugin));
        assert_eq!(
            Plugin::for_in_tree_name(plugin.in_tree_name()),
            Some(plugin)
        );
    }
    assert_eq!(Plugin::for_driver("ebs.csi.aws.com"), Some(Plugin::AwsEbs));
    assert_eq!(Plugin::for_driver("hostpath.csi-suite.io"), None);
    // csi-translation-lib 0.36 has no RBD or CephFS translation.
    assert_eq!(Plugin::for_in_tree_name("kubernetes.io/rbd"), None);
    assert_eq!(Plugin::for_in_tree_name("kubernetes.io/cephfs"), None);
}

#[test]
fn storage_classes() {
    let zone_terms = |key: &str, zones: Value| json!([{"matchLabelExpressions": [{"key": key, "values": zones}]}]);
    let cases: Vec<(&str, Plugin, Value, Value, Value, Value)> = vec![
        (
            "EKS gp2: fsType and type",
            Plugin::AwsEbs,
            json!({"type": "gp2", "fsType": "ext4"}),
            Value::Null,
            json!({"type": "gp2", "csi.storage.k8s.io/fstype": "ext4"}),
            Value::Null,
        ),
        (
            "EBS zones become allowed topologies",
            Plugin::AwsEbs,
            json!({"zones": "us-east-1a,us-east-1b", "iopsPerGB": "10"}),
            Value::Null,
            json!({"iopsPerGB": "10", "allowautoiopspergbincrease": "true"}),
            zone_terms(
                "topology.ebs.csi.aws.com/zone",
                json!(["us-east-1a", "us-east-1b"]),
            ),
        ),
        (
            "GCE zone, other parameters kept",
            Plugin::GcePd,
            json!({"zone": "us-central1-a", "type": "pd-ssd", "replication-type": "none"}),
            Value::Null,
            json!({"type": "pd-ssd", "replication-type": "none"}),
            zone_terms("topology.gke.io/zone", json!(["us-central1-a"])),
        ),
        (
            "GCE allowed topologies re-keyed (GA and beta labels)",
            Plugin::GcePd,
            json!({"type": "pd-standard"}),
            json!([{"matchLabelExpressions": [
                {"key": "topology.kubernetes.io/zone", "values": ["a"]},
                {"key": "failure-domain.beta.kubernetes.io/zone", "values": ["b"]},
                {"key": "other", "values": ["c"]}]}]),
            json!({"type": "pd-standard"}),
            json!([{"matchLabelExpressions": [
                {"key": "topology.gke.io/zone", "values": ["a"]},
                {"key": "topology.gke.io/zone", "values": ["b"]},
                {"key": "other", "values": ["c"]}]}]),
        ),
        (
            "Azure disk: fsType kept, unzoned region emptied",
            Plugin::AzureDisk,
            json!({"skuName": "Premium_LRS", "fsType": "xfs"}),
            zone_terms("topology.kubernetes.io/zone", json!(["1", "westus-1"])),
            json!({"skuName": "Premium_LRS", "fsType": "xfs"}),
            zone_terms("topology.disk.csi.azure.com/zone", json!(["", "westus-1"])),
        ),
        (
            "Azure file: as it is",
            Plugin::AzureFile,
            json!({"skuName": "Standard_LRS"}),
            zone_terms("topology.kubernetes.io/zone", json!(["a"])),
            json!({"skuName": "Standard_LRS"}),
            zone_terms("topology.kubernetes.io/zone", json!(["a"])),
        ),
        (
            "Cinder: fstype, zone kept as a parameter",
            Plugin::Cinder,
            json!({"FSType": "ext4", "availability": "nova"}),
            zone_terms("topology.kubernetes.io/zone", json!(["nova"])),
            json!({"csi.storage.k8s.io/fstype": "ext4", "availability": "nova"}),
            zone_terms("topology.cinder.csi.openstack.org/zone", json!(["nova"])),
        ),
        (
            "vSphere: migration parameters, unknown dropped",
            Plugin::VsphereVolume,
            json!({"datastore": "ds1", "storagePolicyName": "gold", "diskformat": "thin", "unknown": "x"}),
            Value::Null,
            json!({"datastore-migrationparam": "ds1", "storagepolicyname": "gold",
                "diskformat-migrationparam": "thin", "csimigration": "true"}),
            Value::Null,
        ),
        (
            "Portworx: the auth secret for every operation",
            Plugin::PortworxVolume,
            json!({"repl": "2", "openstorage.io/auth-secret-name": "s", "openstorage.io/auth-secret-namespace": "ns"}),
            Value::Null,
            json!({"repl": "2",
                "csi.storage.k8s.io/provisioner-secret-name": "s", "csi.storage.k8s.io/provisioner-secret-namespace": "ns",
                "csi.storage.k8s.io/controller-publish-secret-name": "s", "csi.storage.k8s.io/controller-publish-secret-namespace": "ns",
                "csi.storage.k8s.io/node-publish-secret-name": "s", "csi.storage.k8s.io/node-publish-secret-namespace": "ns",
                "csi.storage.k8s.io/node-stage-secret-name": "s", "csi.storage.k8s.io/node-stage-secret-namespace": "ns",
                "csi.storage.k8s.io/controller-expand-secret-name": "s", "csi.storage.k8s.io/controller-expand-secret-namespace": "ns",
                "csi.storage.k8s.io/node-expand-secret-name": "s", "csi.storage.k8s.io/node-expand-secret-namespace": "ns"}),
            Value::Null,
        ),
    ];
    for (name, plugin, parameters, allowed, want_parameters, want_allowed) in cases {
        let input = class(plugin.in_tree_name(), parameters, allowed);
        let got = plugin.storage_class_to_csi(&input).unwrap();
        assert_eq!(to_json(&got.parameters), want_parameters, "{name}");
        assert_eq!(to_json(&got.allowed_topologies), want_allowed, "{name}");
        assert_eq!(got.provisioner, plugin.in_tree_name(), "{name}");
        assert_eq!(got.reclaim_policy.as_deref(), Some("Delete"), "{name}");
    }
    let both = class(
        "kubernetes.io/aws-ebs",
        json!({"zone": "a"}),
        zone_terms("topology.kubernetes.io/zone", json!(["b"])),
    );
    assert_eq!(
        Plugin::AwsEbs.storage_class_to_csi(&both),
        Err(MigrationError::ZonesAndAllowedTopologies)
    );
}

#[test]
fn created_volumes_written_as_in_tree() {
    let csi_pv = |csi: Value, affinity: Value| {
        pv(json!({"metadata": {"name": "pvc-1"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "csi": csi, "nodeAffinity": affinity}}))
    };
    let zone_affinity = |key: &str, zone: &str| {
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": [zone]}]}]}})
    };
    let cases: Vec<(&str, Plugin, PersistentVolume, Value, Value, Value)> = vec![
        (
            "EBS with a zone: region added",
            Plugin::AwsEbs,
            csi_pv(
                json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "fsType": "ext4",
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "x"}}),
                zone_affinity("topology.ebs.csi.aws.com/zone", "us-east-1a"),
            ),
            json!({"awsElasticBlockStore": {"volumeID": "vol-0abc", "fsType": "ext4"}}),
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-east-1"]}]}]}}),
            json!({"topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1"}),
        ),
        (
            "EBS without topology",
            Plugin::AwsEbs,
            csi_pv(
                json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "readOnly": true,
                    "volumeAttributes": {"partition": "2"}}),
                Value::Null,
            ),
            json!({"awsElasticBlockStore": {"volumeID": "vol-1", "readOnly": true, "partition": 2}}),
            Value::Null,
            Value::Null,
        ),
        (
            "GCE PD: the disk name of the handle",
            Plugin::GcePd,
            csi_pv(
                json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/us-central1-a/disks/pvc-1"}),
                zone_affinity("topology.gke.io/zone", "us-central1-a"),
            ),
            json!({"gcePersistentDisk": {"pdName": "pvc-1"}}),
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-central1"]}]}]}}),
            json!({"topology.kubernetes.io/zone": "us-central1-a", "topology.kubernetes.io/region": "us-central1"}),
        ),
        (
            "Azure disk: managed, name from the URI",
            Plugin::AzureDisk,
            csi_pv(
                json!({"driver": "disk.csi.azure.com",
                    "volumeHandle": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
                    "volumeAttributes": {"cachingMode": "ReadOnly"}}),
                Value::Null,
            ),
            json!({"azureDisk": {"diskName": "d1", "diskURI": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
                "cachingMode": "ReadOnly", "fsType": "", "readOnly": false, "kind": "Managed"}}),
            Value::Null,
            Value::Null,
        ),
        (
            "Azure file: share and secret from the handle",
            Plugin::AzureFile,
            csi_pv(
                json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pvc-1#ns"}),
                Value::Null,
            ),
            json!({"azureFile": {"shareName": "share", "secretName": "azure-storage-account-acct-secret", "secretNamespace": "default"}}),
            Value::Null,
            Value::Null,
        ),
        (
            "Cinder: zone, no region",
            Plugin::Cinder,
            csi_pv(
                json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1"}),
                zone_affinity("topology.cinder.csi.openstack.org/zone", "nova"),
            ),
            json!({"cinder": {"volumeID": "c-1"}}),
            zone_affinity("topology.kubernetes.io/zone", "nova"),
            json!({"topology.kubernetes.io/zone": "nova"}),
        ),
        (
            "vSphere: the initial file path",
            Plugin::VsphereVolume,
            csi_pv(
                json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "fcd-1",
                    "volumeAttributes": {"initialvolumefilepath": "[ds] fcd/1.vmdk"}}),
                zone_affinity("topology.csi.vmware.com/zone", "z1"),
            ),
            json!({"vsphereVolume": {"volumePath": "[ds] fcd/1.vmdk"}}),
            zone_affinity("topology.kubernetes.io/zone", "z1"),
            json!({"topology.kubernetes.io/zone": "z1"}),
        ),
        (
            "Portworx",
            Plugin::PortworxVolume,
            csi_pv(
                json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "fsType": "ext4"}),
                Value::Null,
            ),
            json!({"portworxVolume": {"volumeID": "px-1", "fsType": "ext4"}}),
            Value::Null,
            Value::Null,
        ),
    ];
    for (name, plugin, mut volume, want_source, want_affinity, want_labels) in cases {
        plugin.csi_to_in_tree(&mut volume).unwrap();
        let mut spec = to_json(volume.spec.as_ref().unwrap());
        let affinity = spec
            .as_object_mut()
            .unwrap()
            .remove("nodeAffinity")
            .unwrap_or(Value::Null);
        let object = spec.as_object_mut().unwrap();
        object.remove("accessModes");
        object.remove("capacity");
        assert_eq!(spec, want_source, "{name}");
        assert_eq!(affinity, want_affinity, "{name}");
        assert_eq!(to_json(&volume.metadata.labels), want_labels, "{name}");
    }
}

#[test]
fn created_volume_errors() {
    let mut not_csi = pv(json!({"metadata": {"name": "x"}, "spec": {}}));
    assert_eq!(
        Plugin::AwsEbs.csi_to_in_tree(&mut not_csi),
        Err(MigrationError::NotCsi)
    );
    let mut short =
        pv(json!({"spec": {"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "pvc-1"}}}));
    assert_eq!(
        Plugin::GcePd.csi_to_in_tree(&mut short),
        Err(MigrationError::GceVolumeId(1))
    );
    // A zone-less topology (a driver reporting other keys only) has no region to derive.
    let mut other_keys = pv(json!({"spec": {
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/node", "operator": "In", "values": ["n1"]}]}]}}}}));
    assert_eq!(
        Plugin::AwsEbs.csi_to_in_tree(&mut other_keys),
        Err(MigrationError::Topology("no zones specified".to_string()))
    );
    let mut bad_partition = pv(json!({"spec": {"csi": {"driver": "ebs.csi.aws.com",
        "volumeHandle": "vol-1", "volumeAttributes": {"partition": "one"}}}}));
    assert_eq!(
        Plugin::AwsEbs.csi_to_in_tree(&mut bad_partition),
        Err(MigrationError::Partition("one".to_string()))
    );
}

#[test]
fn in_tree_volumes_as_csi() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "EBS: aws:// ID, zone label to node affinity",
            json!({"metadata": {"name": "pv-1", "labels": {"topology.kubernetes.io/zone": "us-east-1a"}},
                "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0abc", "fsType": "ext4"}}}),
            json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "fsType": "ext4",
                    "volumeAttributes": {"partition": "0"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1a"]}]}]}}}),
        ),
        (
            "EBS: beta zone and region in node affinity",
            json!({"metadata": {"name": "pv-1"},
                "spec": {"awsElasticBlockStore": {"volumeID": "vol-1", "readOnly": true},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
                    {"key": "failure-domain.beta.kubernetes.io/region", "operator": "In", "values": ["us-east-1"]}]}]}}}}),
            json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "readOnly": true,
                    "volumeAttributes": {"partition": "0"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1a"]},
                    {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-east-1"]}]}]}}}),
        ),
        (
            "GCE PD: zonal handle from the zone label",
            json!({"metadata": {"name": "pv-1", "labels": {"topology.kubernetes.io/zone": "us-central1-a"}},
                "spec": {"accessModes": ["ReadWriteMany"], "gcePersistentDisk": {"pdName": "disk-1", "partition": 1}}}),
            json!({"accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
                    "volumeAttributes": {"partition": "1"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.gke.io/zone", "operator": "In", "values": ["us-central1-a"]}]}]}}}),
        ),
        (
            "GCE PD: regional handle from two zones",
            json!({"metadata": {"name": "pv-1", "labels": {"failure-domain.beta.kubernetes.io/zone": "us-central1-a__us-central1-b"}},
                "spec": {"accessModes": ["ReadOnlyMany"], "gcePersistentDisk": {"pdName": "disk-1"}}}),
            json!({"accessModes": ["ReadOnlyMany"],
                "csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/regions/us-central1/disks/disk-1",
                    "volumeAttributes": {"partition": ""}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.gke.io/zone", "operator": "In", "values": ["us-central1-a", "us-central1-b"]}]}]}}}),
        ),
        (
            "GCE PD: no zone",
            json!({"metadata": {"name": "pv-1"}, "spec": {"gcePersistentDisk": {"pdName": "disk-1"}}}),
            json!({"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1",
                "volumeAttributes": {"partition": ""}}}),
        ),
        (
            "Azure disk",
            json!({"metadata": {"name": "pv-1"}, "spec": {"azureDisk": {"diskName": "d1", "diskURI": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
                "cachingMode": "None", "fsType": "ext4", "kind": "Managed"}}}),
            json!({"csi": {"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
                "fsType": "ext4", "volumeAttributes": {"cachingmode": "None", "fstype": "ext4", "kind": "Managed"}}}),
        ),
        (
            "Azure file: the claim's namespace, the resource group annotation",
            json!({"metadata": {"name": "pv-1", "annotations": {"kubernetes.io/azure-file-resource-group": "rg"}},
                "spec": {"azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "share"},
                "claimRef": {"namespace": "team", "name": "c"}}}),
            json!({"claimRef": {"namespace": "team", "name": "c"},
                "csi": {"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pv-1#team",
                "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "team"},
                "volumeAttributes": {"sharename": "share"}}}),
        ),
        (
            "Cinder",
            json!({"metadata": {"name": "pv-1"}, "spec": {"cinder": {"volumeID": "c-1", "fsType": "xfs"}}}),
            json!({"csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1", "fsType": "xfs", "volumeAttributes": {}}}),
        ),
        (
            "vSphere: zone and region labels",
            json!({"metadata": {"name": "pv-1", "labels": {"topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1"}},
                "spec": {"vsphereVolume": {"volumePath": "[ds] v.vmdk", "storagePolicyName": "gold"}}}),
            json!({"csi": {"driver": "csi.vsphere.vmware.com", "volumeHandle": "[ds] v.vmdk",
                    "volumeAttributes": {"storagepolicyname": "gold"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.csi.vmware.com/zone", "operator": "In", "values": ["z1"]},
                    {"key": "topology.csi.vmware.com/region", "operator": "In", "values": ["r1"]}]}]}}}),
        ),
        (
            "Portworx: the auth secret annotations",
            json!({"metadata": {"name": "pv-1", "annotations": {"openstorage.io/auth-secret-name": "s", "openstorage.io/auth-secret-namespace": "ns"}},
                "spec": {"portworxVolume": {"volumeID": "px-1"}}}),
            json!({"csi": {"driver": "pxd.portworx.com", "volumeHandle": "px-1", "volumeAttributes": {},
                "controllerPublishSecretRef": {"name": "s", "namespace": "ns"},
                "nodeStageSecretRef": {"name": "s", "namespace": "ns"},
                "nodePublishSecretRef": {"name": "s", "namespace": "ns"},
                "controllerExpandSecretRef": {"name": "s", "namespace": "ns"},
                "nodeExpandSecretRef": {"name": "s", "namespace": "ns"}}}),
        ),
    ];
    for (name, input, want) in cases {
        let got = in_tree_to_csi(&pv(input)).unwrap().expect(name);
        assert_eq!(to_json(got.spec.as_ref().unwrap()), want, "{name}");
    }
    let csi = pv(json!({"spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}));
    assert_eq!(in_tree_to_csi(&csi), Ok(None));
    let nfs = pv(json!({"spec": {"nfs": {"server": "s", "path": "/"}}}));
    assert_eq!(in_tree_to_csi(&nfs), Ok(None));
    let errors: Vec<(Value, MigrationError)> = vec![
        (
            json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/disk/1"}}}),
            MigrationError::AwsVolumeId("aws://us-east-1a/disk/1".to_string()),
        ),
        (
            json!({"spec": {"azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Shared"}}}),
            MigrationError::AzureDiskKind("Shared".to_string()),
        ),
        (
            json!({"spec": {"azureFile": {"secretName": "s", "shareName": "x"}}}),
            MigrationError::AzureFileNamespace,
        ),
    ];
    for (input, want) in errors {
        assert_eq!(in_tree_to_csi(&pv(input)), Err(want));
    }
}

#[test]
fn round_trip() {
    let created = pv(json!({"metadata": {"name": "pvc-1"}, "spec": {
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "ext4"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1a"]}]}]}}}}));
    let mut in_tree = created.clone();
    Plugin::AwsEbs.csi_to_in_tree(&mut in_tree).unwrap();
    let back = in_tree_to_csi(&in_tree).unwrap().unwrap();
    let csi = back.spec.as_ref().unwrap().csi.as_ref().unwrap();
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    let zones = values_of(&back, "topology.ebs.csi.aws.com/zone");
    assert_eq!(zones, vec!["us-east-1a".to_string()]);
}

#[test]
fn regions() {
    let zones = |z: &[&str]| z.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(aws_region(&zones(&["us-east-1a"])), Ok("us-east-1".into()));
    assert_eq!(
        aws_region(&zones(&["us-gov-west-1a"])),
        Ok("us-gov-west-1".into())
    );
    assert_eq!(
        aws_region(&zones(&["us-west-2-lax-1a"])),
        Ok("us-west-2".into())
    );
    assert!(aws_region(&zones(&["us-east-1a", "us-west-2a"])).is_err());
    assert!(aws_region(&zones(&["nowhere"])).is_err());
    assert_eq!(
        gce_region(&zones(&["europe-west1-b"])),
        Ok("europe-west1".into())
    );
    assert!(gce_region(&zones(&[])).is_err());
}
