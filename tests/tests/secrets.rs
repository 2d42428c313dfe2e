//! Secrets named by a StorageClass reach the driver and the PV, never logs or Events. Its own
//! test binary: the log capture must be the process-wide subscriber (tracing caches
//! per-callsite interest globally, so a thread-local one can miss events).

use std::io::Write;
use std::sync::{Arc, Mutex};

use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::{bound, claim, secret};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::DeleteParams;
use prost::Message;
use serde_json::json;

/// Everything the process logs, at TRACE.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    /// Installs the capture as the global subscriber (before the cluster's own logging).
    fn install(&self) {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn secrets_reach_the_driver_and_the_pv_but_not_logs_or_events() {
    let logs = CapturedLogs::default();
    logs.install();
    let cluster = Cluster::start("secrets").await;
    let password = format!("pw-{}", cluster.namespace);
    secret(&cluster, "creds", &password).await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let parameters = json!({
        "csi.storage.k8s.io/provisioner-secret-name": "creds",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        "csi.storage.k8s.io/node-stage-secret-name": "${pvc.name}-stage",
        "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
        "csi.storage.k8s.io/controller-publish-secret-name": "creds",
        "csi.storage.k8s.io/controller-publish-secret-namespace": "${pvc.namespace}",
    });
    let class_name = cluster
        .storage_class("secret", "Immediate", "Delete", parameters)
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("data", &class_name)).await;
    let bound_claim = cluster
        .wait_for(&claims, "data", "the claim Bound", bound)
        .await;

    let requests = proxy.create_volume_requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(
            request.secrets.get("password"),
            Some(&password),
            "CreateVolume carries the provisioner secret"
        );
        assert!(
            !request
                .parameters
                .keys()
                .any(|k| k.starts_with("csi.storage.k8s.io/")),
            "reserved keys are not driver parameters: {:?}",
            request.parameters
        );
    }
    let pv_name = bound_claim.spec.unwrap().volume_name.unwrap();
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    let source = pv.spec.clone().unwrap().csi.unwrap();
    let stage = source
        .node_stage_secret_ref
        .expect("a node-stage secret ref");
    assert_eq!(
        (stage.name.as_deref(), stage.namespace.as_deref()),
        (Some("data-stage"), Some(cluster.namespace.as_str()))
    );
    let publish = source
        .controller_publish_secret_ref
        .expect("a controller-publish secret ref");
    assert_eq!(publish.name.as_deref(), Some("creds"));

    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let volumes = cluster.cluster_scoped::<PersistentVolume>();
    cluster
        .wait_gone(&volumes, &pv_name, "the PV deleted")
        .await;
    let deletes: Vec<csi::DeleteVolumeRequest> = proxy
        .calls()
        .into_iter()
        .filter(|c| c.path.ends_with("/DeleteVolume"))
        .filter_map(|c| csi::DeleteVolumeRequest::decode(c.message).ok())
        .collect();
    assert!(
        deletes
            .iter()
            .any(|d| d.secrets.get("password") == Some(&password)),
        "DeleteVolume carries the deletion secret"
    );

    let logged = logs.text();
    assert!(
        logged.contains("CSI request") && logged.contains("CreateVolume"),
        "the CSI calls were logged at TRACE"
    );
    assert!(
        !logged.contains(&password),
        "a secret value reached the logs"
    );
    let events = cluster.events().await;
    assert!(
        events
            .iter()
            .all(|e| !e.message.clone().unwrap_or_default().contains(&password)),
        "a secret value reached an Event"
    );
    provisioner.stop().await;
    cluster.stop().await;
}
