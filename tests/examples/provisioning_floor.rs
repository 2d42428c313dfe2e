//! The floor of "time to all Bound": a provisioner that does only the one write without which
//! no claim binds — the PV, created as soon as kube-controller-manager has annotated the claim
//! for the driver — with no CreateVolume, no Event, no finalizer. On deletion it deletes each
//! Released PV of the driver whose reclaim policy is Delete. 100 writes in flight at most, no
//! client-side limit. Takes the flags the provisioning benchmark gives a `BENCH_PROVISIONER`
//! binary and reads `--kubeconfig` and `--csi-address` (the driver's name: GetPluginInfo).
//!
//! `PROVISIONING_FLOOR_RECORD` adds a record of each provisioning in flight, to measure what
//! keeping one costs on a server:
//! - `claim`: the claim is patched before its PV is created and again after, as our
//!   provisioner's provisioning protection does (there a finalizer and its removal; here an
//!   annotation); `claim-before` and `claim-after` make only that one of the two patches;
//! - `lease`: a Lease of its own per volume instead, in the client's default namespace,
//!   holding the claim as JSON; created before the PV and deleted after. No controller of
//!   kube-controller-manager or the scheduler acts on such a Lease.

use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use csi_grpc::conn::{Endpoint, connect};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_kinds::annotations::{BETA_STORAGE_PROVISIONER, PROVISIONED_BY, STORAGE_PROVISIONER};
use csi_proto::csi::v1 as csi;
use csi_sidecar::kube::client_from_config;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Semaphore;

const RECORD_ANNOTATION: &str = "floor.csi-suite.io/provisioning";

/// The record kept of each provisioning in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    None,
    ClaimBefore,
    ClaimAfter,
    Claim,
    Lease,
}

impl Record {
    fn from_env() -> anyhow::Result<Self> {
        let record = std::env::var("PROVISIONING_FLOOR_RECORD");
        Ok(match record.as_deref() {
            Err(_) => Self::None,
            Ok("claim") => Self::Claim,
            Ok("claim-before") => Self::ClaimBefore,
            Ok("claim-after") => Self::ClaimAfter,
            Ok("lease") => Self::Lease,
            Ok(other) => anyhow::bail!(
                "PROVISIONING_FLOOR_RECORD={other}: claim, claim-before, claim-after or lease"
            ),
        })
    }

    fn claim_before(self) -> bool {
        matches!(self, Self::ClaimBefore | Self::Claim)
    }

    fn claim_after(self) -> bool {
        matches!(self, Self::ClaimAfter | Self::Claim)
    }
}

const PROVISIONER_ANNOTATIONS: [&str; 2] = [STORAGE_PROVISIONER, BETA_STORAGE_PROVISIONER];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flag = |name: &str| {
        std::env::args()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string))
            .with_context(|| format!("--{name}= is needed"))
    };
    let path = flag("kubeconfig")?;
    let timeout = Duration::from_secs(10);
    let driver_connection = connect(
        &Endpoint::parse(&flag("csi-address")?)?,
        timeout,
        CsiOperationMetrics::unregistered(),
    )
    .await?;
    let driver: Arc<str> = driver_connection
        .get_plugin_info(csi::GetPluginInfoRequest {}, timeout)
        .await?
        .name
        .into();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(path)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    // The sidecars' client (one HTTP/2 connection, no client-side limit), so the floor and
    // our provisioner differ in what they write only.
    let client = client_from_config(config, None)?;
    let in_flight = Arc::new(Semaphore::new(100));
    let record = Record::from_env()?;
    tokio::try_join!(
        provision(
            client.clone(),
            Arc::clone(&driver),
            Arc::clone(&in_flight),
            record
        ),
        delete(client, &driver, in_flight)
    )?;
    Ok(())
}

async fn provision(
    client: Client,
    driver: Arc<str>,
    in_flight: Arc<Semaphore>,
    record: Record,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let mut seen = std::collections::HashSet::new();
    let mut reclaim_policies = std::collections::HashMap::new();
    let mut claims = std::pin::pin!(watcher::watcher(
        Api::<PersistentVolumeClaim>::all(client),
        watcher::Config::default()
    ));
    while let Some(event) = claims.next().await {
        let (watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) = event? else {
            continue;
        };
        let ours = PROVISIONER_ANNOTATIONS
            .iter()
            .any(|a| claim.annotations().get(*a).map(String::as_str) == Some(&*driver));
        if !ours {
            continue;
        }
        let spec = claim.spec.clone().unwrap_or_default();
        if spec.volume_name.is_some_and(|n| !n.is_empty()) || !seen.insert(claim.uid()) {
            continue;
        }
        let class_name = spec.storage_class_name.clone().unwrap_or_default();
        // Read once per class, as a cache would answer it.
        let reclaim = match reclaim_policies.get(&class_name) {
            Some(policy) => String::clone(policy),
            None => {
                let class = classes.get(&class_name).await?;
                let policy = class.reclaim_policy.unwrap_or_else(|| "Delete".into());
                reclaim_policies.insert(class_name.clone(), policy.clone());
                policy
            }
        };
        let permit = Arc::clone(&in_flight).acquire_owned().await?;
        let (volumes, leases, driver) = (volumes.clone(), leases.clone(), Arc::clone(&driver));
        let claims = Api::<PersistentVolumeClaim>::namespaced(
            volumes.clone().into_client(),
            &claim.namespace().unwrap_or_default(),
        );
        tokio::spawn(async move {
            let _permit = permit;
            let uid = claim.uid().unwrap_or_default();
            let patch_claim = async |value: Option<&str>| {
                let patch = json!({"metadata": {"annotations": {RECORD_ANNOTATION: value}}});
                let patched = claims
                    .patch(
                        &claim.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(patch),
                    )
                    .await;
                if let Err(error) = patched {
                    eprintln!("patching {}: {error}", claim.name_any());
                }
            };
            let lease_name = format!("provisioning-{uid}");
            if record.claim_before() {
                patch_claim(Some("provisioning")).await;
            }
            if record == Record::Lease {
                let lease = serde_json::to_string(&claim)
                    .map_err(anyhow::Error::from)
                    .and_then(|claim| {
                        Ok(serde_json::from_value::<Lease>(json!({"metadata": {
                            "name": lease_name, "annotations": {RECORD_ANNOTATION: claim}}}))?)
                    });
                let created = match lease {
                    Ok(lease) => leases.create(&PostParams::default(), &lease).await,
                    Err(error) => return eprintln!("Lease of {}: {error}", claim.name_any()),
                };
                if let Err(error) = created {
                    eprintln!("Lease of {}: {error}", claim.name_any());
                }
            }
            let size = spec
                .resources
                .and_then(|r| r.requests)
                .and_then(|r| r.get("storage").cloned());
            let volume = json!({
                "metadata": {"name": format!("pvc-{uid}"),
                    "annotations": {PROVISIONED_BY: &*driver}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.access_modes,
                    "persistentVolumeReclaimPolicy": reclaim,
                    "storageClassName": class_name,
                    "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                        "namespace": claim.namespace(), "name": claim.name_any(), "uid": uid},
                    "csi": {"driver": &*driver, "volumeHandle": uid}}});
            let created = match serde_json::from_value(volume) {
                Ok(volume) => volumes.create(&PostParams::default(), &volume).await,
                Err(error) => return eprintln!("PV of {}: {error}", claim.name_any()),
            };
            if let Err(error) = created {
                eprintln!("PV of {}: {error}", claim.name_any());
            }
            // Alone, the second patch sets the annotation: removing one that is not there
            // would write nothing.
            if record == Record::ClaimAfter {
                patch_claim(Some("provisioned")).await;
            } else if record.claim_after() {
                patch_claim(None).await;
            }
            if record == Record::Lease
                && let Err(error) = leases.delete(&lease_name, &DeleteParams::default()).await
            {
                eprintln!("deleting Lease {lease_name}: {error}");
            }
        });
    }
    Ok(())
}

async fn delete(client: Client, driver: &str, in_flight: Arc<Semaphore>) -> anyhow::Result<()> {
    let volumes: Api<PersistentVolume> = Api::all(client);
    let mut deleting = std::collections::HashSet::new();
    let mut events = std::pin::pin!(watcher::watcher(
        volumes.clone(),
        watcher::Config::default()
    ));
    while let Some(event) = events.next().await {
        let (watcher::Event::Apply(volume) | watcher::Event::InitApply(volume)) = event? else {
            continue;
        };
        let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let reclaim_delete = volume
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        let ours = volume
            .annotations()
            .get(PROVISIONED_BY)
            .is_some_and(|name| name == driver);
        if !released || !reclaim_delete || !ours || !deleting.insert(volume.name_any()) {
            continue;
        }
        let permit = Arc::clone(&in_flight).acquire_owned().await?;
        let volumes = volumes.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = volumes
                .delete(&volume.name_any(), &DeleteParams::default())
                .await
            {
                eprintln!("deleting {}: {error}", volume.name_any());
            }
        });
    }
    Ok(())
}
