//! The driver shared by the three services: configuration, the state store, per-volume
//! operation locks, and the conversion of internal records to CSI messages.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use csi_proto::csi::v1 as csi;
use tonic::Status;

use crate::config::Config;
use crate::error::DriverError;
use crate::state::{ContentSource, Instance, Phase, Snapshot, State, Store, Volume};

/// Names and IDs with an operation in flight. A second operation on the same key is refused
/// with `ABORTED` (the CSI spec's "operation pending"), and unrelated volumes never wait.
#[derive(Debug, Default)]
pub struct OperationLocks {
    busy: Mutex<HashSet<String>>,
}

/// Releases its keys when dropped.
#[derive(Debug)]
pub struct OperationGuard<'a> {
    locks: &'a OperationLocks,
    keys: Vec<String>,
}

impl OperationLocks {
    pub fn acquire(&self, keys: &[&str]) -> Result<OperationGuard<'_>, DriverError> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(key) = keys.iter().find(|k| busy.contains(**k)) {
            return Err(DriverError::OperationPending {
                key: (*key).to_string(),
            });
        }
        for key in keys {
            busy.insert((*key).to_string());
        }
        Ok(OperationGuard {
            locks: self,
            keys: keys.iter().map(|k| (*k).to_string()).collect(),
        })
    }
}

impl Drop for OperationGuard<'_> {
    fn drop(&mut self) {
        let mut busy = self.locks.busy.lock().unwrap_or_else(|p| p.into_inner());
        for key in &self.keys {
            busy.remove(key);
        }
    }
}

/// Everything the services share.
#[derive(Debug)]
pub struct Driver {
    pub config: Config,
    pub store: Store,
    pub locks: OperationLocks,
    /// This process, as the creator of what it records in `Creating`.
    pub instance: Instance,
}

impl Driver {
    pub fn new(config: Config, store: Store, instance: Instance) -> Arc<Self> {
        Arc::new(Self {
            config,
            store,
            locks: OperationLocks::default(),
            instance,
        })
    }

    /// Makes this instance the creator of a record found `Creating`: one whose creator is gone
    /// (a crash) is taken over and finished; one another running instance is still creating
    /// is `ABORTED`, as an operation pending elsewhere.
    pub fn claim_creation(
        &self,
        creator: &mut Option<String>,
        kind: &'static str,
        name: &str,
    ) -> Result<(), DriverError> {
        match creator {
            Some(id) if *id != self.instance.id && self.store.instance_alive(id) => {
                Err(DriverError::CreatingElsewhere {
                    kind,
                    name: name.to_string(),
                })
            }
            _ => {
                *creator = Some(self.instance.id.clone());
                Ok(())
            }
        }
    }

    /// Runs blocking work (files, mounts, the state lock) off the async executor; its error
    /// becomes the RPC's status here.
    pub async fn blocking<T, F>(self: &Arc<Self>, work: F) -> Result<tonic::Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, DriverError> + Send + 'static,
    {
        let driver = self.clone();
        tokio::task::spawn_blocking(move || work(&driver))
            .await
            .map_err(DriverError::from)
            .flatten()
            .map(tonic::Response::new)
            .map_err(Status::from)
    }

    /// Nodes a volume can be placed on or published to: the ones whose instances registered,
    /// plus this instance's own node.
    pub fn is_known_node(&self, node: &str) -> bool {
        node == self.config.node_id || self.store.heartbeat_age_ms(node).is_some()
    }

    /// `UNIMPLEMENTED` for the v1.13 health RPCs when only v1.12's VolumeCondition is served.
    pub fn health_rpcs_served(&self, rpc: &'static str) -> Result<(), DriverError> {
        if self.config.volume_health.rpcs() {
            Ok(())
        } else {
            Err(DriverError::HealthRpcsOff { rpc })
        }
    }

    pub fn topology(&self, node: &str) -> csi::Topology {
        csi::Topology {
            segments: [(self.config.topology_key(), node.to_string())].into(),
        }
    }

    pub fn csi_volume(&self, volume: &Volume) -> csi::Volume {
        csi::Volume {
            capacity_bytes: i64::try_from(volume.capacity_bytes).unwrap_or(i64::MAX),
            volume_id: volume.id.clone(),
            volume_context: volume.parameters.clone().into_iter().collect(),
            content_source: volume
                .source
                .as_ref()
                .map(|source| csi::VolumeContentSource {
                    r#type: Some(match source {
                        ContentSource::Snapshot(id) => csi::volume_content_source::Type::Snapshot(
                            csi::volume_content_source::SnapshotSource {
                                snapshot_id: id.clone(),
                            },
                        ),
                        ContentSource::Volume(id) => csi::volume_content_source::Type::Volume(
                            csi::volume_content_source::VolumeSource {
                                volume_id: id.clone(),
                            },
                        ),
                    }),
                }),
            accessible_topology: volume
                .accessible_nodes
                .iter()
                .map(|node| self.topology(node))
                .collect(),
        }
    }

    pub fn csi_snapshot(&self, snapshot: &Snapshot) -> csi::Snapshot {
        csi::Snapshot {
            size_bytes: i64::try_from(snapshot.size_bytes).unwrap_or(i64::MAX),
            snapshot_id: snapshot.id.clone(),
            source_volume_id: snapshot.source_volume_id.clone(),
            creation_time: Some(timestamp(snapshot.created_unix_nanos)),
            ready_to_use: snapshot.phase == Phase::Ready,
            group_snapshot_id: snapshot.group_snapshot_id.clone().unwrap_or_default(),
            // Snapshots are usable from every node: no SNAPSHOT_ACCESSIBILITY_CONSTRAINTS.
            accessible_topology: Vec::new(),
        }
    }
}

/// Implements a tonic service trait whose every RPC runs a [`Driver`] method on the blocking
/// pool: `method(Request) -> Response => |driver, request| body;`.
macro_rules! blocking_service {
    ($service:ident: $trait:ident { $( $method:ident($request:ty) -> $response:ty => |$driver:ident, $input:ident| $body:expr; )* }) => {
        #[tonic::async_trait]
        impl $trait for $service {
            $(
                async fn $method(&self, request: tonic::Request<$request>) -> Result<tonic::Response<$response>, tonic::Status> {
                    let $input = request.into_inner();
                    self.driver.blocking(move |$driver| $body).await
                }
            )*
        }
    };
}
pub(crate) use blocking_service;

/// A protobuf timestamp from nanoseconds since the epoch.
pub fn timestamp(nanos: u128) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(nanos % 1_000_000_000).unwrap_or(0),
    }
}

/// A volume the CO may use (created and not being deleted), or `NOT_FOUND`.
pub fn ready_volume<'a>(state: &'a State, id: &str) -> Result<&'a Volume, DriverError> {
    state
        .volumes
        .get(id)
        .filter(|v| v.phase == Phase::Ready)
        .ok_or_else(|| DriverError::not_found("volume", id))
}

/// [`ready_volume`], for changing it.
pub fn ready_volume_mut<'a>(state: &'a mut State, id: &str) -> Result<&'a mut Volume, DriverError> {
    state
        .volumes
        .get_mut(id)
        .filter(|v| v.phase == Phase::Ready)
        .ok_or_else(|| DriverError::not_found("volume", id))
}

/// Converts the proto map type to ours.
pub fn to_btree(map: std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn operation_locks_refuse_concurrent_work_on_the_same_key_only() {
        let locks = OperationLocks::default();
        let first = locks.acquire(&["vol-1"]).unwrap();
        assert_eq!(locks.acquire(&["vol-1"]).unwrap_err().code(), Code::Aborted);
        assert_eq!(
            locks.acquire(&["vol-2", "vol-1"]).unwrap_err().code(),
            Code::Aborted
        );
        let other = locks.acquire(&["vol-2"]).unwrap();
        drop(first);
        let again = locks.acquire(&["vol-1"]).unwrap();
        drop((other, again));
    }
}
