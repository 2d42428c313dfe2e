//! The monitor: each pass reads the health of every bound volume of the driver from whichever
//! API the driver serves ([`Source`], read again from its capabilities every pass), decides each
//! claim's step ([`health::decide`]) and records its Event.
//!
//! Passes run every `--list-volumes-interval` when the driver lists health, else every
//! `--monitor-interval`, each volume then asked on its own, `--worker-threads` at a time.
//! Upstream's per-volume mode checks one volume per worker per interval (ten a minute by
//! default, whatever the number of volumes); here every volume is checked each interval. The
//! volumes come from the PV cache: Bound PVs of the driver, each with its claim.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use csi_grpc::conn::{CsiConnection, controller_capabilities, controller_volume_condition};
use csi_grpc::listing::{self, ListError, Paging};
use csi_kinds::cached::CachedVolume;
use csi_proto::csi::v1 as csi;
use csi_proto::csi::v1_12;
use csi_sidecar::events::{EventRecorder, EventType};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::health::{self, Check, Health, HealthStatus, Known, RecordedEvent, Step};

type ControllerCapability = csi::controller_service_capability::rpc::Type;

/// Where this driver's volume health comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// CSI v1.13 LIST_VOLUME_HEALTH: ControllerListVolumeHealth, paged; it lists abnormal
    /// volumes only.
    ListHealth,
    /// CSI v1.13 GET_VOLUME_HEALTH: ControllerGetVolumeHealth for each volume.
    GetHealth,
    /// CSI v1.12 VOLUME_CONDITION with LIST_VOLUMES: the conditions in ListVolumes, paged.
    ListConditions,
    /// CSI v1.12 VOLUME_CONDITION with GET_VOLUME: ControllerGetVolume's condition per volume.
    GetConditions,
}

impl Source {
    /// The newest generation the driver serves, a list before per-volume calls (as upstream
    /// prefers ListVolumes); `None` when it reports volume health in neither.
    pub fn of(controller: &BTreeSet<ControllerCapability>, volume_condition: bool) -> Option<Self> {
        let has = |capability| controller.contains(&capability);
        if has(ControllerCapability::ListVolumeHealth) {
            Some(Self::ListHealth)
        } else if has(ControllerCapability::GetVolumeHealth) {
            Some(Self::GetHealth)
        } else if volume_condition && has(ControllerCapability::ListVolumes) {
            Some(Self::ListConditions)
        } else if volume_condition && has(ControllerCapability::GetVolume) {
            Some(Self::GetConditions)
        } else {
            None
        }
    }

    fn lists(self) -> bool {
        matches!(self, Self::ListHealth | Self::ListConditions)
    }
}

/// A Bound PV of the driver: its volume handle and its claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Monitored {
    pub handle: String,
    pub claim: ObjectReference,
}

impl Monitored {
    fn claim_uid(&self) -> &str {
        self.claim.uid.as_deref().unwrap_or_default()
    }
}

/// The Bound PVs of `driver` with a claim, in handle order.
pub fn monitored<'a>(
    pvs: impl IntoIterator<Item = &'a CachedVolume>,
    driver: &str,
) -> Vec<Monitored> {
    let mut volumes: Vec<Monitored> = pvs
        .into_iter()
        .filter(|pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .filter_map(|pv| {
            let spec = pv.spec.as_ref()?;
            let csi = spec.csi.as_ref().filter(|csi| csi.driver == driver)?;
            let claim = spec.claim_ref.as_ref().filter(|c| c.uid.is_some())?;
            Some(Monitored {
                handle: csi.volume_handle.clone(),
                claim: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    uid: claim.uid.clone(),
                    ..ObjectReference::default()
                },
            })
        })
        .collect();
    volumes.sort_by(|a, b| a.handle.cmp(&b.handle));
    volumes
}

/// The monitor's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    /// Each CSI call's deadline (a page of a list is one call).
    pub timeout: Duration,
    pub list_interval: Duration,
    pub monitor_interval: Duration,
    /// Volumes asked at once when each is asked on its own.
    pub workers: usize,
}

/// The Events' `source.component`, upstream's.
pub fn component(driver: &str) -> String {
    format!("csi-pv-monitor-controller-{driver}")
}

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(
        "the CSI driver reports volume health in neither generation: it advertises none of CSI v1.13's LIST_VOLUME_HEALTH and GET_VOLUME_HEALTH, nor v1.12's VOLUME_CONDITION with LIST_VOLUMES or GET_VOLUME"
    )]
    NoVolumeHealth,
    #[error("ControllerGetCapabilities: {0}")]
    Capabilities(Status),
    #[error("listing this monitor's Events: {0}")]
    Events(#[from] kube::Error),
}

/// The monitor of one driver: the claims' last known health, the PV cache, the driver.
#[derive(Debug)]
pub struct Monitor {
    csi: CsiConnection,
    pvs: Store<CachedVolume>,
    events: Arc<EventRecorder>,
    settings: Settings,
    known: HashMap<String, Known>,
    source: Option<Source>,
}

impl Monitor {
    /// The monitor, knowing what it last recorded on each claim from its own Events (so a
    /// restart neither repeats a condition nor misses a recovery).
    pub async fn new(
        client: &Client,
        csi: CsiConnection,
        pvs: Store<CachedVolume>,
        events: Arc<EventRecorder>,
        settings: Settings,
    ) -> Result<Self, MonitorError> {
        let component = component(&settings.driver_name);
        let params = ListParams::default().fields(&format!(
            "source={component},involvedObject.kind=PersistentVolumeClaim"
        ));
        let recorded: Vec<Event> = Api::all(client.clone()).list(&params).await?.items;
        let known = health::last_recorded(recorded.into_iter().filter_map(|event| {
            let last_seen = event
                .last_timestamp
                .map(|t| t.0.as_second())
                .or_else(|| event.event_time.map(|t| t.0.as_second()))?;
            Some(RecordedEvent {
                claim_uid: event.involved_object.uid?,
                reason: event.reason?,
                message: event.message.unwrap_or_default(),
                last_seen,
            })
        }));
        Ok(Self {
            csi,
            pvs,
            events,
            settings,
            known,
            source: None,
        })
    }

    /// Runs passes until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), MonitorError> {
        loop {
            let source = self.pass().await?;
            let interval = if source.lists() {
                self.settings.list_interval
            } else {
                self.settings.monitor_interval
            };
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.events.flush().await;
                    return Ok(());
                }
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One pass over every monitored volume; the source it read.
    pub async fn pass(&mut self) -> Result<Source, MonitorError> {
        let source = self.source().await?;
        let volumes = monitored(
            self.pvs.state().iter().map(Arc::as_ref),
            &self.settings.driver_name,
        );
        let checks = match self.checks(source, &volumes).await {
            Ok(checks) => checks,
            Err(error) => {
                tracing::error!(?source, %error, "checking the volumes' health failed; trying again next pass");
                return Ok(source);
            }
        };
        for volume in &volumes {
            let Some(check) = checks.get(&volume.handle) else {
                continue;
            };
            let mut step = health::decide(self.known.get(volume.claim_uid()), check);
            if step == Step::Confirm {
                match self.get(source, &volume.handle).await {
                    Ok(check) => step = health::decide(self.known.get(volume.claim_uid()), &check),
                    Err(status) => {
                        tracing::warn!(volume = %volume.handle, code = ?status.code(), message = status.message(), "confirming a volume's health failed");
                        continue;
                    }
                }
            }
            self.apply(volume, step).await;
        }
        let present: BTreeSet<&str> = volumes.iter().map(Monitored::claim_uid).collect();
        self.known.retain(|uid, _| present.contains(uid.as_str()));
        Ok(source)
    }

    /// The source for this pass, from the driver's capabilities now (a driver upgraded to
    /// another generation is followed). A failed ControllerGetCapabilities keeps the last
    /// source: a slow driver does not end the monitor.
    async fn source(&mut self) -> Result<Source, MonitorError> {
        let response = match self
            .csi
            .controller_get_capabilities(
                csi::ControllerGetCapabilitiesRequest::default(),
                self.settings.timeout,
            )
            .await
        {
            Ok(response) => response,
            Err(status) => match self.source {
                Some(source) => {
                    tracing::warn!(code = ?status.code(), message = status.message(), ?source, "ControllerGetCapabilities failed; reading volume health as before");
                    return Ok(source);
                }
                None => return Err(MonitorError::Capabilities(status)),
            },
        };
        let source = Source::of(
            &controller_capabilities(&response),
            controller_volume_condition(&response),
        )
        .ok_or(MonitorError::NoVolumeHealth)?;
        if self.source != Some(source) {
            tracing::info!(?source, driver = %self.settings.driver_name, "reading volume health");
            self.source = Some(source);
        }
        Ok(source)
    }

    async fn apply(&mut self, volume: &Monitored, step: Step) {
        let Step::Record { known, event } = step else {
            return;
        };
        if known == Known::Missing {
            tracing::warn!(volume = %volume.handle, claim = ?volume.claim.name, namespace = ?volume.claim.namespace, "the CSI driver does not know the volume of this bound claim");
        }
        if let Some(event) = event {
            let event_type = if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.events
                .publish(&volume.claim, event_type, event.reason, &event.message)
                .await;
        }
        self.known.insert(volume.claim_uid().to_string(), known);
    }

    /// Each volume's check: from one paged list, or from one call per volume (`workers` at a
    /// time; a volume whose call fails is left out of this pass).
    async fn checks(
        &self,
        source: Source,
        volumes: &[Monitored],
    ) -> Result<HashMap<String, Check>, ListError> {
        if source.lists() {
            let listed = self.list(source).await?;
            let absent = if source == Source::ListHealth {
                Check::NotListed
            } else {
                Check::NotFound
            };
            return Ok(volumes
                .iter()
                .map(|v| {
                    let check = listed
                        .get(&v.handle)
                        .map_or_else(|| absent.clone(), |health| Check::Reported(health.clone()));
                    (v.handle.clone(), check)
                })
                .collect());
        }
        let handles: Vec<String> = volumes.iter().map(|v| v.handle.clone()).collect();
        let results: Vec<(String, Result<Check, Status>)> = futures::stream::iter(handles)
            .map(|handle| async move {
                let check = self.get(source, &handle).await;
                (handle, check)
            })
            .buffer_unordered(self.settings.workers.max(1))
            .collect()
            .await;
        let mut checks = HashMap::new();
        for (handle, result) in results {
            match result {
                Ok(check) => {
                    checks.insert(handle, check);
                }
                Err(status) => {
                    tracing::warn!(volume = %handle, code = ?status.code(), message = status.message(), "checking a volume's health failed");
                }
            }
        }
        Ok(checks)
    }

    /// One volume's check, asked on its own; NOT_FOUND says the driver does not know it.
    async fn get(&self, source: Source, handle: &str) -> Result<Check, Status> {
        let timeout = self.settings.timeout;
        let reported = match source {
            Source::ListHealth | Source::GetHealth => {
                let request = csi::ControllerGetVolumeHealthRequest {
                    volume_id: handle.to_string(),
                    ..Default::default()
                };
                self.csi
                    .controller_get_volume_health(request, timeout)
                    .await
                    .map(|r| health_of(r.volume_health.as_ref()))
            }
            Source::ListConditions | Source::GetConditions => {
                let request = v1_12::ControllerGetVolumeRequest {
                    volume_id: handle.to_string(),
                };
                self.csi
                    .legacy_controller_get_volume(request, timeout)
                    .await
                    .map(|r| condition_of(r.status.and_then(|s| s.volume_condition)))
            }
        };
        match reported {
            Ok(health) => Ok(Check::Reported(health)),
            Err(status) if status.code() == Code::NotFound => Ok(Check::NotFound),
            Err(status) => Err(status),
        }
    }

    /// Every listed volume's health, by handle, from all pages.
    async fn list(&self, source: Source) -> Result<HashMap<String, Health>, ListError> {
        let paging = Paging {
            max_entries: 0,
            timeout: self.settings.timeout,
        };
        let quiet = |_, _| {};
        if source == Source::ListHealth {
            let listed = listing::volume_health(&self.csi, paging, quiet).await?;
            return Ok(listed
                .iter()
                .map(|h| (h.volume_id.clone(), health_of(Some(h))))
                .collect());
        }
        let listed = listing::legacy_volumes(&self.csi, paging, quiet).await?;
        Ok(listed
            .into_iter()
            .filter_map(|entry| {
                let condition = entry.status.and_then(|s| s.volume_condition);
                Some((entry.volume?.volume_id, condition_of(condition)))
            })
            .collect())
    }
}

/// A v1.13 `VolumeHealth` as [`Health`] (none: healthy).
fn health_of(health: Option<&csi::VolumeHealth>) -> Health {
    let statuses: Vec<HealthStatus> = health
        .map(|h| h.health_statuses.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|entry| HealthStatus {
            status: entry.status,
            reason: entry.reason.clone(),
            message: entry.message.clone(),
        })
        .collect();
    health::describe(&statuses)
}

/// A v1.12 `VolumeCondition` as [`Health`] (none: normal, as upstream reads it).
fn condition_of(condition: Option<v1_12::VolumeCondition>) -> Health {
    match condition {
        Some(c) if c.abnormal => Health::Abnormal(c.message),
        _ => Health::Normal,
    }
}

#[cfg(test)]
mod tests;
