//! The plugin watcher and the CSI registration handler: sockets appearing in
//! `<root>/plugins_registry` are registered (GetInfo → validate → NodeGetInfo → Node annotation,
//! topology labels and CSINode entry → NotifyRegistrationStatus), sockets disappearing are
//! unregistered. Behaviour of pkg/kubelet/pluginmanager and pkg/volume/csi/{csi_plugin.go,
//! nodeinfomanager/nodeinfomanager.go}. Registration and driver sockets are dialled as grpc-go in
//! the kubelet before 1.26 dials them: the socket path is the HTTP/2 `:authority`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use csi_grpc::conn::{CsiConnection, Endpoint, connect_as_kubelet};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::{InfoRequest, RegistrationStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, VolumeNodeResources};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::roles::{RoleError, lock, merge_patch};

/// The node-ID annotation kubelet still writes (a JSON map driver → node ID).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The only plugin type this kubelet handles.
const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// In-tree plugins a 1.33 kubelet reports as migrated to CSI on its CSINode.
const MIGRATED_PLUGINS: &str = "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume";

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounded well below kubelet's 2 minutes: a simulated node should not hang a test.
pub(super) const CSI_TIMEOUT: Duration = Duration::from_secs(30);

/// A driver this kubelet talks to.
#[derive(Clone, Debug)]
pub(super) struct RegisteredDriver {
    pub csi: CsiConnection,
    pub node_capabilities: BTreeSet<csi::node_service_capability::rpc::Type>,
    /// Whether the driver advertises the node VOLUME_CONDITION capability of CSI v1.0-v1.12.
    pub volume_condition: bool,
    pub version: Version,
    /// The registration socket and its modification time; `None` for a pre-registered
    /// endpoint.
    pub socket: Option<(PathBuf, SystemTime)>,
}

impl RegisteredDriver {
    pub fn can(&self, capability: csi::node_service_capability::rpc::Type) -> bool {
        self.node_capabilities.contains(&capability)
    }
}

#[derive(Debug, Default)]
pub(super) struct Drivers(Mutex<BTreeMap<String, RegisteredDriver>>);

impl Drivers {
    pub fn get(&self, name: &str) -> Option<RegisteredDriver> {
        lock(&self.0).get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        lock(&self.0).keys().cloned().collect()
    }

    pub fn clear(&self) {
        lock(&self.0).clear();
    }

    fn by_socket(&self) -> BTreeMap<PathBuf, (String, SystemTime)> {
        lock(&self.0)
            .iter()
            .filter_map(|(name, d)| {
                let (path, mtime) = d.socket.clone()?;
                Some((path, (name.clone(), mtime)))
            })
            .collect()
    }
}

/// A plugin version as kubelet compares them (`utilversion.ParseGeneric`: up to three numeric
/// components, an optional leading `v`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Version(u64, u64, u64);

impl Version {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim().strip_prefix('v').unwrap_or(text.trim());
        let mut parts = text.split('.').map(|p| p.parse::<u64>().ok());
        let major = parts.next()??;
        let minor = parts.next().unwrap_or(Some(0))?;
        let patch = parts.next().unwrap_or(Some(0))?;
        parts
            .next()
            .is_none()
            .then_some(Version(major, minor, patch))
    }
}

/// kubelet's CSI `ValidatePlugin`: the highest advertised version below 2.0.0 must be a 1.x
/// one, and must be newer than the version of an already registered driver of that name.
pub(super) fn validate_versions(
    driver: &str,
    versions: &[String],
    registered: Option<Version>,
) -> Result<Version, String> {
    if versions.is_empty() {
        return Err(format!(
            "plugin {driver} does not advertise any supported version"
        ));
    }
    let highest = versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .filter(|v| v.0 < 2)
        .max()
        .ok_or_else(|| {
            format!("none of the versions {versions:?} advertised by plugin {driver} is supported")
        })?;
    if highest.0 != 1 {
        return Err(format!(
            "plugin {driver} advertises version {}.{}.{}; this kubelet supports 1.x",
            highest.0, highest.1, highest.2
        ));
    }
    if let Some(existing) = registered
        && highest <= existing
    {
        return Err(format!(
            "driver {driver} is already registered with version {}.{}.{}, equal or newer",
            existing.0, existing.1, existing.2
        ));
    }
    Ok(highest)
}

/// The CSINode kubelet creates for its Node.
pub(super) fn csi_node_object(node: &Node) -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {
            "name": node.name_any(),
            "annotations": {"storage.alpha.kubernetes.io/migrated-plugins": MIGRATED_PLUGINS},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name_any(), "uid": node.uid()}],
        },
        "spec": {"drivers": []},
    })
}

/// The plugin watcher: registers new sockets, unregisters removed or replaced ones.
pub(super) async fn watch(shared: Arc<Shared>, token: CancellationToken) {
    for endpoint in shared.config.driver_endpoints.clone() {
        let shared = shared.clone();
        let token = token.clone();
        tokio::spawn(async move { register_endpoint(&shared, endpoint, &token).await });
    }
    let directory = shared.config.plugins_registry();
    loop {
        if !shared.partitioned() {
            reconcile_sockets(&shared, &directory).await;
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(shared.config.timing.resync) => {}
        }
    }
}

/// A driver given by endpoint: registered once it answers, retried until then.
async fn register_endpoint(shared: &Shared, endpoint: Endpoint, token: &CancellationToken) {
    loop {
        if !shared.partitioned() {
            match register(shared, &endpoint, None, None).await {
                Ok(name) => {
                    tracing::info!(node = %shared.config.node, driver = %name, %endpoint, "registered CSI driver");
                    return;
                }
                Err(error) => {
                    tracing::warn!(node = %shared.config.node, %endpoint, %error, "CSI driver registration failed, retrying")
                }
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(shared.config.timing.resync) => {}
        }
    }
}

/// Sockets (not starting with `.`) in the registration directory and its subdirectories.
fn registration_sockets(directory: &Path) -> BTreeMap<PathBuf, SystemTime> {
    let mut found = BTreeMap::new();
    let mut pending = vec![directory.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.file_type().is_socket() {
                let mtime = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.insert(entry.path(), mtime);
            }
        }
    }
    found
}

/// kubelet's reconciler: first unregister what is gone or replaced, then register what is new.
async fn reconcile_sockets(shared: &Shared, directory: &Path) {
    let present = registration_sockets(directory);
    for (socket, (driver, mtime)) in shared.drivers.by_socket() {
        if present.get(&socket) != Some(&mtime) {
            unregister(shared, &driver).await;
        }
    }
    let registered = shared.drivers.by_socket();
    for (socket, mtime) in present {
        if registered.contains_key(&socket) {
            continue;
        }
        if let Err(error) = register_socket(shared, &socket, mtime).await {
            tracing::warn!(node = %shared.config.node, socket = %socket.display(), %error, "plugin registration failed");
        }
    }
}

async fn register_socket(shared: &Shared, socket: &Path, mtime: SystemTime) -> Result<(), String> {
    let endpoint = Endpoint::from_path(socket).map_err(|e| e.to_string())?;
    let connection =
        connect_as_kubelet(&endpoint, DIAL_TIMEOUT, CsiOperationMetrics::unregistered())
            .await
            .map_err(|e| e.to_string())?;
    let mut client = RegistrationClient::new(connection.channel());
    let mut request = tonic::Request::new(InfoRequest {});
    request.set_timeout(GET_INFO_TIMEOUT);
    let info = client
        .get_info(request)
        .await
        .map_err(|status| format!("GetInfo: {}", status.message()))?
        .into_inner();
    let outcome = if info.r#type != CSI_PLUGIN_TYPE {
        Err(format!(
            "plugin type {:?} is not handled by this kubelet (only {CSI_PLUGIN_TYPE})",
            info.r#type
        ))
    } else {
        let registered = shared.drivers.get(&info.name).map(|d| d.version);
        match validate_versions(&info.name, &info.supported_versions, registered) {
            Err(error) => Err(error),
            Ok(version) => {
                let path = if info.endpoint.is_empty() {
                    socket.display().to_string()
                } else {
                    info.endpoint.clone()
                };
                match Endpoint::parse(&path) {
                    Err(error) => Err(error.to_string()),
                    Ok(endpoint) => {
                        register(
                            shared,
                            &endpoint,
                            Some(version),
                            Some((socket.to_path_buf(), mtime)),
                        )
                        .await
                    }
                }
            }
        }
    };
    let status = match &outcome {
        Ok(_) => RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
        Err(error) => RegistrationStatus {
            plugin_registered: false,
            error: error.clone(),
        },
    };
    let mut notify = tonic::Request::new(status);
    notify.set_timeout(NOTIFY_TIMEOUT);
    if let Err(status) = client.notify_registration_status(notify).await {
        tracing::warn!(socket = %socket.display(), error = %status.message(), "NotifyRegistrationStatus failed");
    }
    let name = outcome?;
    tracing::info!(node = %shared.config.node, driver = %name, socket = %socket.display(), "registered CSI driver");
    Ok(())
}

/// Connects to the driver, asks NodeGetInfo and records it on the Node and CSINode. Returns
/// the driver name.
async fn register(
    shared: &Shared,
    endpoint: &Endpoint,
    version: Option<Version>,
    socket: Option<(PathBuf, SystemTime)>,
) -> Result<String, String> {
    let csi = connect_as_kubelet(endpoint, DIAL_TIMEOUT, CsiOperationMetrics::unregistered())
        .await
        .map_err(|e| e.to_string())?;
    let name = csi
        .get_plugin_info(csi::GetPluginInfoRequest {}, CSI_TIMEOUT)
        .await
        .map_err(|s| format!("GetPluginInfo: {}", s.message()))?
        .name;
    let info = csi
        .node_get_info(csi::NodeGetInfoRequest {}, CSI_TIMEOUT)
        .await
        .map_err(|s| format!("NodeGetInfo: {}", s.message()))?;
    let capabilities = csi
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}, CSI_TIMEOUT)
        .await
        .map_err(|s| format!("NodeGetCapabilities: {}", s.message()))?;
    if info.node_id.is_empty() {
        return Err(format!("driver {name} returned an empty node ID"));
    }
    let topology = info
        .accessible_topology
        .map(|t| t.segments)
        .unwrap_or_default();
    install(
        shared,
        &name,
        &info.node_id,
        info.max_volumes_per_node,
        &topology,
    )
    .await
    .map_err(|e| e.to_string())?;
    lock(&shared.drivers.0).insert(
        name.clone(),
        RegisteredDriver {
            csi,
            node_capabilities: csi_grpc::conn::node_capabilities(&capabilities),
            volume_condition: csi_grpc::conn::node_volume_condition(&capabilities),
            version: version.unwrap_or(Version(1, 0, 0)),
            socket,
        },
    );
    shared.wake.notify_one();
    Ok(name)
}

/// The Node patch for a driver: its node ID merged into the annotation's map, and its topology
/// segments as labels — refused when a label already has another value.
fn node_patch(
    node: &Node,
    driver: &str,
    node_id: Option<&str>,
    topology: &Segments,
) -> Result<serde_json::Value, String> {
    let labels = node.labels();
    for (key, value) in topology {
        if let Some(existing) = labels.get(key)
            && existing != value
        {
            return Err(format!(
                "detected topology value collision: driver reported {key}:{value} but existing label is {key}:{existing}"
            ));
        }
    }
    let mut ids: BTreeMap<String, String> = node
        .annotations()
        .get(NODE_ID_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    match node_id {
        Some(id) => ids.insert(driver.to_string(), id.to_string()),
        None => ids.remove(driver),
    };
    let annotation = if ids.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::Value::String(serde_json::to_string(&ids).map_err(|e| e.to_string())?)
    };
    Ok(json!({"metadata": {"labels": topology, "annotations": {NODE_ID_ANNOTATION: annotation}}}))
}

type Segments = std::collections::HashMap<String, String>;

/// The CSINode driver entry kubelet writes: sorted topology keys, allocatable count only when
/// the driver reports a limit.
fn csi_node_driver(
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &Segments,
) -> CSINodeDriver {
    let mut keys: Vec<String> = topology.keys().cloned().collect();
    keys.sort();
    CSINodeDriver {
        name: driver.to_string(),
        node_id: node_id.to_string(),
        topology_keys: Some(keys),
        allocatable: (max_volumes > 0).then(|| VolumeNodeResources {
            count: Some(i32::try_from(max_volumes).unwrap_or(i32::MAX)),
        }),
    }
}

async fn install(
    shared: &Shared,
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &Segments,
) -> Result<(), RoleError> {
    let nodes = shared.node_api();
    let node = nodes.get(&shared.config.node).await?;
    let patch = node_patch(&node, driver, Some(node_id), topology).map_err(RoleError::Invalid)?;
    merge_patch(&nodes, &shared.config.node, patch).await?;
    let entry = csi_node_driver(driver, node_id, max_volumes, topology);
    update_csi_node(shared, &node, |drivers| {
        if drivers.contains(&entry) {
            return false;
        }
        drivers.retain(|d| d.name != entry.name);
        drivers.push(entry.clone());
        true
    })
    .await
}

/// Forgets a driver whose socket went away: its CSINode entry and its node-ID annotation
/// entry go (topology labels stay, as with kubelet).
async fn unregister(shared: &Shared, driver: &str) {
    lock(&shared.drivers.0).remove(driver);
    tracing::info!(node = %shared.config.node, %driver, "unregistering CSI driver");
    let result = async {
        let nodes = shared.node_api();
        let node = nodes.get(&shared.config.node).await?;
        let patch =
            node_patch(&node, driver, None, &Segments::new()).map_err(RoleError::Invalid)?;
        merge_patch(&nodes, &shared.config.node, patch).await?;
        update_csi_node(shared, &node, |drivers| {
            let before = drivers.len();
            drivers.retain(|d| d.name != driver);
            drivers.len() != before
        })
        .await
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(node = %shared.config.node, %driver, %error, "unregistering the driver from the API failed");
    }
}

/// Read-modify-write of the CSINode's driver list, retried on conflicts; created when missing.
async fn update_csi_node(
    shared: &Shared,
    node: &Node,
    mut change: impl FnMut(&mut Vec<CSINodeDriver>) -> bool,
) -> Result<(), RoleError> {
    let api: Api<CSINode> = Api::all(shared.client.clone());
    for _ in 0..5 {
        let existing = api.get_opt(&shared.config.node).await?;
        let mut csi_node = match existing {
            Some(csi_node) => csi_node,
            None => serde_json::from_value(csi_node_object(node))
                .map_err(|e| RoleError::Invalid(format!("CSINode object: {e}")))?,
        };
        if !change(&mut csi_node.spec.drivers) {
            return Ok(());
        }
        let result = if csi_node.meta().resource_version.is_some() {
            api.replace(&shared.config.node, &PostParams::default(), &csi_node)
                .await
        } else {
            api.create(&PostParams::default(), &csi_node).await
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(RoleError::Invalid(format!(
        "CSINode {} kept changing under us",
        shared.config.node
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn version_validation() {
        type Case<'a> = (&'a [&'a str], Option<Version>, Result<Version, &'a str>);
        let table: &[Case] = &[
            (&["1.0.0"], None, Ok(Version(1, 0, 0))),
            (&["v1.2", "1.0.0"], None, Ok(Version(1, 2, 0))),
            (&["1.0.0", "2.0.0"], None, Ok(Version(1, 0, 0))),
            (&[], None, Err("does not advertise")),
            (&["2.0.0"], None, Err("none of the versions")),
            (&["0.3.0"], None, Err("supports 1.x")),
            (&["banana"], None, Err("none of the versions")),
            (
                &["1.0.0"],
                Some(Version(1, 0, 0)),
                Err("already registered"),
            ),
            (&["1.1.0"], Some(Version(1, 0, 0)), Ok(Version(1, 1, 0))),
        ];
        for (advertised, registered, expected) in table {
            let got = validate_versions("d", &versions(advertised), *registered);
            match (expected, &got) {
                (Ok(v), Ok(g)) => assert_eq!(v, g, "{advertised:?}"),
                (Err(text), Err(error)) => assert!(error.contains(text), "{advertised:?}: {error}"),
                _ => panic!("{advertised:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    fn node(labels: &[(&str, &str)], ids: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        if let Some(ids) = ids {
            node.metadata.annotations =
                Some([(NODE_ID_ANNOTATION.to_string(), ids.to_string())].into());
        }
        node
    }

    #[test]
    fn node_patches() {
        let topology: Segments = [("zone".to_string(), "a".to_string())].into();
        let patch = node_patch(
            &node(&[], Some(r#"{"other":"x"}"#)),
            "d",
            Some("n1"),
            &topology,
        )
        .unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"labels": {"zone": "a"}, "annotations": {NODE_ID_ANNOTATION: r#"{"d":"n1","other":"x"}"#}}})
        );
        let clash =
            node_patch(&node(&[("zone", "b")], None), "d", Some("n1"), &topology).unwrap_err();
        assert!(clash.contains("collision"), "{clash}");
        let removed = node_patch(
            &node(&[], Some(r#"{"d":"n1"}"#)),
            "d",
            None,
            &Segments::new(),
        )
        .unwrap();
        assert_eq!(
            removed["metadata"]["annotations"][NODE_ID_ANNOTATION],
            serde_json::Value::Null
        );
    }

    #[test]
    fn csi_node_entries() {
        let topology: Segments = [
            ("b".to_string(), "1".to_string()),
            ("a".to_string(), "2".to_string()),
        ]
        .into();
        let entry = csi_node_driver("d", "n1", 0, &topology);
        assert_eq!(
            entry.topology_keys,
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(entry.allocatable, None);
        let limited = csi_node_driver("d", "n1", 1 << 40, &Segments::new());
        assert_eq!(limited.allocatable.and_then(|a| a.count), Some(i32::MAX));
    }
}
