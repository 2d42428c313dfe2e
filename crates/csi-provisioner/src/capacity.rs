//! Storage capacity tracking (external-provisioner `pkg/capacity`): one CSIStorageCapacity
//! object per StorageClass of the driver and topology segment, filled from GetCapacity. This
//! module is the pure core — segments, work items, which objects to create, update or delete;
//! [`controller`] carries it out, [`owner`] finds the objects' owner.

pub mod controller;
pub mod owner;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use serde_json::json;

use crate::request;

pub const DRIVER_NAME_LABEL: &str = "csi.storage.k8s.io/drivername";
pub const MANAGED_BY_LABEL: &str = "csi.storage.k8s.io/managed-by";
/// The managed-by value of the central (controller) deployment.
pub const MANAGED_BY: &str = "external-provisioner";
/// The managed-by value of the objects of a `--node-deployment` instance on `node`, so that
/// each instance manages (and deletes as obsolete) only its own: upstream's
/// `getNameWithMaxLength("external-provisioner", node, 63)`.
pub fn node_managed_by(node: &str) -> String {
    const BASE: &str = MANAGED_BY;
    const MAX: usize = 63;
    let name = format!("{BASE}-{node}");
    if name.len() <= MAX {
        return name;
    }
    let base_length = MAX as isize - 10 - node.len() as isize;
    if base_length <= 0 {
        let prefix = &BASE[..BASE.len().min(MAX - 9)];
        let short = format!("{prefix}-{}", fnv32a(&name));
        return short[..short.len().min(MAX)].to_string();
    }
    let base_length = usize::try_from(base_length).unwrap_or_default();
    format!(
        "{}-{}-{node}",
        &BASE[..BASE.len().min(base_length)],
        fnv32a(BASE)
    )
}

/// Upstream's `hash`: FNV-1a 32 bit, as 8 hex digits.
fn fnv32a(text: &str) -> String {
    let hash = text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

/// Upstream's `generateName` for the objects.
const GENERATE_NAME: &str = "csisc-";

/// Topology keys and their values; empty for a driver without topology (matches every node).
pub type Segment = BTreeMap<String, String>;

/// One CSIStorageCapacity: a class in a segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    pub class: String,
    pub segment: Segment,
}

/// The segments of the driver: per CSINode that lists it, its topology keys with the values of
/// the Node's labels. A node missing one of the labels is left out until it has them.
pub fn segments<'a>(
    csi_nodes: impl IntoIterator<Item = &'a CSINode>,
    nodes: &HashMap<String, &'a Node>,
    driver: &str,
) -> BTreeSet<Segment> {
    let mut segments = BTreeSet::new();
    for csi_node in csi_nodes {
        let Some(entry) = csi_node.spec.drivers.iter().find(|d| d.name == driver) else {
            continue;
        };
        let Some(node) = nodes.get(&csi_node.name_any()) else {
            continue;
        };
        let labels = node.labels();
        let segment: Option<Segment> = entry
            .topology_keys
            .iter()
            .flatten()
            .map(|key| labels.get(key).map(|value| (key.clone(), value.clone())))
            .collect();
        if let Some(segment) = segment {
            segments.insert(segment);
        }
    }
    segments
}

/// Segments × the driver's classes; Immediate classes only when asked
/// (`--capacity-for-immediate-binding`).
pub fn items<'a>(
    segments: &BTreeSet<Segment>,
    classes: impl IntoIterator<Item = &'a StorageClass>,
    driver: &str,
    immediate_binding: bool,
) -> BTreeSet<Item> {
    let mut items = BTreeSet::new();
    for class in classes {
        if class.provisioner != driver {
            continue;
        }
        let delayed = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        if !delayed && !immediate_binding {
            continue;
        }
        for segment in segments {
            items.insert(Item {
                class: class.name_any(),
                segment: segment.clone(),
            });
        }
    }
    items
}

/// The item an object stands for: its class and the matchLabels of its node topology. An
/// object with matchExpressions was not written by a provisioner and stands for none.
pub fn item_of(object: &CSIStorageCapacity) -> Option<Item> {
    let topology = object.node_topology.clone().unwrap_or_default();
    if topology
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return None;
    }
    Some(Item {
        class: object.storage_class_name.clone(),
        segment: topology.match_labels.unwrap_or_default(),
    })
}

/// How the existing objects relate to the wanted items.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciliation {
    /// The object kept for each item that has one.
    pub existing: BTreeMap<Item, String>,
    /// Objects of no wanted item, and all but the oldest object of an item.
    pub obsolete: Vec<String>,
}

/// Matches objects (already filtered by our labels) to items.
pub fn reconcile(wanted: &BTreeSet<Item>, objects: &[&CSIStorageCapacity]) -> Reconciliation {
    let mut sorted = objects.to_vec();
    // Oldest first, so the survivor of duplicates is stable across passes.
    sorted.sort_by(|a, b| {
        let key = |o: &CSIStorageCapacity| (o.creation_timestamp().map(|t| t.0), o.name_any());
        key(a).cmp(&key(b))
    });
    let mut result = Reconciliation::default();
    for object in sorted {
        match item_of(object).filter(|item| wanted.contains(item)) {
            Some(item) if !result.existing.contains_key(&item) => {
                result.existing.insert(item, object.name_any());
            }
            _ => result.obsolete.push(object.name_any()),
        }
    }
    result
}

/// The items whose capacity a new or deleted PV changes: those whose segment is one of the
/// PV's node-affinity terms, else all items of its class.
pub fn affected_items(wanted: &BTreeSet<Item>, volume: &PersistentVolume) -> BTreeSet<Item> {
    let spec = volume.spec.clone().unwrap_or_default();
    let class = spec.storage_class_name.unwrap_or_default();
    let terms: Vec<Segment> = spec
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|term| {
            term.match_expressions
                .unwrap_or_default()
                .into_iter()
                .map(|e| match (e.operator.as_str(), e.values.as_deref()) {
                    ("In", Some([value])) => Some((e.key, value.clone())),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let of_class = wanted.iter().filter(|i| i.class == class);
    let by_topology: BTreeSet<Item> = of_class
        .clone()
        .filter(|i| terms.contains(&i.segment))
        .cloned()
        .collect();
    if by_topology.is_empty() {
        of_class.cloned().collect()
    } else {
        by_topology
    }
}

/// GetCapacity for an item. Unlike upstream (the class's parameters unfiltered and no
/// capability since v5.0), the driver gets what CreateVolume would get for the class: its
/// parameters without the `csi.storage.k8s.io/` keys, and a mount capability with the class's
/// fsType and mount options (ReadWriteOnce, the common case), so it can answer for the space
/// such volumes would take.
pub fn capacity_request(
    item: &Item,
    class: &StorageClass,
    default_fstype: &str,
) -> Result<csi::GetCapacityRequest, CapacityError> {
    let read_write_once = VolumeShape {
        access_modes: &["ReadWriteOnce".to_string()],
        volume_mode: None,
        single_node_multi_writer: false,
    };
    get_capacity_request(class, default_fstype, &read_write_once, &item.segment)
}

/// The volumes GetCapacity asks about: their access modes and volume mode, and whether the
/// driver can tell single-node writers apart.
#[derive(Debug, Clone, Copy)]
pub struct VolumeShape<'a> {
    pub access_modes: &'a [String],
    pub volume_mode: Option<&'a str>,
    pub single_node_multi_writer: bool,
}

/// GetCapacity for volumes of `shape` and `class` in `segment` (everywhere when empty), with
/// the capability and parameters CreateVolume would get.
pub fn get_capacity_request(
    class: &StorageClass,
    default_fstype: &str,
    shape: &VolumeShape<'_>,
    segment: &Segment,
) -> Result<csi::GetCapacityRequest, CapacityError> {
    let parameters = class.parameters.clone().unwrap_or_default();
    let fs_type = request::fs_type(&parameters, default_fstype)?;
    let capabilities = request::volume_capabilities(
        shape.access_modes,
        shape.volume_mode,
        &fs_type,
        &class.mount_options.clone().unwrap_or_default(),
        shape.single_node_multi_writer,
    )?;
    let parameters = csi_kinds::secrets::remove_reserved_parameters(&parameters)?;
    Ok(csi::GetCapacityRequest {
        volume_capabilities: capabilities,
        parameters: parameters.into_iter().collect(),
        accessible_topology: (!segment.is_empty()).then(|| csi::Topology {
            segments: segment.clone().into_iter().collect(),
        }),
    })
}

/// Why an item's capacity could not be published; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("storage class {0} is gone")]
    ClassGone(String),
    #[error(transparent)]
    Request(#[from] request::RequestError),
    #[error(transparent)]
    Parameters(#[from] csi_kinds::secrets::SecretsError),
    #[error("GetCapacity: {}", csi_grpc::conn::GoStatus(.0))]
    GetCapacity(tonic::Status),
    #[error("updating CSIStorageCapacity {name}: {source}")]
    Update { name: String, source: kube::Error },
    #[error("creating a CSIStorageCapacity: {0}")]
    Create(kube::Error),
    #[error("deleting the obsolete CSIStorageCapacity {name}: {source}")]
    Delete { name: String, source: kube::Error },
}

/// What GetCapacity said about an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub available: i64,
    pub maximum_volume_size: Option<i64>,
}

/// A new object for an item (the server picks the name from `csisc-`).
pub fn new_object(
    item: &Item,
    namespace: &str,
    driver: &str,
    managed_by: &str,
    capacity: Capacity,
    owner: Option<&OwnerReference>,
) -> CSIStorageCapacity {
    let mut object: CSIStorageCapacity = serde_json::from_value(json!({
        "metadata": {
            "generateName": GENERATE_NAME,
            "namespace": namespace,
            "labels": {DRIVER_NAME_LABEL: driver, MANAGED_BY_LABEL: managed_by},
        },
        "storageClassName": item.class,
    }))
    .unwrap_or_default();
    object.node_topology = Some(LabelSelector {
        match_labels: Some(item.segment.clone()),
        match_expressions: None,
    });
    if let Some(owner) = owner {
        object.metadata.owner_references = Some(vec![owner.clone()]);
    }
    fill(&mut object, capacity);
    object
}

/// The object updated to `capacity` and owned by `owner` (an owner is added, never removed),
/// or `None` when it already is.
pub fn updated_object(
    existing: &CSIStorageCapacity,
    capacity: Capacity,
    owner: Option<&OwnerReference>,
) -> Option<CSIStorageCapacity> {
    let mut object = existing.clone();
    fill(&mut object, capacity);
    if let Some(owner) = owner {
        let owners = object
            .metadata
            .owner_references
            .get_or_insert_with(Vec::new);
        if !owners.iter().any(|o| o.uid == owner.uid) {
            owners.push(owner.clone());
        }
    }
    let same = |o: &CSIStorageCapacity| {
        (
            o.capacity.as_ref().map(bytes),
            o.maximum_volume_size.as_ref().map(bytes),
            o.metadata.owner_references.clone(),
        )
    };
    (same(&object) != same(existing)).then_some(object)
}

fn fill(object: &mut CSIStorageCapacity, capacity: Capacity) {
    object.capacity = Some(Quantity(csi_kinds::quantity::binary_si(capacity.available)));
    object.maximum_volume_size = capacity
        .maximum_volume_size
        .map(|m| Quantity(csi_kinds::quantity::binary_si(m)));
}

/// Quantities compared by value ("1Gi" and "1073741824" are the same capacity).
fn bytes(quantity: &Quantity) -> Option<u128> {
    csi_kinds::quantity::parse(&quantity.0)
}

#[cfg(test)]
mod tests;
