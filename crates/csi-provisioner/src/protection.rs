//! What a claim's provisioning-protection finalizer carries with it. Until its PV exists, a
//! claim may own a volume whose ID only a repeated CreateVolume (idempotent by name) can
//! tell, and that needs the StorageClass: its parameters, secrets and topology. So the class
//! is recorded on the claim in the patch that adds the finalizer, and a claim whose class was
//! deleted meanwhile is still finished (and its volume then deleted through its PV, with the
//! secret the PV records). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

/// Our finalizer on claims whose volume may exist at the driver without a PV yet: added before
/// the first CreateVolume, removed once the PV exists or nothing was created. (Upstream keeps
/// this in memory only and leaks volumes on restart: external-provisioner #486.)
pub const PROVISIONING_PROTECTION: &str = "csi-suite.io/provisioning-protection";

/// The claim annotation holding the StorageClass provisioning started with, as JSON.
pub const PROVISIONING_CLASS: &str = "csi-suite.io/provisioning-class";

/// The class as recorded: everything but its metadata other than the name (names of secrets
/// only, never their data: a class holds no more).
pub fn record(class: &StorageClass) -> Result<String, serde_json::Error> {
    let recorded = StorageClass {
        metadata: ObjectMeta {
            name: Some(class.name_any()),
            ..ObjectMeta::default()
        },
        ..class.clone()
    };
    serde_json::to_string(&recorded)
}

/// The class recorded on a claim; `None` without a record (a claim protected before records
/// existed), or with one that is not a StorageClass.
pub fn recorded_class(
    claim_annotations: &BTreeMap<String, String>,
) -> Option<Result<StorageClass, serde_json::Error>> {
    claim_annotations
        .get(PROVISIONING_CLASS)
        .map(|json| serde_json::from_str(json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_class_round_trips_without_its_metadata() {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "fast", "uid": "u1", "resourceVersion": "9",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "provisioner": "csi.example.com",
            "parameters": {"kind": "ssd",
                "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-creds",
                "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}"},
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "WaitForFirstConsumer",
            "mountOptions": ["noatime"],
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}],
        }))
        .unwrap();
        let recorded = record(&class).unwrap();
        let annotations = BTreeMap::from([(PROVISIONING_CLASS.to_string(), recorded)]);
        let back = recorded_class(&annotations)
            .expect("a record")
            .expect("a StorageClass");
        let expected = StorageClass {
            metadata: ObjectMeta {
                name: Some("fast".into()),
                ..ObjectMeta::default()
            },
            ..class
        };
        assert_eq!(back, expected);
    }

    #[test]
    fn records_that_are_missing_or_broken() {
        let table = [
            ("no record", BTreeMap::new(), None),
            (
                "not JSON",
                BTreeMap::from([(PROVISIONING_CLASS.to_string(), "fast".to_string())]),
                Some(false),
            ),
            (
                "not a StorageClass",
                BTreeMap::from([(PROVISIONING_CLASS.to_string(), "[1]".to_string())]),
                Some(false),
            ),
        ];
        for (what, annotations, expected) in table {
            assert_eq!(
                recorded_class(&annotations).map(|r| r.is_ok()),
                expected,
                "{what}"
            );
        }
    }
}
