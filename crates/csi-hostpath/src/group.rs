//! The CSI GroupController service: snapshots of several volumes taken together.

use std::collections::BTreeSet;
use std::sync::Arc;

use csi::group_controller_server::GroupController;
use csi::group_controller_service_capability::rpc::Type as Rpc;
use csi_proto::csi::v1 as csi;

use crate::data;
use crate::driver::{Driver, timestamp};
use crate::error::DriverError;
use crate::rules::{self, required};
use crate::state::{GroupSnapshot, Phase, Snapshot, State, now_nanos};

#[derive(Debug, Clone)]
pub struct GroupControllerService {
    driver: Arc<Driver>,
}

impl GroupControllerService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

impl Driver {
    fn csi_group(&self, state: &State, group: &GroupSnapshot) -> csi::VolumeGroupSnapshot {
        csi::VolumeGroupSnapshot {
            group_snapshot_id: group.id.clone(),
            snapshots: group
                .snapshot_ids
                .iter()
                .filter_map(|id| state.snapshots.get(id))
                .map(|s| self.csi_snapshot(s))
                .collect(),
            creation_time: Some(timestamp(group.created_unix_nanos)),
            ready_to_use: group.phase == Phase::Ready,
        }
    }

    fn create_group(
        &self,
        request: &csi::CreateVolumeGroupSnapshotRequest,
    ) -> Result<csi::CreateVolumeGroupSnapshotResponse, DriverError> {
        let name = required(&request.name, "name")?;
        rules::bounded_map(&request.parameters, "parameters")?;
        if request.source_volume_ids.is_empty() {
            return Err(DriverError::Missing {
                field: "source_volume_ids",
            });
        }
        let sources: BTreeSet<&String> = request.source_volume_ids.iter().collect();
        let mut keys: Vec<&str> = request
            .source_volume_ids
            .iter()
            .map(String::as_str)
            .collect();
        let name_key = format!("group/{name}");
        keys.push(&name_key);
        let _guard = self.locks.acquire(&keys)?;
        let group = self.store.update(|state| {
            if let Some(existing) = state.groups.by_name_mut(name) {
                if existing.source_volume_ids.iter().collect::<BTreeSet<_>>() != sources {
                    return Err(DriverError::ExistsWithOtherParameters {
                        kind: "group snapshot",
                        name: name.to_string(),
                        how: "with other source volumes",
                    });
                }
                if existing.phase == Phase::Creating {
                    self.claim_creation(&mut existing.creator, "group snapshot", name)?;
                }
                return Ok(existing.clone());
            }
            let group_id = rules::new_id();
            let created = now_nanos();
            let mut snapshot_ids = Vec::new();
            for source in &request.source_volume_ids {
                let volume = state
                    .volumes
                    .get(source)
                    .filter(|v| v.phase == Phase::Ready)
                    .ok_or_else(|| DriverError::SourceNotFound {
                        kind: "volume",
                        id: source.clone(),
                    })?;
                let snapshot = Snapshot {
                    id: rules::new_id(),
                    name: format!("{name}-{source}"),
                    source_volume_id: source.clone(),
                    size_bytes: volume.capacity_bytes,
                    access_type: volume.access_type,
                    filesystem: volume.filesystem,
                    phase: Phase::Creating,
                    created_unix_nanos: created,
                    group_snapshot_id: Some(group_id.clone()),
                    // Members are created, and rolled back, with their group.
                    creator: None,
                };
                snapshot_ids.push(snapshot.id.clone());
                state.snapshots.insert(snapshot.id.clone(), snapshot);
            }
            let group = GroupSnapshot {
                id: group_id,
                name: name.to_string(),
                source_volume_ids: request.source_volume_ids.clone(),
                snapshot_ids,
                phase: Phase::Creating,
                created_unix_nanos: created,
                creator: Some(self.instance.id.clone()),
            };
            state.groups.insert(group.id.clone(), group.clone());
            Ok(group)
        })?;
        if group.phase == Phase::Creating {
            let state = self.store.read()?;
            for id in &group.snapshot_ids {
                let snapshot =
                    state
                        .snapshots
                        .get(id)
                        .ok_or_else(|| DriverError::DeletedMeanwhile {
                            kind: "member snapshot",
                            name: id.clone(),
                        })?;
                self.flush_exports(&snapshot.source_volume_id);
                let layout = snapshot.layout();
                let taken = data::snapshot(
                    &self.store.volume_data(&snapshot.source_volume_id, layout),
                    &self.store.snapshot_data(id, layout),
                    layout,
                );
                if let Err(error) = taken {
                    self.roll_back_snapshots(&group.snapshot_ids, Some(&group.id));
                    return Err(DriverError::io(
                        format!("taking member snapshot {id}"),
                        error,
                    ));
                }
            }
            self.store.update(|state| {
                for id in &group.snapshot_ids {
                    if let Some(s) = state.snapshots.get_mut(id) {
                        s.phase = Phase::Ready;
                    }
                }
                if let Some(g) = state.groups.get_mut(&group.id) {
                    g.phase = Phase::Ready;
                }
                Ok::<_, DriverError>(())
            })?;
        }
        let state = self.store.read()?;
        let group = state
            .groups
            .get(&group.id)
            .ok_or_else(|| DriverError::DeletedMeanwhile {
                kind: "group snapshot",
                name: name.to_string(),
            })?;
        Ok(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(self.csi_group(&state, group)),
        })
    }

    /// The group, checking that `snapshot_ids` (when given) are exactly its members.
    fn group_with_members(
        state: &State,
        id: &str,
        snapshot_ids: &[String],
    ) -> Result<Option<GroupSnapshot>, DriverError> {
        let Some(group) = state.groups.get(id) else {
            return Ok(None);
        };
        let given: BTreeSet<&String> = snapshot_ids.iter().collect();
        if !given.is_empty() && given != group.snapshot_ids.iter().collect() {
            return Err(DriverError::GroupMembersMismatch {
                group: id.to_string(),
            });
        }
        Ok(Some(group.clone()))
    }

    fn delete_group(
        &self,
        request: &csi::DeleteVolumeGroupSnapshotRequest,
    ) -> Result<(), DriverError> {
        let id = required(&request.group_snapshot_id, "group_snapshot_id")?;
        let _guard = self.locks.acquire(&[id])?;
        let group = self.store.update(|state| {
            let group = Self::group_with_members(state, id, &request.snapshot_ids)?;
            if let Some(group) = &group {
                for member in &group.snapshot_ids {
                    if let Some(s) = state.snapshots.get_mut(member) {
                        s.phase = Phase::Deleting;
                    }
                }
                if let Some(g) = state.groups.get_mut(id) {
                    g.phase = Phase::Deleting;
                }
            }
            Ok::<_, DriverError>(group)
        })?;
        match group {
            Some(group) => self.finish_deleting_snapshots(&group.snapshot_ids, Some(id)),
            None => Ok(()),
        }
    }

    fn get_group(
        &self,
        request: &csi::GetVolumeGroupSnapshotRequest,
    ) -> Result<csi::GetVolumeGroupSnapshotResponse, DriverError> {
        let id = required(&request.group_snapshot_id, "group_snapshot_id")?;
        let state = self.store.read()?;
        let group = Self::group_with_members(&state, id, &request.snapshot_ids)?
            .filter(|g| g.phase == Phase::Ready)
            .ok_or_else(|| DriverError::not_found("group snapshot", id))?;
        Ok(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(self.csi_group(&state, &group)),
        })
    }
}

crate::driver::blocking_service! {
    GroupControllerService: GroupController {
        group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest) -> csi::GroupControllerGetCapabilitiesResponse => |_d, _r| Ok(group_capabilities());
        create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest) -> csi::CreateVolumeGroupSnapshotResponse => |d, r| d.create_group(&r);
        delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest) -> csi::DeleteVolumeGroupSnapshotResponse => |d, r| d.delete_group(&r).map(|()| csi::DeleteVolumeGroupSnapshotResponse {});
        get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest) -> csi::GetVolumeGroupSnapshotResponse => |d, r| d.get_group(&r);
    }
}

fn group_capabilities() -> csi::GroupControllerGetCapabilitiesResponse {
    csi::GroupControllerGetCapabilitiesResponse {
        capabilities: vec![csi::GroupControllerServiceCapability {
            r#type: Some(csi::group_controller_service_capability::Type::Rpc(
                csi::group_controller_service_capability::Rpc {
                    r#type: Rpc::CreateDeleteGetVolumeGroupSnapshot as i32,
                },
            )),
        }],
    }
}
