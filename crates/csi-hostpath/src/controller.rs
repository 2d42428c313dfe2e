//! The CSI Controller service.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi::controller_server::Controller;
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::volume_content_source::Type as SourceType;
use csi_grpc::conn::LEGACY_CONTROLLER_VOLUME_CONDITION;
use csi_proto::csi::v1 as csi;

use crate::data;
use crate::driver::{Driver, ready_volume, ready_volume_mut, to_btree};
use crate::error::DriverError;
use crate::mounts;
use crate::rules::{self, required};
use crate::state::{ContentSource, Layout, Phase, Publication, Snapshot, State, Volume, now_nanos};

/// Size of a volume whose request gives no capacity.
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;

/// The smallest ext4 volume: room for the journal and the metadata of a useful filesystem.
pub const MIN_EXT4_VOLUME_SIZE: u64 = 16 << 20;

/// The Controller service over a shared [`Driver`].
#[derive(Debug, Clone)]
pub struct ControllerService {
    driver: Arc<Driver>,
}

impl ControllerService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

/// The size a capacity range asks for: the required bytes, else the default capped by the
/// limit. `OUT_OF_RANGE` when the range is contradictory or beyond the largest volume.
pub fn requested_size(
    range: Option<&csi::CapacityRange>,
    max: u64,
) -> Result<(u64, u64), DriverError> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(DriverError::Negative {
            field: "capacity_range bytes",
        });
    }
    let (required, limit) = (required.unsigned_abs(), limit.unsigned_abs());
    if limit > 0 && required > limit {
        return Err(DriverError::RequiredAboveLimit { required, limit });
    }
    let size = match (required, limit) {
        (0, 0) => DEFAULT_VOLUME_SIZE,
        (0, limit) => DEFAULT_VOLUME_SIZE.min(limit),
        (required, _) => required,
    };
    if size > max {
        return Err(DriverError::AboveMaximumSize { size, max });
    }
    Ok((size, limit))
}

/// The size ControllerExpandVolume grows a volume of `current` bytes to: at least
/// `required_bytes`, and never less than it is (volumes do not shrink). A range that sets
/// neither field asks for nothing: the CSI spec requires one of them, so it is refused rather
/// than read as a new volume's default size.
pub fn expanded_size(
    range: &csi::CapacityRange,
    current: u64,
    max: u64,
) -> Result<u64, DriverError> {
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 {
        return Err(DriverError::Negative {
            field: "capacity_range bytes",
        });
    }
    if required == 0 && limit == 0 {
        return Err(DriverError::EmptyCapacityRange);
    }
    let (required, limit) = (required.unsigned_abs(), limit.unsigned_abs());
    if limit > 0 && required > limit {
        return Err(DriverError::RequiredAboveLimit { required, limit });
    }
    if required > max {
        return Err(DriverError::AboveMaximumSize {
            size: required,
            max,
        });
    }
    if limit > 0 && current > limit {
        return Err(DriverError::LimitBelowSize { current, limit });
    }
    Ok(required.max(current))
}

impl Driver {
    /// Bytes per node available in pool `kind` (None: unlimited pools).
    fn pool_capacity(&self, kind: &str) -> Result<Option<u64>, DriverError> {
        if self.config.capacity.is_empty() {
            return Ok(None);
        }
        self.config
            .capacity
            .get(kind)
            .copied()
            .map(Some)
            .ok_or_else(|| DriverError::UnknownCapacityPool {
                kind: kind.to_string(),
            })
    }

    fn available_bytes(&self, state: &State, node: &str, kind: &str) -> Result<u64, DriverError> {
        match self.pool_capacity(kind)? {
            Some(capacity) => Ok(capacity.saturating_sub(state.used_bytes(node, kind))),
            None => {
                let stats = rustix::fs::statvfs(self.store.dir())
                    .map_err(|e| DriverError::io("statvfs of the state directory", e.into()))?;
                Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
            }
        }
    }

    /// Picks the home node of a new volume from the topology requirement (preferred first)
    /// and the nodes it is accessible from.
    pub(crate) fn place(
        &self,
        state: &State,
        requirement: Option<&csi::TopologyRequirement>,
        kind: &str,
        size: u64,
    ) -> Result<(String, Vec<String>), DriverError> {
        let key = self.config.topology_key();
        let Some(requirement) =
            requirement.filter(|r| !r.requisite.is_empty() || !r.preferred.is_empty())
        else {
            let node = self.config.node_id.clone();
            if self.available_bytes(state, &node, kind)? < size {
                return Err(DriverError::NoCapacityOnNode { node, size });
            }
            return Ok((node, Vec::new()));
        };
        let mut candidates: Vec<String> = Vec::new();
        for topology in requirement.preferred.iter().chain(&requirement.requisite) {
            let only_ours = topology.segments.keys().all(|k| *k == key);
            if let (true, Some(node)) = (only_ours, topology.segments.get(&key))
                && !candidates.contains(node)
                && self.is_known_node(node)
            {
                candidates.push(node.clone());
            }
        }
        if candidates.is_empty() {
            return Err(DriverError::NoServedNode { key });
        }
        let mut home = None;
        for node in &candidates {
            if self.available_bytes(state, node, kind)? >= size {
                home = Some(node.clone());
                break;
            }
        }
        let Some(home) = home else {
            return Err(DriverError::NoCapacityOnAnyNode {
                size,
                nodes: candidates,
            });
        };
        candidates.retain(|n| *n != home);
        candidates.insert(0, home.clone());
        Ok((home, candidates))
    }

    fn create_volume(
        &self,
        request: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, DriverError> {
        let name = required(&request.name, "name")?;
        rules::bounded_map(&request.parameters, "parameters")?;
        rules::bounded_map(&request.mutable_parameters, "mutable_parameters")?;
        let access_type = rules::capabilities(&request.volume_capabilities)?;
        let filesystem = rules::filesystem(&request.volume_capabilities)?;
        let layout = Layout::of(access_type, filesystem);
        let (mut size, limit) =
            requested_size(request.capacity_range.as_ref(), self.config.max_volume_size)?;
        if layout == Layout::Ext4Image && size < MIN_EXT4_VOLUME_SIZE {
            if limit > 0 && limit < MIN_EXT4_VOLUME_SIZE {
                return Err(DriverError::LimitBelowExt4Minimum {
                    min: MIN_EXT4_VOLUME_SIZE,
                    limit,
                });
            }
            size = MIN_EXT4_VOLUME_SIZE;
        }
        self.check_mutable_names(request.mutable_parameters.keys())?;
        let source = match request
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(SourceType::Snapshot(s)) => Some(ContentSource::Snapshot(
                required(&s.snapshot_id, "snapshot_id")?.to_string(),
            )),
            Some(SourceType::Volume(v)) => Some(ContentSource::Volume(
                required(&v.volume_id, "volume_id")?.to_string(),
            )),
        };
        let kind = request.parameters.get("kind").cloned().unwrap_or_default();
        // The source is locked too, so it cannot be deleted while it is being copied.
        let name_key = format!("name/{name}");
        let mut keys = vec![name_key.as_str()];
        if let Some(ContentSource::Snapshot(id) | ContentSource::Volume(id)) = &source {
            keys.push(id);
        }
        let _guard = self.locks.acquire(&keys)?;

        let volume = self.store.update(|state| {
            if let Some(existing) = state.volume_by_name_mut(name) {
                if existing.ephemeral.is_some() {
                    return Err(DriverError::ExistsWithOtherParameters {
                        kind: "volume",
                        name: name.to_string(),
                        how: "as an ephemeral inline volume",
                    });
                }
                let fits = existing.capacity_bytes >= size
                    && (limit == 0 || existing.capacity_bytes <= limit);
                if existing.layout() != layout || !fits || existing.source != source {
                    return Err(DriverError::ExistsWithOtherParameters {
                        kind: "volume",
                        name: name.to_string(),
                        how: "with different capacity, access type or source",
                    });
                }
                match existing.phase {
                    Phase::Deleting => {
                        return Err(DriverError::BeingDeleted {
                            name: name.to_string(),
                        });
                    }
                    Phase::Creating => {
                        self.claim_creation(&mut existing.creator, "volume", name)?;
                    }
                    Phase::Ready => {}
                }
                return Ok(existing.clone());
            }
            if let Some(source) = &source {
                // Access type and size of a ready source.
                let kind = source.kind();
                let (id, found) = match source {
                    ContentSource::Snapshot(id) => (
                        id,
                        state
                            .snapshots
                            .get(id)
                            .filter(|s| s.phase == Phase::Ready)
                            .map(|s| (s.layout(), s.size_bytes)),
                    ),
                    ContentSource::Volume(id) => (
                        id,
                        state
                            .volumes
                            .get(id)
                            .filter(|v| v.phase == Phase::Ready)
                            .map(|v| (v.layout(), v.capacity_bytes)),
                    ),
                };
                let Some((source_layout, source_bytes)) = found else {
                    return Err(DriverError::SourceNotFound {
                        kind,
                        id: id.clone(),
                    });
                };
                if source_layout != layout {
                    return Err(DriverError::SourceLayoutMismatch { kind });
                }
                if source_bytes > size {
                    return Err(DriverError::SmallerThanSource { kind, source_bytes });
                }
            }
            let (home_node, accessible_nodes) = self.place(
                state,
                request.accessibility_requirements.as_ref(),
                &kind,
                size,
            )?;
            let volume = Volume {
                id: rules::new_id(),
                name: name.to_string(),
                capacity_bytes: size,
                access_type,
                filesystem,
                phase: Phase::Creating,
                home_node,
                kind: kind.clone(),
                accessible_nodes,
                parameters: to_btree(request.parameters.clone()),
                mutable_parameters: to_btree(request.mutable_parameters.clone()),
                source: source.clone(),
                published: BTreeMap::new(),
                nodes: BTreeMap::new(),
                fenced: BTreeMap::new(),
                exports: BTreeMap::new(),
                creator: Some(self.instance.id.clone()),
                ephemeral: None,
            };
            state.volumes.insert(volume.id.clone(), volume.clone());
            Ok(volume)
        })?;

        if volume.phase == Phase::Creating {
            let path = self.store.volume_data(&volume.id, layout);
            let made = match &volume.source {
                None => data::create_empty(&path, layout, volume.capacity_bytes),
                Some(ContentSource::Snapshot(id)) => data::restore(
                    &self.store.snapshot_data(id, layout),
                    &path,
                    layout,
                    volume.capacity_bytes,
                ),
                Some(ContentSource::Volume(id)) => {
                    self.flush_exports(id);
                    data::clone_volume(
                        &self.store.volume_data(id, layout),
                        &path,
                        layout,
                        volume.capacity_bytes,
                    )
                }
            };
            if let Err(error) = made {
                self.roll_back_volume(&volume.id, layout);
                return Err(match (&volume.source, error.kind()) {
                    (Some(source), std::io::ErrorKind::QuotaExceeded) => {
                        DriverError::SourceDataAboveCapacity {
                            kind: source.kind(),
                            capacity: volume.capacity_bytes,
                        }
                    }
                    _ => DriverError::io(format!("creating data of volume {name}"), error),
                });
            }
            self.store.update(|state| {
                if let Some(v) = state.volumes.get_mut(&volume.id) {
                    v.phase = Phase::Ready;
                }
                Ok::<_, DriverError>(())
            })?;
        }
        Ok(csi::CreateVolumeResponse {
            volume: Some(self.csi_volume(&volume)),
        })
    }

    /// ControllerPublish/Unpublish are only served with `--enable-attach`.
    fn attach_enabled(&self) -> Result<(), DriverError> {
        if self.config.enable_attach {
            Ok(())
        } else {
            Err(DriverError::AttachDisabled)
        }
    }

    fn check_mutable_names<'a>(
        &self,
        names: impl Iterator<Item = &'a String>,
    ) -> Result<(), DriverError> {
        let accepted = &self.config.accepted_mutable_parameters;
        for name in names {
            if !accepted.contains(name) {
                return Err(DriverError::MutableParameterNotAccepted {
                    name: name.clone(),
                    accepted: accepted.iter().cloned().collect(),
                });
            }
        }
        Ok(())
    }

    fn delete_volume(&self, request: &csi::DeleteVolumeRequest) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let _guard = self.locks.acquire(&[id])?;
        let found = self.store.update(|state| {
            let Some(volume) = state.volumes.get_mut(id) else {
                return Ok(None);
            };
            self.not_ephemeral(volume, "DeleteVolume")?;
            let in_use = volume
                .nodes
                .values()
                .any(|u| u.staged.is_some() || !u.targets.is_empty());
            if !volume.published.is_empty() || in_use {
                return Err(DriverError::StillPublished {
                    id: id.to_string(),
                    nodes: volume
                        .published
                        .keys()
                        .chain(volume.nodes.keys())
                        .cloned()
                        .collect(),
                });
            }
            volume.phase = Phase::Deleting;
            Ok(Some(volume.layout()))
        })?;
        match found {
            Some(layout) => self.finish_deleting_volume(id, layout),
            None => Ok(()),
        }
    }

    fn controller_publish(
        &self,
        request: &csi::ControllerPublishVolumeRequest,
    ) -> Result<csi::ControllerPublishVolumeResponse, DriverError> {
        self.attach_enabled()?;
        let id = required(&request.volume_id, "volume_id")?;
        let node = rules::required_within(&request.node_id, "node_id", rules::MAX_NODE_ID)?;
        let (access_type, mode) = rules::required_capability(request.volume_capability.as_ref())?;
        let readonly = request.readonly && self.config.enable_attach;
        let _guard = self.locks.acquire(&[id])?;
        let volume = self.store.update(|state| {
            let max = self.config.max_volumes_per_node;
            let count = state.published_count(node);
            let volume = ready_volume_mut(state, id)?;
            self.not_ephemeral(volume, "ControllerPublishVolume")?;
            if !self.is_known_node(node) {
                return Err(DriverError::not_found("node", node));
            }
            if volume.access_type != access_type {
                return Err(DriverError::AccessTypeMismatch);
            }
            if let Some(existing) = volume.published.get(node) {
                return if existing.readonly == readonly {
                    Ok(volume.clone())
                } else {
                    Err(DriverError::PublishedWithOtherReadonly {
                        id: id.to_string(),
                        node: node.to_string(),
                        readonly: existing.readonly,
                    })
                };
            }
            if rules::single_node(mode)
                && let Some(other) = volume.published.keys().next()
            {
                return Err(DriverError::SingleNodeInUse {
                    id: id.to_string(),
                    node: other.clone(),
                });
            }
            if max > 0 && i64::try_from(count).unwrap_or(i64::MAX) >= max {
                return Err(DriverError::NodeVolumeLimit {
                    node: node.to_string(),
                    max,
                });
            }
            volume
                .published
                .insert(node.to_string(), Publication { readonly });
            Ok(volume.clone())
        })?;
        if volume.layout() == Layout::Ext4Image {
            self.ensure_export(&volume, node)?;
        }
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: [("readonly".to_string(), readonly.to_string())].into(),
        })
    }

    fn controller_unpublish(
        &self,
        request: &csi::ControllerUnpublishVolumeRequest,
    ) -> Result<(), DriverError> {
        self.attach_enabled()?;
        let id = required(&request.volume_id, "volume_id")?;
        if !request.node_id.is_empty() {
            rules::required_within(&request.node_id, "node_id", rules::MAX_NODE_ID)?;
        }
        let _guard = self.locks.acquire(&[id])?;
        let unpublished = |node: &str| request.node_id.is_empty() || node == request.node_id;
        if let Some(volume) = self.store.read()?.volumes.get(id) {
            for node in volume.exports.keys().filter(|node| unpublished(node)) {
                let let_go = volume
                    .nodes
                    .get(node)
                    .is_none_or(|u| u.staged.is_none() && u.targets.is_empty());
                self.end_export(volume, node, let_go)?;
            }
        }
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(id) {
                volume.published.retain(|node, _| !unpublished(node));
            }
            Ok::<_, DriverError>(())
        })
    }

    fn validate(
        &self,
        request: &csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        rules::bounded_map(&request.parameters, "parameters")?;
        rules::bounded_map(&request.mutable_parameters, "mutable_parameters")?;
        let access_type = rules::capabilities(&request.volume_capabilities)?;
        let state = self.store.read()?;
        let volume = ready_volume(&state, id)?;
        if volume.access_type != access_type {
            return Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!("volume {id} is a {:?} volume", volume.access_type),
            });
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context.clone(),
                volume_capabilities: request.volume_capabilities.clone(),
                parameters: request.parameters.clone(),
                mutable_parameters: request.mutable_parameters.clone(),
            }),
            message: String::new(),
        })
    }

    pub(crate) fn list_volumes(
        &self,
        request: &csi::ListVolumesRequest,
    ) -> Result<csi::ListVolumesResponse, DriverError> {
        let max = page_size(request.max_entries)?;
        let start = volume_page_start(&request.starting_token)?;
        let state = self.store.read()?;
        let ready = state.volumes.values().filter(|v| v.phase == Phase::Ready);
        let (page, last) = paginate(ready, |v| &v.id, start.as_deref(), max);
        let next_token = volume_page_token(&last);
        let entries = page
            .into_iter()
            .map(|volume| csi::list_volumes_response::Entry {
                volume: Some(self.csi_volume(volume)),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: volume.published.keys().cloned().collect(),
                }),
            })
            .collect();
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    fn get_capacity(
        &self,
        request: &csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, DriverError> {
        if !request.volume_capabilities.is_empty() {
            rules::capabilities(&request.volume_capabilities)?;
        }
        rules::bounded_map(&request.parameters, "parameters")?;
        let kind = request.parameters.get("kind").cloned().unwrap_or_default();
        let key = self.config.topology_key();
        let node = match &request.accessible_topology {
            None => Some(self.config.node_id.clone()),
            Some(topology) if topology.segments.keys().all(|k| *k == key) => {
                topology.segments.get(&key).cloned()
            }
            Some(_) => None,
        };
        let state = self.store.read()?;
        let available = match node.filter(|n| self.is_known_node(n)) {
            Some(node) => match self.pool_capacity(&kind) {
                Err(_) => 0,
                Ok(_) => self.available_bytes(&state, &node, &kind)?,
            },
            None => 0,
        };
        let maximum = available.min(self.config.max_volume_size);
        Ok(csi::GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            maximum_volume_size: Some(i64::try_from(maximum).unwrap_or(i64::MAX)),
            minimum_volume_size: None,
        })
    }

    fn capabilities(&self) -> csi::ControllerGetCapabilitiesResponse {
        let mut rpcs = [
            Rpc::CreateDeleteVolume,
            Rpc::ListVolumes,
            Rpc::GetCapacity,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::GetSnapshot,
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
            Rpc::ListVolumesPublishedNodes,
            Rpc::GetVolume,
            Rpc::SingleNodeMultiWriter,
            Rpc::ModifyVolume,
        ]
        .map(|rpc| rpc as i32)
        .to_vec();
        if self.config.enable_attach {
            rpcs.extend([
                Rpc::PublishUnpublishVolume as i32,
                Rpc::PublishReadonly as i32,
            ]);
        }
        if self.config.volume_health.rpcs() {
            rpcs.extend([Rpc::GetVolumeHealth as i32, Rpc::ListVolumeHealth as i32]);
        }
        if self.config.volume_health.volume_condition() {
            rpcs.push(LEGACY_CONTROLLER_VOLUME_CONDITION);
        }
        csi::ControllerGetCapabilitiesResponse {
            capabilities: rpcs
                .into_iter()
                .map(|rpc| csi::ControllerServiceCapability {
                    r#type: Some(csi::controller_service_capability::Type::Rpc(
                        csi::controller_service_capability::Rpc { r#type: rpc },
                    )),
                })
                .collect(),
        }
    }

    /// The abnormal volumes, by ID order, paged as ListVolumes pages.
    fn list_volume_health(
        &self,
        request: &csi::ControllerListVolumeHealthRequest,
    ) -> Result<csi::ControllerListVolumeHealthResponse, DriverError> {
        self.health_rpcs_served("ControllerListVolumeHealth")?;
        let max = page_size(request.max_entries)?;
        let start = volume_page_start(&request.starting_token)?;
        let state = self.store.read()?;
        let abnormal = state
            .volumes
            .values()
            .filter(|v| v.phase == Phase::Ready)
            .filter(|v| start.as_deref().is_none_or(|s| v.id.as_str() > s))
            .map(|v| csi::VolumeHealth {
                volume_id: v.id.clone(),
                health_statuses: self.volume_health(v),
            })
            .filter(|health| !health.health_statuses.is_empty());
        // One more than a page tells whether a next page exists, without measuring the rest.
        let mut entries: Vec<csi::VolumeHealth> = if max > 0 {
            abnormal.take(max + 1).collect()
        } else {
            abnormal.collect()
        };
        let next_token = if max > 0 && entries.len() > max {
            entries.truncate(max);
            entries
                .last()
                .map(|e| volume_page_token(&e.volume_id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(csi::ControllerListVolumeHealthResponse {
            entries,
            next_token,
        })
    }

    fn get_volume_health(
        &self,
        request: &csi::ControllerGetVolumeHealthRequest,
    ) -> Result<csi::ControllerGetVolumeHealthResponse, DriverError> {
        self.health_rpcs_served("ControllerGetVolumeHealth")?;
        let id = required(&request.volume_id, "volume_id")?;
        let state = self.store.read()?;
        let volume = ready_volume(&state, id)?;
        Ok(csi::ControllerGetVolumeHealthResponse {
            volume_health: Some(csi::VolumeHealth {
                volume_id: id.to_string(),
                health_statuses: self.volume_health(volume),
            }),
        })
    }

    fn create_snapshot(
        &self,
        request: &csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, DriverError> {
        let name = required(&request.name, "name")?;
        let source = required(&request.source_volume_id, "source_volume_id")?;
        rules::bounded_map(&request.parameters, "parameters")?;
        let _guard = self.locks.acquire(&[&format!("snapshot/{name}"), source])?;
        let snapshot = self.store.update(|state| {
            if let Some(existing) = state.snapshot_by_name_mut(name) {
                if existing.source_volume_id != source {
                    return Err(DriverError::ExistsWithOtherParameters {
                        kind: "snapshot",
                        name: name.to_string(),
                        how: "for another source volume",
                    });
                }
                if existing.phase == Phase::Creating {
                    self.claim_creation(&mut existing.creator, "snapshot", name)?;
                }
                return Ok(existing.clone());
            }
            let volume = state
                .volumes
                .get(source)
                .filter(|v| v.phase == Phase::Ready)
                .ok_or_else(|| DriverError::SourceNotFound {
                    kind: "volume",
                    id: source.to_string(),
                })?;
            let snapshot = Snapshot {
                id: rules::new_id(),
                name: name.to_string(),
                source_volume_id: source.to_string(),
                size_bytes: volume.capacity_bytes,
                access_type: volume.access_type,
                filesystem: volume.filesystem,
                phase: Phase::Creating,
                created_unix_nanos: now_nanos(),
                group_snapshot_id: None,
                creator: Some(self.instance.id.clone()),
            };
            state
                .snapshots
                .insert(snapshot.id.clone(), snapshot.clone());
            Ok(snapshot)
        })?;
        let snapshot = if snapshot.phase == Phase::Creating {
            self.flush_exports(source);
            let layout = snapshot.layout();
            let taken = data::snapshot(
                &self.store.volume_data(source, layout),
                &self.store.snapshot_data(&snapshot.id, layout),
                layout,
            );
            if let Err(error) = taken {
                self.roll_back_snapshots(std::slice::from_ref(&snapshot.id), None);
                return Err(DriverError::io(format!("taking snapshot {name}"), error));
            }
            self.store.update(|state| {
                let s = state.snapshots.get_mut(&snapshot.id).ok_or_else(|| {
                    DriverError::DeletedMeanwhile {
                        kind: "snapshot",
                        name: name.to_string(),
                    }
                })?;
                s.phase = Phase::Ready;
                Ok::<_, DriverError>(s.clone())
            })?
        } else {
            snapshot
        };
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(self.csi_snapshot(&snapshot)),
        })
    }

    fn delete_snapshot(&self, request: &csi::DeleteSnapshotRequest) -> Result<(), DriverError> {
        let id = required(&request.snapshot_id, "snapshot_id")?;
        let _guard = self.locks.acquire(&[id])?;
        let found = self.store.update(|state| {
            let Some(snapshot) = state.snapshots.get_mut(id) else {
                return Ok(false);
            };
            if let Some(group) = &snapshot.group_snapshot_id {
                return Err(DriverError::SnapshotInGroup {
                    id: id.to_string(),
                    group: group.clone(),
                });
            }
            snapshot.phase = Phase::Deleting;
            Ok(true)
        })?;
        if found {
            self.finish_deleting_snapshots(&[id.to_string()], None)?;
        }
        Ok(())
    }

    fn list_snapshots(
        &self,
        request: &csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, DriverError> {
        let max = page_size(request.max_entries)?;
        let start = rules::page_start(&request.starting_token, rules::looks_like_id)?;
        let state = self.store.read()?;
        let matching = state.snapshots.values().filter(|s| {
            s.phase == Phase::Ready
                && (request.snapshot_id.is_empty() || s.id == request.snapshot_id)
                && (request.source_volume_id.is_empty()
                    || s.source_volume_id == request.source_volume_id)
        });
        let (page, next_token) = paginate(matching, |s| &s.id, start.as_deref(), max);
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(self.csi_snapshot(s)),
                })
                .collect(),
            next_token,
        })
    }

    fn get_snapshot(
        &self,
        request: &csi::GetSnapshotRequest,
    ) -> Result<csi::GetSnapshotResponse, DriverError> {
        let id = required(&request.snapshot_id, "snapshot_id")?;
        let state = self.store.read()?;
        let snapshot = state
            .snapshots
            .get(id)
            .filter(|s| s.phase == Phase::Ready)
            .ok_or_else(|| DriverError::not_found("snapshot", id))?;
        Ok(csi::GetSnapshotResponse {
            snapshot: Some(self.csi_snapshot(snapshot)),
        })
    }

    fn expand(
        &self,
        request: &csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let range = request
            .capacity_range
            .as_ref()
            .ok_or(DriverError::Missing {
                field: "capacity_range",
            })?;
        if let Some(capability) = &request.volume_capability {
            rules::capability(capability)?;
        }
        let _guard = self.locks.acquire(&[id])?;
        let (volume, new_size) = self.store.update(|state| {
            let volume = ready_volume(state, id)?.clone();
            let size = expanded_size(range, volume.capacity_bytes, self.config.max_volume_size)?;
            if size > volume.capacity_bytes {
                let growth = size - volume.capacity_bytes;
                if self.available_bytes(state, &volume.home_node, &volume.kind)? < growth {
                    return Err(DriverError::NoCapacityToGrow {
                        node: volume.home_node,
                        id: id.to_string(),
                        size,
                    });
                }
            }
            Ok((volume, size))
        })?;
        let layout = volume.layout();
        data::expand(&self.store.volume_data(id, layout), layout, new_size)
            .map_err(|e| DriverError::io(format!("expanding volume {id}"), e))?;
        for (node, export) in &volume.exports {
            mounts::loop_refresh(&export.device).map_err(|e| {
                DriverError::io(
                    format!("growing the export of volume {id} to node {node}"),
                    e,
                )
            })?;
        }
        self.store.update(|state| {
            if let Some(v) = state.volumes.get_mut(id) {
                v.capacity_bytes = new_size;
            }
            Ok::<_, DriverError>(())
        })?;
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(new_size).unwrap_or(i64::MAX),
            node_expansion_required: layout.is_image(),
        })
    }

    pub(crate) fn get_volume(
        &self,
        request: &csi::ControllerGetVolumeRequest,
    ) -> Result<csi::ControllerGetVolumeResponse, DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        let state = self.store.read()?;
        let volume = ready_volume(&state, id)?;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(self.csi_volume(volume)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: volume.published.keys().cloned().collect(),
            }),
        })
    }

    fn modify(&self, request: &csi::ControllerModifyVolumeRequest) -> Result<(), DriverError> {
        let id = required(&request.volume_id, "volume_id")?;
        rules::bounded_map(&request.mutable_parameters, "mutable_parameters")?;
        self.check_mutable_names(request.mutable_parameters.keys())?;
        let _guard = self.locks.acquire(&[id])?;
        self.store.update(|state| {
            let volume = ready_volume_mut(state, id)?;
            volume
                .mutable_parameters
                .extend(to_btree(request.mutable_parameters.clone()));
            Ok(())
        })
    }
}

/// `max_entries` must not be negative; 0 means no limit.
fn page_size(max_entries: i32) -> Result<usize, DriverError> {
    usize::try_from(max_entries).map_err(|_| DriverError::Negative {
        field: "max_entries",
    })
}

/// Items after `start` (by ID order), at most `max` (0: all), and the next token.
/// Prefix of a volume listing's token after an ephemeral inline volume: its ID alone would be
/// indistinguishable from a malformed token (which is ABORTED), a persistent volume's UUID is not.
const EPHEMERAL_TOKEN_PREFIX: &str = "ephemeral/";

/// The token of a volume listing's next page: the last returned ID (`""`: no next page).
fn volume_page_token(last_id: &str) -> String {
    if last_id.is_empty() || rules::looks_like_id(last_id) {
        last_id.to_string()
    } else {
        format!("{EPHEMERAL_TOKEN_PREFIX}{last_id}")
    }
}

/// Where a volume listing starts: after the ID its token names.
fn volume_page_start(token: &str) -> Result<Option<String>, DriverError> {
    match token.strip_prefix(EPHEMERAL_TOKEN_PREFIX) {
        Some(id) => rules::page_start(id, crate::ephemeral::is_id)?
            .map(Some)
            .ok_or_else(|| DriverError::InvalidStartingToken {
                token: token.to_string(),
            }),
        None => rules::page_start(token, rules::looks_like_id),
    }
}

fn paginate<'a, T>(
    items: impl Iterator<Item = &'a T>,
    id: impl Fn(&T) -> &String,
    start: Option<&str>,
    max: usize,
) -> (Vec<&'a T>, String) {
    let mut after: Vec<&T> = items
        .filter(|item| start.is_none_or(|s| id(item).as_str() > s))
        .collect();
    if max > 0 && after.len() > max {
        after.truncate(max);
        let token = after
            .last()
            .map(|item| id(item).clone())
            .unwrap_or_default();
        return (after, token);
    }
    (after, String::new())
}

crate::driver::blocking_service! {
    ControllerService: Controller {
        create_volume(csi::CreateVolumeRequest) -> csi::CreateVolumeResponse => |d, r| d.create_volume(r);
        delete_volume(csi::DeleteVolumeRequest) -> csi::DeleteVolumeResponse => |d, r| d.delete_volume(&r).map(|()| csi::DeleteVolumeResponse {});
        controller_publish_volume(csi::ControllerPublishVolumeRequest) -> csi::ControllerPublishVolumeResponse => |d, r| d.controller_publish(&r);
        controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest) -> csi::ControllerUnpublishVolumeResponse => |d, r| d.controller_unpublish(&r).map(|()| csi::ControllerUnpublishVolumeResponse {});
        validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse => |d, r| d.validate(&r);
        list_volumes(csi::ListVolumesRequest) -> csi::ListVolumesResponse => |d, r| d.list_volumes(&r);
        controller_list_volume_health(csi::ControllerListVolumeHealthRequest) -> csi::ControllerListVolumeHealthResponse => |d, r| d.list_volume_health(&r);
        controller_get_volume_health(csi::ControllerGetVolumeHealthRequest) -> csi::ControllerGetVolumeHealthResponse => |d, r| d.get_volume_health(&r);
        get_capacity(csi::GetCapacityRequest) -> csi::GetCapacityResponse => |d, r| d.get_capacity(&r);
        controller_get_capabilities(csi::ControllerGetCapabilitiesRequest) -> csi::ControllerGetCapabilitiesResponse => |d, _r| Ok(d.capabilities());
        create_snapshot(csi::CreateSnapshotRequest) -> csi::CreateSnapshotResponse => |d, r| d.create_snapshot(&r);
        delete_snapshot(csi::DeleteSnapshotRequest) -> csi::DeleteSnapshotResponse => |d, r| d.delete_snapshot(&r).map(|()| csi::DeleteSnapshotResponse {});
        list_snapshots(csi::ListSnapshotsRequest) -> csi::ListSnapshotsResponse => |d, r| d.list_snapshots(&r);
        get_snapshot(csi::GetSnapshotRequest) -> csi::GetSnapshotResponse => |d, r| d.get_snapshot(&r);
        controller_expand_volume(csi::ControllerExpandVolumeRequest) -> csi::ControllerExpandVolumeResponse => |d, r| d.expand(&r);
        controller_get_volume(csi::ControllerGetVolumeRequest) -> csi::ControllerGetVolumeResponse => |d, r| d.get_volume(&r);
        controller_modify_volume(csi::ControllerModifyVolumeRequest) -> csi::ControllerModifyVolumeResponse => |d, r| d.modify(&r).map(|()| csi::ControllerModifyVolumeResponse {});
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// A page may end on an ephemeral inline volume (the kubelet's `csi-<sha256>` ID): its token
    /// must start the next page, while a malformed token stays ABORTED (csi-sanity sends
    /// "invalid-token").
    #[test]
    fn volume_page_tokens_round_trip_for_both_kinds_of_volume() {
        let uuid = "5e59f0c4-e518-4747-9246-d4a64499551c";
        let inline = format!("csi-{}", "ab".repeat(32));
        for id in [uuid, inline.as_str()] {
            let token = volume_page_token(id);
            assert_eq!(
                volume_page_start(&token).unwrap().as_deref(),
                Some(id),
                "{token}"
            );
        }
        assert_eq!(
            volume_page_token(uuid),
            uuid,
            "a persistent volume's token is its ID"
        );
        assert_eq!(volume_page_token(""), "", "no next page");
        assert_eq!(volume_page_start("").unwrap(), None);
        for bad in [
            "invalid-token",
            "ephemeral/",
            "ephemeral/a.b",
            &format!("ephemeral/{uuid}"),
        ] {
            let error = volume_page_start(bad).unwrap_err();
            assert_eq!(error.code(), Code::Aborted, "{bad}");
        }
    }

    #[test]
    fn capacity_ranges() {
        let range = |required, limit| csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        };
        let max = 10 << 30;
        let table = [
            (None, Ok((DEFAULT_VOLUME_SIZE, 0))),
            (Some(range(5, 0)), Ok((5, 0))),
            (Some(range(0, 1 << 20)), Ok((1 << 20, 1 << 20))),
            (Some(range(5, 10)), Ok((5, 10))),
            (Some(range(10, 5)), Err(Code::OutOfRange)),
            (Some(range(11 << 30, 0)), Err(Code::OutOfRange)),
            (Some(range(-1, 0)), Err(Code::InvalidArgument)),
        ];
        for (input, want) in table {
            assert_eq!(
                requested_size(input.as_ref(), max).map_err(|e| e.code()),
                want,
                "{input:?}"
            );
        }
    }

    #[test]
    fn expansion_ranges() {
        let range = |required, limit| csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        };
        let (current, max) = (16 << 20, 10 << 30);
        let table = [
            (range(0, 0), Err(Code::InvalidArgument)),
            (range(-1, 0), Err(Code::InvalidArgument)),
            (range(32 << 20, 0), Ok(32 << 20)),
            (range(8 << 20, 0), Ok(current)),
            (range(0, 64 << 20), Ok(current)),
            (range(32 << 20, 64 << 20), Ok(32 << 20)),
            (range(64 << 20, 32 << 20), Err(Code::OutOfRange)),
            (range(0, 8 << 20), Err(Code::OutOfRange)),
            (range(11 << 30, 0), Err(Code::OutOfRange)),
        ];
        for (input, want) in table {
            assert_eq!(
                expanded_size(&input, current, max).map_err(|e| e.code()),
                want,
                "{input:?}"
            );
        }
    }

    #[test]
    fn pagination_by_id() {
        let ids: Vec<String> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (page, next) = paginate(ids.iter(), |s| s, None, 2);
        assert_eq!((page, next.as_str()), (vec![&ids[0], &ids[1]], "b"));
        let (page, next) = paginate(ids.iter(), |s| s, Some("b"), 2);
        assert_eq!((page, next.as_str()), (vec![&ids[2], &ids[3]], "d"));
        let (page, next) = paginate(ids.iter(), |s| s, Some("d"), 2);
        assert_eq!((page, next.as_str()), (vec![&ids[4]], ""));
        let (page, next) = paginate(ids.iter(), |s| s, None, 0);
        assert_eq!((page.len(), next.as_str()), (5, ""));
    }
}
