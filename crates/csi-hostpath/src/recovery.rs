//! Undoing what a failed or interrupted operation left. A volume or snapshot whose data could
//! not be made is rolled back at once: its record would otherwise stay `Creating` for good,
//! holding pool capacity, and its partial data the disk. At startup a controller rolls back
//! the creations whose instance is gone (a crash), finishes interrupted deletions, and removes
//! data no record names. Removal goes data first, record last, with the record marked
//! `Deleting` before: a crash midway leaves a record the next start finishes.

use crate::data;
use crate::driver::Driver;
use crate::error::DriverError;
use crate::state::{Layout, Phase, StoreError};

impl Driver {
    /// Rolls back a volume whose data creation failed.
    pub fn roll_back_volume(&self, id: &str, layout: Layout) {
        let rolled_back = self
            .store
            .update(|state| {
                if let Some(volume) = state.volumes.get_mut(id) {
                    volume.phase = Phase::Deleting;
                }
                Ok::<_, DriverError>(())
            })
            .and_then(|()| self.finish_deleting_volume(id, layout));
        if let Err(error) = rolled_back {
            tracing::warn!(volume = id, %error, "rollback of a failed creation incomplete; the next start finishes it");
        }
    }

    /// Rolls back snapshots (and the group they make, if any) whose data could not be taken.
    pub fn roll_back_snapshots(&self, ids: &[String], group: Option<&str>) {
        let rolled_back = self
            .store
            .update(|state| {
                for id in ids {
                    if let Some(snapshot) = state.snapshots.get_mut(id) {
                        snapshot.phase = Phase::Deleting;
                    }
                }
                if let Some(group) = group.and_then(|g| state.groups.get_mut(g)) {
                    group.phase = Phase::Deleting;
                }
                Ok::<_, DriverError>(())
            })
            .and_then(|()| self.finish_deleting_snapshots(ids, group));
        if let Err(error) = rolled_back {
            tracing::warn!(snapshots = ?ids, ?group, %error, "rollback of a failed snapshot incomplete; the next start finishes it");
        }
    }

    /// Removes the data, then the record, of a volume marked `Deleting`.
    pub fn finish_deleting_volume(&self, id: &str, layout: Layout) -> Result<(), DriverError> {
        data::remove(&self.store.volume_data(id, layout))
            .map_err(|e| DriverError::io(format!("removing data of volume {id}"), e))?;
        self.store.update(|state| {
            state.volumes.remove(id);
            Ok(())
        })
    }

    /// Removes the data, then the records, of snapshots marked `Deleting` (and of their group).
    pub fn finish_deleting_snapshots(
        &self,
        ids: &[String],
        group: Option<&str>,
    ) -> Result<(), DriverError> {
        let state = self.store.read()?;
        for id in ids {
            if let Some(snapshot) = state.snapshots.get(id) {
                data::remove_snapshot(&self.store.snapshot_data(id, snapshot.layout()))
                    .map_err(|e| DriverError::io(format!("removing snapshot {id}"), e))?;
            }
        }
        self.store.update(|state| {
            for id in ids {
                state.snapshots.remove(id);
            }
            if let Some(group) = group {
                state.groups.remove(group);
            }
            Ok(())
        })
    }
}

/// A controller's startup recovery (see the module's documentation).
pub fn recover(driver: &Driver) -> Result<(), StoreError> {
    let gone = |creator: &Option<String>| {
        creator
            .as_deref()
            .is_none_or(|id| !driver.store.instance_alive(id))
    };
    driver.store.update(|state| {
        // An ephemeral volume may be mounted on its node, which alone recovers it
        // (`Driver::recover_ephemeral`).
        for volume in state.volumes.values_mut() {
            if volume.phase == Phase::Creating
                && volume.ephemeral.is_none()
                && gone(&volume.creator)
            {
                tracing::info!(volume = %volume.id, "rolling back a creation a crash interrupted");
                volume.phase = Phase::Deleting;
            }
        }
        let mut abandoned_members = Vec::new();
        for group in state.groups.values_mut() {
            if group.phase == Phase::Creating && gone(&group.creator) {
                tracing::info!(group = %group.id, "rolling back a group snapshot a crash interrupted");
                group.phase = Phase::Deleting;
                abandoned_members.extend(group.snapshot_ids.iter().cloned());
            }
        }
        for snapshot in state.snapshots.values_mut() {
            // A member is rolled back with its group.
            let abandoned = match &snapshot.group_snapshot_id {
                Some(_) => abandoned_members.contains(&snapshot.id),
                None => snapshot.phase == Phase::Creating && gone(&snapshot.creator),
            };
            if abandoned {
                tracing::info!(snapshot = %snapshot.id, "rolling back a snapshot a crash interrupted");
                snapshot.phase = Phase::Deleting;
            }
        }
        Ok::<_, StoreError>(())
    })?;

    let state = driver.store.read()?;
    let mut finished = Vec::new();
    for volume in state.volumes.values() {
        if volume.phase == Phase::Deleting && volume.ephemeral.is_none() {
            finished.push(driver.finish_deleting_volume(&volume.id, volume.layout()));
        }
    }
    for group in state.groups.values() {
        if group.phase == Phase::Deleting {
            finished.push(driver.finish_deleting_snapshots(&group.snapshot_ids, Some(&group.id)));
        }
    }
    for snapshot in state.snapshots.values() {
        let lone = snapshot
            .group_snapshot_id
            .as_ref()
            .is_none_or(|group| !state.groups.contains_key(group));
        if snapshot.phase == Phase::Deleting && lone {
            finished
                .push(driver.finish_deleting_snapshots(std::slice::from_ref(&snapshot.id), None));
        }
    }
    for error in finished.into_iter().filter_map(Result::err) {
        tracing::warn!(%error, "cannot finish an interrupted deletion");
    }

    for path in driver.store.data_without_record()? {
        match data::remove(&path) {
            Ok(()) => tracing::info!(path = %path.display(), "removed data no record names"),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot remove data no record names")
            }
        }
    }
    driver.store.forget_gone_instances();
    Ok(())
}
