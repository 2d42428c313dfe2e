//! The adapters: connect to the driver and the cluster, read both sides, and print, create or
//! serve what the pure core decided.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_grpc::conn::{self, ConnError, CsiConnection, DriverInfo, Services};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_kinds::snapshot::VolumeSnapshotContent;
use csi_proto::csi::v1 as csi;
use csi_proto::csi::v1::controller_service_capability::rpc::Type as ControllerCapability;
use csi_proto::csi::v1::volume_health::VolumeHealthEntry;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::flags::{ImportArgs, Output, ReportArgs, Target};
use crate::import::{ImportSpec, Refusal, orphan_pv_name, persistent_volume};
use crate::metrics::InventoryMetrics;
use crate::objects::{
    cluster_snapshot, cluster_volume, health_condition, inline_volumes, legacy_storage_volume,
    storage_snapshot, storage_volume,
};
use crate::report::{
    ClusterVolume, Finding, InlineVolume, Inputs, Report, SnapshotInputs, compare, is_inline_handle,
};
use csi_grpc::listing::{self, ListError, Paging};

/// The exit code of a report with findings (0: clean), for cron alerting.
pub const FINDINGS_EXIT_CODE: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Csi(#[from] ConnError),
    #[error(transparent)]
    KubeClient(#[from] csi_sidecar::kube::KubeClientError),
    #[error("reading {what}: {source}")]
    Kube {
        what: &'static str,
        source: kube::Error,
    },
    #[error(
        "CSI driver {0} does not have the controller capability LIST_VOLUMES, which the inventory needs"
    )]
    NoListVolumes(String),
    #[error(transparent)]
    Listing(#[from] ListError),
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("StorageClass {name}: {source}")]
    Class { name: String, source: kube::Error },
    #[error("creating PersistentVolume {name}: {source}")]
    Create { name: String, source: kube::Error },
    #[error("{failed} of {total} orphans were not imported (see above)")]
    Partly { failed: usize, total: usize },
    #[error(transparent)]
    Http(#[from] csi_grpc::http::HttpError),
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

/// A connected driver and cluster: what every command starts from.
pub struct Inventory {
    pub csi: CsiConnection,
    pub driver: DriverInfo,
    pub client: Client,
    pub paging: Paging,
}

impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("driver", &self.driver.name)
            .field("paging", &self.paging)
            .finish_non_exhaustive()
    }
}

impl Inventory {
    /// Connects to the driver (bounded wait, Probe until ready), learns its name and
    /// capabilities, and refuses a driver that cannot list its volumes.
    /// The CSI calls are recorded in `metrics` (`csi_sidecar_operations_seconds` when served).
    pub async fn connect(
        target: &Target,
        client: Client,
        metrics: CsiOperationMetrics,
    ) -> Result<Self, InventoryError> {
        let endpoint = target.csi.endpoint()?;
        let csi = conn::connect(&endpoint, conn::DEFAULT_CONNECT_WAIT, metrics).await?;
        Self::with_connection(target, csi, client).await
    }

    /// [`Inventory::connect`] over an established connection.
    pub async fn with_connection(
        target: &Target,
        csi: CsiConnection,
        client: Client,
    ) -> Result<Self, InventoryError> {
        csi.probe_until_ready(target.csi.timeout).await?;
        let services = Services::CONTROLLER;
        let driver = DriverInfo::discover(&csi, target.csi.timeout, services).await?;
        if !driver.has_controller(ControllerCapability::ListVolumes) {
            return Err(InventoryError::NoListVolumes(driver.name));
        }
        Ok(Self {
            csi,
            driver,
            client,
            paging: Paging {
                max_entries: target.max_entries,
                timeout: target.csi.timeout,
            },
        })
    }

    /// Every `K` in the cluster (all namespaces).
    async fn list_all<K>(&self, what: &'static str) -> Result<Vec<K>, InventoryError>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let listed = Api::<K>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|source| InventoryError::Kube { what, source })?;
        Ok(listed.items)
    }

    async fn all_pvs(&self) -> Result<Vec<PersistentVolume>, InventoryError> {
        self.list_all("PersistentVolumes").await
    }

    fn of_driver(&self, pvs: &[PersistentVolume]) -> Vec<ClusterVolume> {
        pvs.iter()
            .filter_map(|pv| cluster_volume(pv, &self.driver.name))
            .collect()
    }

    async fn pvs(&self) -> Result<Vec<ClusterVolume>, InventoryError> {
        Ok(self.of_driver(&self.all_pvs().await?))
    }

    /// The driver's inline volumes in every pod.
    async fn inline_volumes(&self) -> Result<Vec<InlineVolume>, InventoryError> {
        let pods: Vec<Pod> = self.list_all("Pods").await?;
        Ok(pods
            .iter()
            .flat_map(|pod| inline_volumes(pod, &self.driver.name))
            .collect())
    }

    /// The driver's contents; `None` when the snapshot API is not served.
    async fn contents(
        &self,
    ) -> Result<Option<Vec<crate::report::ClusterSnapshot>>, InventoryError> {
        match Api::<VolumeSnapshotContent>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(listed) => Ok(Some(
                listed
                    .items
                    .iter()
                    .filter_map(|c| cluster_snapshot(c, &self.driver.name))
                    .collect(),
            )),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => Err(InventoryError::Kube {
                what: "VolumeSnapshotContents",
                source,
            }),
        }
    }

    /// The driver's volumes, each with its condition from the health API the driver serves:
    /// CSI v1.13's ControllerListVolumeHealth (or ControllerGetVolumeHealth per volume), else
    /// the VolumeCondition of v1.0-v1.12 in ListVolumes; no condition when it serves neither.
    async fn storage_volumes(
        &self,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<Vec<crate::report::StorageVolume>, InventoryError> {
        let list_health = self
            .driver
            .has_controller(ControllerCapability::ListVolumeHealth);
        let get_health = self
            .driver
            .has_controller(ControllerCapability::GetVolumeHealth);
        if !list_health && !get_health && self.driver.volume_condition.controller {
            let entries = listing::legacy_volumes(&self.csi, self.paging, &mut |pages, entries| {
                progress("ListVolumes", pages, entries)
            })
            .await?;
            return Ok(entries.iter().filter_map(legacy_storage_volume).collect());
        }
        let entries = listing::volumes(&self.csi, self.paging, &mut |pages, entries| {
            progress("ListVolumes", pages, entries)
        })
        .await?;
        let health: BTreeMap<String, Vec<VolumeHealthEntry>> = if list_health {
            listing::volume_health(&self.csi, self.paging, &mut |pages, entries| {
                progress("ControllerListVolumeHealth", pages, entries)
            })
            .await?
            .into_iter()
            .map(|h| (h.volume_id, h.health_statuses))
            .collect()
        } else if get_health {
            self.each_volume_health(&entries).await?
        } else {
            BTreeMap::new()
        };
        let serves_health = list_health || get_health;
        Ok(entries
            .iter()
            .filter_map(|entry| {
                let id = &entry.volume.as_ref()?.volume_id;
                // ControllerListVolumeHealth omits healthy volumes.
                let condition = serves_health
                    .then(|| health_condition(health.get(id).map_or(&[][..], Vec::as_slice)));
                storage_volume(entry, condition)
            })
            .collect())
    }

    /// ControllerGetVolumeHealth of every listed volume (drivers without the list RPC). A
    /// volume deleted since it was listed is skipped.
    async fn each_volume_health(
        &self,
        entries: &[csi::list_volumes_response::Entry],
    ) -> Result<BTreeMap<String, Vec<VolumeHealthEntry>>, InventoryError> {
        let mut health = BTreeMap::new();
        for volume in entries.iter().filter_map(|e| e.volume.as_ref()) {
            let request = csi::ControllerGetVolumeHealthRequest {
                volume_id: volume.volume_id.clone(),
                ..Default::default()
            };
            match self
                .csi
                .controller_get_volume_health(request, self.paging.timeout)
                .await
            {
                Ok(response) => {
                    let statuses = response
                        .volume_health
                        .map(|h| h.health_statuses)
                        .unwrap_or_default();
                    health.insert(volume.volume_id.clone(), statuses);
                }
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    return Err(ListError::Rpc {
                        rpc: "ControllerGetVolumeHealth",
                        code: status.code(),
                        message: status.message().to_string(),
                    }
                    .into());
                }
            }
        }
        Ok(health)
    }

    /// One scan: the cluster, the storage, the cluster again (see [`crate::report`]).
    pub async fn scan(
        &self,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<Report, InventoryError> {
        let snapshots = self
            .driver
            .has_controller(ControllerCapability::ListSnapshots);
        let pvs_before = self.pvs().await?;
        let inline_before = self.inline_volumes().await?;
        let contents_before = if snapshots {
            self.contents().await?
        } else {
            None
        };
        let volumes = self.storage_volumes(progress).await?;
        let snapshot_inputs = match contents_before {
            Some(contents_before) => {
                let listed = listing::snapshots(&self.csi, self.paging, &mut |pages, entries| {
                    progress("ListSnapshots", pages, entries)
                })
                .await?;
                Some(SnapshotInputs {
                    snapshots: listed.iter().filter_map(storage_snapshot).collect(),
                    contents_before,
                    contents_after: self.contents().await?.unwrap_or_default(),
                })
            }
            None => None,
        };
        let pvs_after = self.pvs().await?;
        let inline_after = self.inline_volumes().await?;
        Ok(compare(
            &self.driver.name,
            &Inputs {
                volumes,
                pvs_before,
                pvs_after,
                inline_before,
                inline_after,
                snapshots: snapshot_inputs,
            },
        ))
    }

    /// `import`: one volume, or every orphan. Prints what it created (or, with --dry-run,
    /// would create) to `out`; refusals of single orphans are printed and counted.
    pub async fn import(
        &self,
        args: &ImportArgs,
        out: &mut dyn Write,
    ) -> Result<(), InventoryError> {
        let class_name = &args.storage_class;
        let class = Api::<StorageClass>::all(self.client.clone())
            .get(class_name)
            .await
            .map_err(|source| InventoryError::Class {
                name: class_name.clone(),
                source,
            })?;
        let all_pvs = self.all_pvs().await?;
        let mut taken: BTreeSet<String> = all_pvs.iter().map(|pv| pv.name_any()).collect();
        let pvs = self.of_driver(&all_pvs);
        let volumes = self.storage_volumes(&mut |_, _, _| {}).await?;
        let capacity_bytes = args
            .capacity
            .as_deref()
            .and_then(|c| csi_kinds::quantity::bytes(c).ok());
        let base = ImportSpec {
            pv_name: "",
            driver: &self.driver.name,
            class: &class,
            claim: args.claim.as_deref(),
            reclaim_policy: &args.reclaim,
            access_modes: &args.access_modes,
            volume_mode: &args.volume_mode,
            capacity_bytes,
            topology: self.driver.plugin.volume_accessibility_constraints,
        };
        let Some(volume_id) = &args.volume_id else {
            let known: BTreeSet<&str> = pvs.iter().map(|pv| pv.handle.as_str()).collect();
            // Inline volumes belong to pods (or are left behind by one): not orphans to import.
            let (inline, orphans): (Vec<_>, Vec<_>) = volumes
                .iter()
                .filter(|v| !known.contains(v.id.as_str()))
                .partition(|v| is_inline_handle(&v.id));
            for volume in inline {
                writeln!(out, "skipped: {}", Refusal::Ephemeral(volume.id.clone()))?;
            }
            let mut failed = 0;
            for orphan in &orphans {
                let name = orphan_pv_name(orphan, &taken);
                let made = match persistent_volume(
                    orphan,
                    &pvs,
                    &taken,
                    &ImportSpec {
                        pv_name: &name,
                        ..base.clone()
                    },
                ) {
                    Ok(pv) => self.create_or_print(pv, args.dry_run, out).await,
                    Err(refusal) => Err(refusal.into()),
                };
                if let Err(error) = made {
                    failed += 1;
                    writeln!(out, "volume {}: not imported: {error}", orphan.id)?;
                }
                taken.insert(name);
            }
            if orphans.is_empty() {
                writeln!(out, "no orphaned volumes")?;
            }
            return match failed {
                0 => Ok(()),
                failed => Err(InventoryError::Partly {
                    failed,
                    total: orphans.len(),
                }),
            };
        };
        let volume = volumes
            .iter()
            .find(|v| &v.id == volume_id)
            .ok_or_else(|| Refusal::NotListed(volume_id.clone()))?;
        let name = args.name.as_deref().unwrap_or_default();
        let pv = persistent_volume(
            volume,
            &pvs,
            &taken,
            &ImportSpec {
                pv_name: name,
                ..base
            },
        )?;
        self.create_or_print(pv, args.dry_run, out).await
    }

    async fn create_or_print(
        &self,
        pv: serde_json::Value,
        dry_run: bool,
        out: &mut dyn Write,
    ) -> Result<(), InventoryError> {
        if dry_run {
            let yaml = serde_norway::to_string(&pv).expect("a PV serialises");
            write!(out, "---\n{yaml}")?;
            return Ok(());
        }
        let pv: PersistentVolume = serde_json::from_value(pv).expect("the import builds a PV");
        let name = pv.name_any();
        Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &pv)
            .await
            .map_err(|source| InventoryError::Create {
                name: name.clone(),
                source,
            })?;
        writeln!(out, "persistentvolume/{name} created")?;
        Ok(())
    }
}

/// Progress of long listings, on stderr.
pub fn progress_on_stderr(rpc: &str, pages: usize, entries: usize) {
    eprintln!("{rpc}: {entries} entries in {pages} pages so far");
}

/// `report` without `--serve`: the report on `out`; `Ok(true)` when clean.
pub async fn report(
    inventory: &Inventory,
    args: &ReportArgs,
    out: &mut dyn Write,
) -> Result<Report, InventoryError> {
    let report = inventory.scan(&mut progress_on_stderr).await?;
    let text = match args.output {
        Output::Table => crate::render::text(&report),
        Output::Json => crate::render::json(&report),
    };
    out.write_all(text.as_bytes())?;
    Ok(report)
}

/// `report --serve`: a scan every `--scan-interval`, its findings as gauges on
/// `--http-endpoint`, until `shutdown`. A failed scan is logged and counted; the gauges keep
/// the last complete scan's values (its time says how old they are).
pub async fn serve(args: &ReportArgs, shutdown: CancellationToken) -> Result<(), InventoryError> {
    let mut registry = Registry::default();
    let calls = CsiOperationMetrics::register(&mut registry);
    let metrics = InventoryMetrics::register(&mut registry);
    let inventory = connect(&args.target, calls).await?;
    inventory.csi.exit_on_loss();
    csi_grpc::http::start(&args.http, Arc::new(registry), Vec::new(), shutdown.clone()).await?;
    loop {
        match inventory.scan(&mut |_, _, _| {}).await {
            Ok(report) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                metrics.record(&report, i64::try_from(now.as_secs()).unwrap_or(i64::MAX));
                for finding in &report.findings {
                    log_finding(finding);
                }
                tracing::info!(
                    volumes = report.volumes_on_storage,
                    persistent_volumes = report.persistent_volumes,
                    findings = report.findings.len(),
                    "scan complete"
                );
            }
            Err(error) => {
                metrics.scan_errors.inc();
                tracing::error!(%error, "scan failed");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(args.scan_interval) => {}
        }
    }
}

fn log_finding(finding: &Finding) {
    match finding {
        Finding::Orphaned { volume, claim } => {
            tracing::warn!(volume = %volume.id, claim = ?claim, "orphaned volume: no PersistentVolume")
        }
        Finding::OrphanedEphemeral { volume } => {
            tracing::warn!(volume = %volume.id, nodes = ?volume.published_nodes, "orphaned ephemeral inline volume: no pod has it")
        }
        Finding::Missing { pv, volume_id, .. } => {
            tracing::warn!(%pv, volume = %volume_id, "missing volume: the driver does not list it")
        }
        other => tracing::warn!(finding = ?other, "inventory finding"),
    }
}

/// Connects for `target`: the kube client from its flags, then the driver.
pub async fn connect(
    target: &Target,
    metrics: CsiOperationMetrics,
) -> Result<Inventory, InventoryError> {
    let client = csi_sidecar::kube::client(&target.kube).await?;
    Inventory::connect(target, client, metrics).await
}
