//! Strategic merge patch (`application/strategic-merge-patch+json`) as kube-apiserver applies
//! it to built-in kinds.
//!
//! The algorithm follows `StrategicMergeMapPatch` in
//! k8s.io/apimachinery/pkg/util/strategicpatch/patch.go (server side: parallel lists are
//! merged and nulls that match nothing are ignored). Upstream reads the `patchStrategy` /
//! `patchMergeKey` struct tags of the Go types by reflection; here the tags of the kinds
//! kube-sim serves are written down in a table (see [`Scope`]), checked against
//! k8s.io/api/core/v1/types.go, k8s.io/api/storage/v1/types.go and
//! k8s.io/apimachinery/pkg/apis/meta/v1/types.go.
//!
//! What is covered:
//! - maps merge recursively; a `null` value deletes the key;
//! - lists without a patch strategy are replaced by the patch's list;
//! - lists tagged `patchStrategy:"merge"` merge element by element on their merge key, lists
//!   of primitives tagged `merge` are unioned; the resulting order is upstream's
//!   (`mergeSlice` → `normalizeElementOrder` → `mergeSortedSlice`), which is *not* simply
//!   "keep the live order and append": patch items keep the patch's relative order, live-only
//!   items keep the live order, and a patch item the live list does not know is placed as soon
//!   as it is reached (so `finalizers: ["new"]` on `["old"]` gives `["new", "old"]`);
//! - directives: `$patch: replace|delete` in maps and list elements (`$patch: merge` is an
//!   error, as upstream), `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (the
//!   order is applied, as upstream) and `$retainKeys`.
//!
//! kube-apiserver decodes the merged map back into the typed object, which silently drops
//! unknown fields and turns explicit nulls into absent/zero fields. Values this module copies
//! verbatim from the patch (new keys, new list elements, replaced maps and lists) are cleaned
//! the same way: `$`-prefixed keys and null map entries are removed.

use serde_json::{Map, Value};

const DIRECTIVE_MARKER: &str = "$patch";
const DELETE_DIRECTIVE: &str = "delete";
const REPLACE_DIRECTIVE: &str = "replace";
const MERGE_DIRECTIVE: &str = "merge";
const DELETE_FROM_PRIMITIVE_LIST_PREFIX: &str = "$deleteFromPrimitiveList";
const SET_ELEMENT_ORDER_PREFIX: &str = "$setElementOrder";
const RETAIN_KEYS_DIRECTIVE: &str = "$retainKeys";

/// The media types kube-apiserver accepts for patches of custom resources
/// (k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go).
const CUSTOM_RESOURCE_PATCH_TYPES: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

/// Why a strategic merge patch could not be applied. [`StrategicMergeError::http_status`] and
/// [`StrategicMergeError::reason`] give the answer kube-apiserver sends for each kind of failure
/// (k8s.io/apiserver/pkg/endpoints/handlers/patch.go, `interpretStrategicMergePatchError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategicMergeError {
    /// The kind has no Go type to read patch metadata from (custom resources). kube-apiserver
    /// does not list the strategic-merge media type for them and answers 415
    /// UnsupportedMediaType. Holds the kind.
    #[error(
        "the body of the request was in an unknown format - accepted media types include: {CUSTOM_RESOURCE_PATCH_TYPES}"
    )]
    UnsupportedKind(String),
    /// Malformed patch document or malformed `$deleteFromPrimitiveList` / `$retainKeys` /
    /// `$setElementOrder` directive: 400 BadRequest.
    #[error("{0}")]
    BadRequest(String),
    /// Lists of lists: 422 with an empty reason.
    #[error("{0}")]
    Unprocessable(String),
    /// Any other failure (missing merge key, unknown `$patch` value, mismatched element types,
    /// ...). Upstream passes these errors through unwrapped, so the client sees 500 with
    /// reason `Unknown` and this message.
    #[error("{0}")]
    Invalid(String),
}

impl StrategicMergeError {
    /// The HTTP status kube-apiserver answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::UnsupportedKind(_) => 415,
            Self::BadRequest(_) => 400,
            Self::Unprocessable(_) => 422,
            Self::Invalid(_) => 500,
        }
    }

    /// The `reason` of the `metav1.Status` kube-apiserver answers with.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnsupportedKind(_) => "UnsupportedMediaType",
            Self::BadRequest(_) => "BadRequest",
            Self::Unprocessable(_) => "",
            Self::Invalid(_) => "Unknown",
        }
    }
}

type Result<T> = std::result::Result<T, StrategicMergeError>;

/// Whether strategic merge patch is available for `kind`: true for the built-in kinds
/// kube-sim serves, false for anything else (custom resources).
pub fn supports_kind(kind: &str) -> bool {
    Scope::root(kind).is_some()
}

/// Applies the strategic merge `patch` to `original`, an object of `kind`, and returns the
/// merged object. Neither input is modified.
pub fn apply_strategic_merge(kind: &str, original: &Value, patch: &Value) -> Result<Value> {
    let root =
        Scope::root(kind).ok_or_else(|| StrategicMergeError::UnsupportedKind(kind.to_string()))?;
    let patch = match patch {
        Value::Object(map) => map.clone(),
        // Go unmarshals `null` into a nil map: nothing to do.
        Value::Null => Map::new(),
        other => {
            return Err(StrategicMergeError::BadRequest(format!(
                "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                json_type(other)
            )));
        }
    };
    let original = match original {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(StrategicMergeError::Invalid(format!(
                "the object to patch is a {}, not a map",
                json_type(other)
            )));
        }
    };
    merge_map(original, patch, root, "").map(Value::Object)
}

// ---------------------------------------------------------------------------------------------
// Schema: the patch metadata of the built-in kinds.
// ---------------------------------------------------------------------------------------------

/// How a list field is patched: its `patchStrategy` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// No tag: the patch's list replaces the live one.
    Replace,
    /// `patchStrategy:"merge"` with this `patchMergeKey`; "" for lists of primitives.
    Merge(&'static str),
}

/// A Go struct type (or group of them) whose fields carry patch tags. Fields not in the table
/// have no tag and lead to [`Scope::Untagged`], below which nothing is merged by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Top level of a kind whose only tagged fields are in ObjectMeta (PersistentVolume,
    /// ConfigMap, Secret, Event, StorageClass, VolumeAttachment, CSIDriver,
    /// CSIStorageCapacity, Lease, CustomResourceDefinition).
    PlainRoot,
    PodRoot,
    NodeRoot,
    PersistentVolumeClaimRoot,
    NamespaceRoot,
    ServiceAccountRoot,
    CsiNodeRoot,
    ObjectMeta,
    PodSpec,
    /// core/v1 Container and EphemeralContainerCommon (same tags).
    Container,
    PodStatus,
    ContainerStatus,
    NodeSpec,
    NodeStatus,
    PersistentVolumeClaimStatus,
    NamespaceStatus,
    CsiNodeSpec,
    Untagged,
}

/// One tagged (or scope-changing) field: in `scope`, field `name` is patched with `strategy`
/// and its value (or each element of it) is described by `child`.
struct Field {
    scope: Scope,
    name: &'static str,
    strategy: Strategy,
    child: Scope,
}

const fn field(scope: Scope, name: &'static str, strategy: Strategy, child: Scope) -> Field {
    Field {
        scope,
        name,
        strategy,
        child,
    }
}

use Scope as S;
use Strategy::{Merge, Replace};

/// The patch tags, verified against upstream (kubernetes/api and kubernetes/apimachinery,
/// snapshot of July 2026). Untagged fields appear only to record that they were checked and
/// found untagged (they are replaced wholesale), or because they lead to a tagged struct.
const FIELDS: &[Field] = &[
    // meta/v1 ObjectMeta: `finalizers` patchStrategy=merge (no key: primitives),
    // `ownerReferences` patchStrategy=merge patchMergeKey=uid. `managedFields` has no tag.
    field(S::ObjectMeta, "finalizers", Merge(""), S::Untagged),
    field(S::ObjectMeta, "ownerReferences", Merge("uid"), S::Untagged),
    // Pod.
    field(S::PodRoot, "spec", Replace, S::PodSpec),
    field(S::PodRoot, "status", Replace, S::PodStatus),
    // core/v1 PodSpec. `volumes` and `resourceClaims` are "merge,retainKeys" (retainKeys only
    // matters when a client computes a patch). `tolerations` has NO tag: replaced wholesale.
    field(S::PodSpec, "volumes", Merge("name"), S::Untagged),
    field(S::PodSpec, "initContainers", Merge("name"), S::Container),
    field(S::PodSpec, "containers", Merge("name"), S::Container),
    field(
        S::PodSpec,
        "ephemeralContainers",
        Merge("name"),
        S::Container,
    ),
    field(S::PodSpec, "imagePullSecrets", Merge("name"), S::Untagged),
    field(S::PodSpec, "hostAliases", Merge("ip"), S::Untagged),
    field(
        S::PodSpec,
        "topologySpreadConstraints",
        Merge("topologyKey"),
        S::Untagged,
    ),
    field(S::PodSpec, "schedulingGates", Merge("name"), S::Untagged),
    field(S::PodSpec, "resourceClaims", Merge("name"), S::Untagged),
    field(S::PodSpec, "tolerations", Replace, S::Untagged),
    // core/v1 Container / EphemeralContainerCommon. `args`, `command`, `envFrom`,
    // `resizePolicy` have no tag.
    field(S::Container, "ports", Merge("containerPort"), S::Untagged),
    field(S::Container, "env", Merge("name"), S::Untagged),
    field(
        S::Container,
        "volumeMounts",
        Merge("mountPath"),
        S::Untagged,
    ),
    field(
        S::Container,
        "volumeDevices",
        Merge("devicePath"),
        S::Untagged,
    ),
    // core/v1 PodStatus. The container status lists themselves have no tag.
    field(S::PodStatus, "conditions", Merge("type"), S::Untagged),
    field(S::PodStatus, "hostIPs", Merge("ip"), S::Untagged),
    field(S::PodStatus, "podIPs", Merge("ip"), S::Untagged),
    field(
        S::PodStatus,
        "resourceClaimStatuses",
        Merge("name"),
        S::Untagged,
    ),
    field(
        S::PodStatus,
        "containerStatuses",
        Replace,
        S::ContainerStatus,
    ),
    field(
        S::PodStatus,
        "initContainerStatuses",
        Replace,
        S::ContainerStatus,
    ),
    field(
        S::PodStatus,
        "ephemeralContainerStatuses",
        Replace,
        S::ContainerStatus,
    ),
    // core/v1 ContainerStatus.
    field(
        S::ContainerStatus,
        "volumeMounts",
        Merge("mountPath"),
        S::Untagged,
    ),
    field(
        S::ContainerStatus,
        "allocatedResourcesStatus",
        Merge("name"),
        S::Untagged,
    ),
    // Node.
    field(S::NodeRoot, "spec", Replace, S::NodeSpec),
    field(S::NodeRoot, "status", Replace, S::NodeStatus),
    // core/v1 NodeSpec: `podCIDRs` patchStrategy=merge (primitives). `taints` has NO tag.
    field(S::NodeSpec, "podCIDRs", Merge(""), S::Untagged),
    field(S::NodeSpec, "taints", Replace, S::Untagged),
    // core/v1 NodeStatus: `conditions` and `addresses` merge on `type`; `volumesAttached`,
    // `volumesInUse`, `images`, `runtimeHandlers` have NO tag.
    field(S::NodeStatus, "conditions", Merge("type"), S::Untagged),
    field(S::NodeStatus, "addresses", Merge("type"), S::Untagged),
    field(S::NodeStatus, "volumesAttached", Replace, S::Untagged),
    field(S::NodeStatus, "volumesInUse", Replace, S::Untagged),
    // PersistentVolumeClaim: core/v1 PersistentVolumeClaimStatus `conditions` merge on `type`.
    // (PersistentVolumeStatus has no conditions and no tags; PersistentVolume is PlainRoot.)
    field(
        S::PersistentVolumeClaimRoot,
        "status",
        Replace,
        S::PersistentVolumeClaimStatus,
    ),
    field(
        S::PersistentVolumeClaimStatus,
        "conditions",
        Merge("type"),
        S::Untagged,
    ),
    // Namespace: core/v1 NamespaceStatus `conditions` merge on `type`; NamespaceSpec
    // `finalizers` has NO tag (unlike metadata.finalizers).
    field(S::NamespaceRoot, "status", Replace, S::NamespaceStatus),
    field(S::NamespaceStatus, "conditions", Merge("type"), S::Untagged),
    // core/v1 ServiceAccount: `secrets` merge on `name`; its `imagePullSecrets` has NO tag.
    field(S::ServiceAccountRoot, "secrets", Merge("name"), S::Untagged),
    // storage/v1 CSINodeSpec: `drivers` merge on `name`.
    field(S::CsiNodeRoot, "spec", Replace, S::CsiNodeSpec),
    field(S::CsiNodeSpec, "drivers", Merge("name"), S::Untagged),
];

impl Scope {
    /// The top-level scope of a built-in kind; `None` for kinds kube-apiserver has no Go type
    /// for. Event (core/v1 and events.k8s.io/v1), ConfigMap, Secret, PersistentVolume and the
    /// storage/coordination/apiextensions kinds have no tags outside ObjectMeta (checked).
    fn root(kind: &str) -> Option<Self> {
        Some(match kind {
            "Pod" => S::PodRoot,
            "Node" => S::NodeRoot,
            "PersistentVolumeClaim" => S::PersistentVolumeClaimRoot,
            "Namespace" => S::NamespaceRoot,
            "ServiceAccount" => S::ServiceAccountRoot,
            "CSINode" => S::CsiNodeRoot,
            "PersistentVolume"
            | "ConfigMap"
            | "Secret"
            | "Event"
            | "StorageClass"
            | "VolumeAttachment"
            | "CSIDriver"
            | "CSIStorageCapacity"
            | "Lease"
            | "CustomResourceDefinition" => S::PlainRoot,
            _ => return None,
        })
    }

    fn is_root(self) -> bool {
        matches!(
            self,
            S::PlainRoot
                | S::PodRoot
                | S::NodeRoot
                | S::PersistentVolumeClaimRoot
                | S::NamespaceRoot
                | S::ServiceAccountRoot
                | S::CsiNodeRoot
        )
    }

    /// The strategy of field `name` in this scope and the scope of its value.
    fn field(self, name: &str) -> (Strategy, Scope) {
        if self.is_root() && name == "metadata" {
            return (Replace, S::ObjectMeta);
        }
        FIELDS
            .iter()
            .find(|f| f.scope == self && f.name == name)
            .map_or((Replace, S::Untagged), |f| (f.strategy, f.child))
    }
}

// ---------------------------------------------------------------------------------------------
// Maps.
// ---------------------------------------------------------------------------------------------

/// Merges `patch` into `original` (upstream `mergeMap`). `path` names the map for messages.
fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    scope: Scope,
    path: &str,
) -> Result<Map<String, Value>> {
    if let Some(directive) = patch.get(DIRECTIVE_MARKER) {
        return match directive.as_str() {
            // The patch's map (minus the marker) stands for the whole map.
            Some(REPLACE_DIRECTIVE) => {
                patch.remove(DIRECTIVE_MARKER);
                Ok(strip_map(patch))
            }
            Some(DELETE_DIRECTIVE) => Ok(Map::new()),
            _ => Err(bad_patch_type(directive, &patch)),
        };
    }

    apply_retain_keys(&mut original, &mut patch)?;
    apply_set_element_order(&mut original, &mut patch, scope, path)?;

    // Upstream walks the patch in Go's random map order. Deletion lists go first here so the
    // outcome is deterministic; generated patches never name an item in both lists.
    let mut keys: Vec<String> = patch.keys().cloned().collect();
    keys.sort_by_key(|k| !k.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX));

    for key in keys {
        let Some(patch_value) = patch.remove(&key) else {
            continue;
        };
        let (name, delete_list) = if key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX) {
            (extract_key(&key, DELETE_FROM_PRIMITIVE_LIST_PREFIX)?, true)
        } else {
            (key, false)
        };
        // Any other `$` key is no field of a built-in type: the typed decode would drop it.
        if !delete_list && name.starts_with('$') {
            continue;
        }
        if patch_value.is_null() {
            original.remove(&name);
            continue;
        }
        let child_path = join(path, &name);
        let Some(slot) = original.get_mut(&name) else {
            // New field: take the patch's value, minus nulls and directives. A deletion list
            // for a missing field does nothing.
            if !delete_list && let Some(value) = clean_new_value(patch_value) {
                original.insert(name, value);
            }
            continue;
        };
        if json_type(slot) != json_type(&patch_value) {
            if delete_list {
                continue;
            }
            match clean_new_value(patch_value) {
                Some(value) => *slot = value,
                None => {
                    original.remove(&name);
                }
            }
            continue;
        }
        let (strategy, child) = scope.field(&name);
        let merged =
            match (std::mem::take(slot), patch_value) {
                (Value::Object(live), Value::Object(patch_map)) => Some(Value::Object(merge_map(
                    live,
                    patch_map,
                    child,
                    &child_path,
                )?)),
                (Value::Array(live), Value::Array(patch_list)) => Some(Value::Array(
                    merge_list_field(live, patch_list, strategy, child, delete_list, &child_path)?,
                )),
                (_, scalar) => clean_new_value(scalar),
            };
        match merged {
            Some(value) => *slot = value,
            None => {
                original.remove(&name);
            }
        }
    }
    Ok(original)
}

/// `$retainKeys: [..]` (upstream `applyRetainKeysDirective`): live keys not listed are
/// cleared, and every non-null key of the patch must be listed.
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<()> {
    let Some(retain) = patch.remove(RETAIN_KEYS_DIRECTIVE) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(bad_retain_keys());
    };
    let listed = |key: &str| retain.iter().any(|v| v.as_str() == Some(key));
    for (key, value) in patch.iter() {
        if value.is_null()
            || key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
            || key.starts_with(SET_ELEMENT_ORDER_PREFIX)
        {
            continue;
        }
        if !listed(key) {
            return Err(bad_retain_keys());
        }
    }
    original.retain(|key, _| listed(key));
    Ok(())
}

/// `$setElementOrder/<field>: [..]` (upstream `mergePatchIntoOriginal`): merges the field's
/// patch list now and orders the result by the directive, then by the live list.
fn apply_set_element_order(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    scope: Scope,
    path: &str,
) -> Result<()> {
    let keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER_PREFIX))
        .cloned()
        .collect();
    for key in keys {
        let Some(order) = patch.remove(&key) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(bad_arg("[]interface {}", &order));
        };
        let name = extract_key(&key, SET_ELEMENT_ORDER_PREFIX)?;
        let live = match original.get(&name) {
            None => None,
            Some(Value::Array(list)) => Some(list.clone()),
            Some(other) => return Err(bad_arg("[]interface {}", other)),
        };
        let patched = match patch.get(&name) {
            None => None,
            Some(Value::Array(list)) => Some(list.clone()),
            Some(other) => return Err(bad_arg("[]interface {}", other)),
        };
        let (strategy, child) = scope.field(&name);
        let merge_key = match strategy {
            Merge(key) => key,
            Replace => "",
        };
        validate_patch_with_set_order(patched.as_deref().unwrap_or_default(), &order, merge_key)?;

        let live_list = live.clone().unwrap_or_default();
        let patch_list = patched.clone().unwrap_or_default();
        let merged = match (live, patched) {
            (Some(live), None) => live,
            (None, Some(patched)) => match clean_new_value(Value::Array(patched)) {
                Some(Value::Array(list)) => list,
                _ => continue,
            },
            (Some(live), Some(patched)) => {
                merge_list_field(live, patched, strategy, child, false, &join(path, &name))?
            }
            (None, None) => continue,
        };
        let (patch_items, server_only) = if merge_key.is_empty() {
            partition_primitives(merged, &order)
        } else {
            partition_maps(merged, &order, merge_key)?
        };
        let kind = element_kind(&live_list, &patch_list)?;
        let ordered = normalize_element_order(
            patch_items,
            server_only,
            &order,
            &live_list,
            merge_key,
            kind,
        )?;
        original.insert(name.clone(), Value::Array(ordered));
        patch.remove(&name);
    }
    Ok(())
}

/// Upstream `validatePatchWithSetOrderList`: the patch list's items (deletions aside) must
/// appear in the `$setElementOrder` list, in the same relative order.
fn validate_patch_with_set_order(
    patch_list: &[Value],
    order: &[Value],
    merge_key: &str,
) -> Result<()> {
    if patch_list.is_empty() || order.is_empty() {
        return Ok(());
    }
    let items: Vec<&Value> = if merge_key.is_empty() {
        patch_list.iter().collect()
    } else {
        let mut kept = Vec::new();
        for item in patch_list {
            let map = item
                .as_object()
                .ok_or_else(|| bad_arg("map[string]interface {}", item))?;
            if map.get(DIRECTIVE_MARKER).and_then(Value::as_str) != Some(DELETE_DIRECTIVE) {
                kept.push(item);
            }
        }
        kept
    };
    let (mut p, mut o) = (0, 0);
    while p < items.len() && o < order.len() {
        if items[p]
            .as_object()
            .is_some_and(|m| m.contains_key(DIRECTIVE_MARKER))
        {
            p += 1;
            continue;
        }
        if merge_key_value_equal(items[p], &order[o], merge_key)? {
            p += 1;
        }
        o += 1;
    }
    if p < items.len() {
        return Err(StrategicMergeError::Invalid(format!(
            "The order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER_PREFIX} list:\n{}\n",
            Value::Array(patch_list.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

fn merge_key_value_equal(left: &Value, right: &Value, merge_key: &str) -> Result<bool> {
    if merge_key.is_empty() {
        return Ok(left == right);
    }
    let l = left
        .as_object()
        .ok_or_else(|| bad_arg("map[string]interface {}", left))?;
    let r = right
        .as_object()
        .ok_or_else(|| bad_arg("map[string]interface {}", right))?;
    let lv = l.get(merge_key).ok_or_else(|| no_merge_key(l, merge_key))?;
    let rv = r.get(merge_key).ok_or_else(|| no_merge_key(r, merge_key))?;
    Ok(lv == rv)
}

// ---------------------------------------------------------------------------------------------
// Lists.
// ---------------------------------------------------------------------------------------------

/// Upstream `mergeSliceHandler`: merge lists (and any `$deleteFromPrimitiveList`) go through
/// [`merge_list`]; any other list is replaced by the patch's.
fn merge_list_field(
    live: Vec<Value>,
    patch: Vec<Value>,
    strategy: Strategy,
    child: Scope,
    delete_list: bool,
    path: &str,
) -> Result<Vec<Value>> {
    match strategy {
        Merge(key) => merge_list(live, patch, child, key, delete_list, path),
        Replace if delete_list => merge_list(live, patch, child, "", true, path),
        Replace => Ok(patch.into_iter().map(strip_value).collect()),
    }
}

/// Upstream `mergeSlice`.
fn merge_list(
    live: Vec<Value>,
    patch: Vec<Value>,
    child: Scope,
    merge_key: &str,
    delete_list: bool,
    path: &str,
) -> Result<Vec<Value>> {
    if live.is_empty() && patch.is_empty() {
        return Ok(live);
    }
    let kind = element_kind(&live, &patch)?;
    if kind != JsonType::Object {
        if delete_list {
            return Ok(live.into_iter().filter(|v| !patch.contains(v)).collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(live.len() + patch.len());
        for item in live.iter().chain(patch.iter()) {
            if !merged.contains(item) {
                merged.push(item.clone());
            }
        }
        let (patch_items, server_only) = partition_primitives(merged, &patch);
        return normalize_element_order(patch_items, server_only, &patch, &live, "", kind);
    }
    if merge_key.is_empty() {
        return Err(StrategicMergeError::Invalid(format!(
            "cannot merge lists without merge key for {path}"
        )));
    }
    let (live, patch) = apply_list_directives(live, patch, merge_key)?;
    let merged = merge_by_key(live.clone(), &patch, merge_key, child, path)?;
    let (patch_items, server_only) = partition_maps(merged, &patch, merge_key)?;
    normalize_element_order(patch_items, server_only, &patch, &live, merge_key, kind)
}

/// Upstream `mergeSliceWithSpecialElements`: handles elements carrying `$patch`. Returns the
/// live list after deletions (or the replacement list) and the remaining patch elements.
fn apply_list_directives(
    mut live: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut rest = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let map = item
            .as_object()
            .ok_or_else(|| bad_arg("map[string]interface {}", &item))?;
        let Some(directive) = map.get(DIRECTIVE_MARKER) else {
            rest.push(item);
            continue;
        };
        match directive.as_str() {
            Some(DELETE_DIRECTIVE) => {
                let key_value = map
                    .get(merge_key)
                    .ok_or_else(|| no_merge_key(map, merge_key))?;
                live.retain(|v| v.get(merge_key) != Some(key_value));
            }
            // Other `$patch` elements are still checked, so keep going.
            Some(REPLACE_DIRECTIVE) => replace = true,
            Some(MERGE_DIRECTIVE) => {
                return Err(StrategicMergeError::Invalid(
                    "merging lists cannot yet be specified in the patch".to_string(),
                ));
            }
            _ => return Err(bad_patch_type(directive, map)),
        }
    }
    if replace {
        return Ok((rest.into_iter().map(strip_value).collect(), Vec::new()));
    }
    Ok((live, rest))
}

/// Upstream `mergeSliceWithoutSpecialElements`: each patch element merges into the live
/// element with the same merge-key value, or is appended.
fn merge_by_key(
    mut live: Vec<Value>,
    patch: &[Value],
    merge_key: &str,
    child: Scope,
    path: &str,
) -> Result<Vec<Value>> {
    for item in patch {
        let map = item
            .as_object()
            .ok_or_else(|| bad_arg("map[string]interface {}", item))?;
        let key_value = map
            .get(merge_key)
            .ok_or_else(|| no_merge_key(map, merge_key))?;
        match find_by_key(&live, merge_key, key_value)? {
            Some(index) => {
                let current = match std::mem::take(&mut live[index]) {
                    Value::Object(current) => current,
                    _ => Map::new(),
                };
                live[index] = Value::Object(merge_map(current, map.clone(), child, path)?);
            }
            None => live.push(strip_value(item.clone())),
        }
    }
    Ok(live)
}

/// Upstream `findMapInSliceBasedOnKeyValue`.
fn find_by_key(list: &[Value], merge_key: &str, key_value: &Value) -> Result<Option<usize>> {
    for (index, item) in list.iter().enumerate() {
        let map = item.as_object().ok_or_else(|| {
            StrategicMergeError::Invalid(format!("value for key {index} is not a map"))
        })?;
        if map.get(merge_key) == Some(key_value) {
            return Ok(Some(index));
        }
    }
    Ok(None)
}

/// Splits primitives into those present in `by` and the others, keeping their order.
fn partition_primitives(list: Vec<Value>, by: &[Value]) -> (Vec<Value>, Vec<Value>) {
    list.into_iter().partition(|v| by.contains(v))
}

/// Splits maps into those whose merge-key value appears in `by` and the others.
fn partition_maps(
    list: Vec<Value>,
    by: &[Value],
    merge_key: &str,
) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut present = Vec::new();
    let mut absent = Vec::new();
    for item in list {
        let map = item
            .as_object()
            .ok_or_else(|| bad_arg("map[string]interface {}", &item))?;
        let key_value = map
            .get(merge_key)
            .ok_or_else(|| no_merge_key(map, merge_key))?;
        if find_by_key(by, merge_key, key_value)?.is_some() {
            present.push(item);
        } else {
            absent.push(item);
        }
    }
    Ok((present, absent))
}

/// Upstream `normalizeElementOrder`: patch items in the patch's order, live-only items in the
/// live order, then interleaved by [`merge_sorted`].
fn normalize_element_order(
    patch_items: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: &str,
    kind: JsonType,
) -> Result<Vec<Value>> {
    let patch_items = sort_by_order(patch_items, patch_order, merge_key, kind)?;
    let server_only = sort_by_order(server_only, server_order, merge_key, kind)?;
    Ok(merge_sorted(
        server_only,
        patch_items,
        server_order,
        merge_key,
        kind,
    ))
}

/// Upstream `normalizeSliceOrder`: a stable sort by position in `order`; `$patch: delete`
/// elements go last. (Upstream's comparator is not a strict order for items missing from
/// `order`; they cannot occur on the paths that call this, and are kept last here.)
fn sort_by_order(
    items: Vec<Value>,
    order: &[Value],
    merge_key: &str,
    kind: JsonType,
) -> Result<Vec<Value>> {
    let (items, deletions) = if kind == JsonType::Object {
        for item in items.iter().chain(order.iter()) {
            let map = item
                .as_object()
                .ok_or_else(|| bad_arg("map[string]interface {}", item))?;
            if !map.contains_key(merge_key) {
                return Err(no_merge_key(map, merge_key));
            }
        }
        items.into_iter().partition(|v| {
            v.get(DIRECTIVE_MARKER).and_then(Value::as_str) != Some(DELETE_DIRECTIVE)
        })
    } else {
        (items, Vec::new())
    };
    let mut keyed: Vec<(usize, Value)> = items
        .into_iter()
        .map(|v| {
            (
                position(order, &v, merge_key, kind).unwrap_or(usize::MAX),
                v,
            )
        })
        .collect();
    keyed.sort_by_key(|(p, _)| *p);
    let mut sorted: Vec<Value> = keyed.into_iter().map(|(_, v)| v).collect();
    sorted.extend(deletions);
    Ok(sorted)
}

/// Upstream `mergeSortedSlice`: interleaves live-only items (`left`) into patch items
/// (`right`). A live-only item goes first only when both it and the next patch item are in the
/// live list and it came earlier there; otherwise the patch item goes first.
fn merge_sorted(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    merge_key: &str,
    kind: JsonType,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => match (
                position(server_order, l, merge_key, kind),
                position(server_order, r, merge_key, kind),
            ) {
                (Some(li), Some(ri)) => li < ri,
                _ => false,
            },
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// Upstream `index`: the position of `item` in `list`, comparing merge-key values for maps.
fn position(list: &[Value], item: &Value, merge_key: &str, kind: JsonType) -> Option<usize> {
    if kind == JsonType::Object {
        let wanted = item.get(merge_key);
        list.iter().position(|v| v.get(merge_key) == wanted)
    } else {
        list.iter().position(|v| v == item)
    }
}

/// Upstream `sliceElementType`: all elements of both lists must have one JSON type, and not
/// be lists.
fn element_kind(live: &[Value], patch: &[Value]) -> Result<JsonType> {
    let mut kind = None;
    for item in live.iter().chain(patch.iter()) {
        let this = json_type(item);
        match kind {
            None if this == JsonType::Array => {
                return Err(StrategicMergeError::Unprocessable(
                    "lists of lists are not supported".to_string(),
                ));
            }
            None => kind = Some(this),
            Some(k) if k != this => {
                return Err(StrategicMergeError::Invalid(format!(
                    "list element types are not identical: {} {}",
                    Value::Array(live.to_vec()),
                    Value::Array(patch.to_vec())
                )));
            }
            Some(_) => {}
        }
    }
    kind.ok_or_else(|| {
        StrategicMergeError::Invalid("no elements in any of the given slices".to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// Cleaning values copied from the patch.
// ---------------------------------------------------------------------------------------------

/// A value new to the object (upstream `discardNullValuesFromPatch` + `removeDirectives`):
/// maps carrying `$patch` are dropped entirely, null map entries are dropped, and remaining
/// `$` keys are dropped as the typed decode would. `None`: the value itself is dropped.
fn clean_new_value(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) => {
            if map.get(DIRECTIVE_MARKER).is_some_and(|d| !d.is_null()) {
                return None;
            }
            let mut out = Map::new();
            for (key, item) in map {
                if item.is_null() || key.starts_with('$') {
                    continue;
                }
                if let Some(item) = clean_new_value(item) {
                    out.insert(key, item);
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(list) => Some(Value::Array(
            list.into_iter().filter_map(clean_new_value).collect(),
        )),
        scalar => Some(scalar),
    }
}

/// A value upstream copies verbatim: only what the typed decode would drop is removed (`$`
/// keys, null map entries).
fn strip_value(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(strip_map(map)),
        Value::Array(list) => Value::Array(list.into_iter().map(strip_value).collect()),
        scalar => scalar,
    }
}

fn strip_map(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, v)| !v.is_null() && !k.starts_with('$'))
        .map(|(k, v)| (k, strip_value(v)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers and upstream's error texts (k8s.io/apimachinery/pkg/util/mergepatch/errors.go).
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonType {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn json_type(value: &Value) -> JsonType {
    match value {
        Value::Null => JsonType::Null,
        Value::Bool(_) => JsonType::Bool,
        Value::Number(_) => JsonType::Number,
        Value::String(_) => JsonType::String,
        Value::Array(_) => JsonType::Array,
        Value::Object(_) => JsonType::Object,
    }
}

/// The Go type name upstream's messages use for a decoded JSON value.
fn go_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

impl std::fmt::Display for JsonType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JsonType::Null => "null",
            JsonType::Bool => "bool",
            JsonType::Number => "number",
            JsonType::String => "string",
            JsonType::Array => "array",
            JsonType::Object => "object",
        })
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Upstream `extractKey`: `<prefix>/<field>` → `<field>`.
fn extract_key(key: &str, prefix: &str) -> Result<String> {
    match key.split_once('/') {
        Some((head, field)) if head == prefix => Ok(field.to_string()),
        _ if prefix == DELETE_FROM_PRIMITIVE_LIST_PREFIX => Err(StrategicMergeError::BadRequest(
            "invalid patch format of primitive list".to_string(),
        )),
        _ => Err(StrategicMergeError::BadRequest(
            "invalid patch format of setElementOrder list".to_string(),
        )),
    }
}

fn bad_retain_keys() -> StrategicMergeError {
    StrategicMergeError::BadRequest("invalid patch format of retainKeys".to_string())
}

fn no_merge_key(map: &Map<String, Value>, merge_key: &str) -> StrategicMergeError {
    StrategicMergeError::Invalid(format!(
        "map: {} does not contain declared merge key: {merge_key}",
        Value::Object(map.clone())
    ))
}

fn bad_arg(expected: &str, actual: &Value) -> StrategicMergeError {
    StrategicMergeError::Invalid(format!(
        "expected a {expected}, but received a {}",
        go_type(actual)
    ))
}

fn bad_patch_type(directive: &Value, map: &Map<String, Value>) -> StrategicMergeError {
    let shown = directive
        .as_str()
        .map_or_else(|| directive.to_string(), str::to_string);
    StrategicMergeError::Invalid(format!(
        "unknown patch type: {shown} in map: {}",
        Value::Object(map.clone())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The expected outcome of a case: the merged object, or the HTTP status of the error.
    enum Want {
        Ok(Value),
        Status(u16),
    }

    struct Case {
        name: &'static str,
        kind: &'static str,
        original: Value,
        patch: Value,
        want: Want,
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn cases() -> Vec<Case> {
        vec![
            Case {
                name: "maps merge recursively and null deletes a key",
                kind: "ConfigMap",
                original: json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}, "annotations": {"x": "y"}}, "data": {"k": "v"}}),
                patch: json!({"metadata": {"labels": {"a": "10", "b": null, "c": "3"}, "annotations": null}, "data": {"n": "m"}}),
                want: Want::Ok(
                    json!({"metadata": {"name": "c", "labels": {"a": "10", "c": "3"}}, "data": {"k": "v", "n": "m"}}),
                ),
            },
            Case {
                name: "nested null deletes and unmatched nulls are ignored",
                kind: "Pod",
                original: pod(json!({"nodeSelector": {"zone": "a", "disk": "ssd"}})),
                patch: json!({"spec": {"nodeSelector": {"disk": null, "absent": null}, "priorityClassName": null, "hostname": "h"}}),
                want: Want::Ok(pod(json!({"nodeSelector": {"zone": "a"}, "hostname": "h"}))),
            },
            Case {
                name: "a new map keeps no nulls and no directives",
                kind: "Pod",
                original: pod(json!({})),
                patch: json!({"spec": {"securityContext": {"runAsUser": 1, "fsGroup": null, "seLinuxOptions": {"$patch": "replace", "user": "u"}}}}),
                want: Want::Ok(pod(json!({"securityContext": {"runAsUser": 1}}))),
            },
            Case {
                name: "untagged list (tolerations) is replaced",
                kind: "Pod",
                original: pod(
                    json!({"tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]}),
                ),
                patch: json!({"spec": {"tolerations": [{"key": "c", "operator": "Exists"}]}}),
                want: Want::Ok(pod(
                    json!({"tolerations": [{"key": "c", "operator": "Exists"}]}),
                )),
            },
            Case {
                name: "node taints have no strategy and are replaced",
                kind: "Node",
                original: json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}),
                patch: json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}}),
                want: Want::Ok(json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})),
            },
            Case {
                name: "node volumesInUse has no strategy and is replaced",
                kind: "Node",
                original: json!({"status": {"volumesInUse": ["v1", "v2"]}}),
                patch: json!({"status": {"volumesInUse": ["v3"]}}),
                want: Want::Ok(json!({"status": {"volumesInUse": ["v3"]}})),
            },
            Case {
                name: "merge list by key: update an element and insert one",
                kind: "Pod",
                original: pod(
                    json!({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}]}),
                ),
                patch: json!({"spec": {"volumes": [{"name": "a", "emptyDir": {"medium": "Memory"}}, {"name": "c", "configMap": {"name": "cm"}}]}}),
                // Upstream order: `c` is unknown to the live list, so it is placed before `b`.
                want: Want::Ok(pod(json!({"volumes": [
                    {"name": "a", "emptyDir": {"medium": "Memory"}},
                    {"name": "c", "configMap": {"name": "cm"}},
                    {"name": "b", "emptyDir": {}},
                ]}))),
            },
            Case {
                name: "merge list by key: the patch's order wins for the items it names",
                kind: "Pod",
                original: pod(
                    json!({"volumes": [{"name": "1"}, {"name": "2", "x": "b"}, {"name": "3"}]}),
                ),
                patch: json!({"spec": {"volumes": [{"name": "3", "x": "c"}, {"name": "1", "x": "a"}]}}),
                want: Want::Ok(pod(
                    json!({"volumes": [{"name": "2", "x": "b"}, {"name": "3", "x": "c"}, {"name": "1", "x": "a"}]}),
                )),
            },
            Case {
                name: "merge list by key: $patch delete removes the element",
                kind: "Pod",
                original: pod(json!({"volumes": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
                patch: json!({"spec": {"volumes": [{"name": "b", "$patch": "delete"}]}}),
                want: Want::Ok(pod(json!({"volumes": [{"name": "a"}, {"name": "c"}]}))),
            },
            Case {
                name: "merge list: an empty patch list changes nothing",
                kind: "Pod",
                original: pod(json!({"volumes": [{"name": "a"}]})),
                patch: json!({"spec": {"volumes": []}}),
                want: Want::Ok(pod(json!({"volumes": [{"name": "a"}]}))),
            },
            Case {
                name: "finalizers are unioned without duplicates",
                kind: "Secret",
                original: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"finalizers": ["b", "c"]}}),
                want: Want::Ok(json!({"metadata": {"finalizers": ["a", "b", "c"]}})),
            },
            Case {
                name: "finalizers: a new item lands before later live items, as upstream",
                kind: "Secret",
                original: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {"finalizers": ["b", "d"]}}),
                want: Want::Ok(json!({"metadata": {"finalizers": ["a", "b", "d", "c"]}})),
            },
            Case {
                name: "finalizers: adding one to a list that lacks it puts it first",
                kind: "PersistentVolume",
                original: json!({"metadata": {"finalizers": ["kubernetes.io/pv-protection"]}}),
                patch: json!({"metadata": {"finalizers": ["example.com/mine"]}}),
                want: Want::Ok(
                    json!({"metadata": {"finalizers": ["example.com/mine", "kubernetes.io/pv-protection"]}}),
                ),
            },
            Case {
                name: "$deleteFromPrimitiveList/finalizers removes items",
                kind: "PersistentVolumeClaim",
                original: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "x"]}}),
                want: Want::Ok(json!({"metadata": {"finalizers": ["a", "c"]}})),
            },
            Case {
                name: "$deleteFromPrimitiveList of a missing list adds nothing",
                kind: "PersistentVolumeClaim",
                original: json!({"metadata": {"name": "c"}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
                want: Want::Ok(json!({"metadata": {"name": "c"}})),
            },
            Case {
                name: "$deleteFromPrimitiveList together with additions",
                kind: "PersistentVolumeClaim",
                original: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
                want: Want::Ok(json!({"metadata": {"finalizers": ["c", "b"]}})),
            },
            Case {
                name: "$patch replace on a map",
                kind: "Pod",
                original: pod(json!({"nodeSelector": {"a": "1", "b": "2"}})),
                patch: json!({"spec": {"nodeSelector": {"$patch": "replace", "c": "3"}}}),
                want: Want::Ok(pod(json!({"nodeSelector": {"c": "3"}}))),
            },
            Case {
                name: "$patch delete on a map empties it",
                kind: "Pod",
                original: pod(json!({"nodeSelector": {"a": "1"}})),
                patch: json!({"spec": {"nodeSelector": {"$patch": "delete"}}}),
                want: Want::Ok(pod(json!({"nodeSelector": {}}))),
            },
            Case {
                name: "$patch replace on a merge list",
                kind: "Pod",
                original: pod(
                    json!({"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "j"}]}),
                ),
                patch: json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "z", "image": "k"}]}}),
                want: Want::Ok(pod(json!({"containers": [{"name": "z", "image": "k"}]}))),
            },
            Case {
                name: "pod containers merge by name with nested env merge",
                kind: "Pod",
                original: pod(json!({"containers": [
                    {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], "args": ["x", "y"]},
                    {"name": "side", "image": "side:1"},
                ]})),
                patch: json!({"spec": {"containers": [
                    {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}, {"name": "A", "$patch": "delete"}], "args": ["z"]},
                ]}}),
                want: Want::Ok(pod(json!({"containers": [
                    {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}], "args": ["z"]},
                    {"name": "side", "image": "side:1"},
                ]}))),
            },
            Case {
                name: "container ports merge on containerPort and volumeMounts on mountPath",
                kind: "Pod",
                original: pod(
                    json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "protocol": "TCP"}], "volumeMounts": [{"name": "v", "mountPath": "/a"}]}]}),
                ),
                patch: json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}], "volumeMounts": [{"name": "w", "mountPath": "/a"}]}]}}),
                want: Want::Ok(pod(json!({"containers": [{"name": "c",
                    "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}],
                    "volumeMounts": [{"name": "w", "mountPath": "/a"}]}]}))),
            },
            Case {
                name: "node conditions merge by type",
                kind: "Node",
                original: json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "Starting"},
                    {"type": "MemoryPressure", "status": "False"},
                ]}}),
                patch: json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}, {"type": "DiskPressure", "status": "False"}]}}),
                want: Want::Ok(json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                    {"type": "DiskPressure", "status": "False"},
                    {"type": "MemoryPressure", "status": "False"},
                ]}})),
            },
            Case {
                name: "ownerReferences merge by uid",
                kind: "Event",
                original: json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}}),
                patch: json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}]}}),
                want: Want::Ok(
                    json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a", "controller": true}]}}),
                ),
            },
            Case {
                name: "$setElementOrder orders the merged list, live-only items stay near their neighbours",
                kind: "Pod",
                original: pod(
                    json!({"containers": [{"name": "1", "o": "a"}, {"name": "2"}, {"name": "9"}, {"name": "3"}, {"name": "4"}]}),
                ),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "2"}, {"name": "1"}, {"name": "4"}, {"name": "3"}],
                    "containers": [{"name": "4", "v": "4"}],
                }}),
                want: Want::Ok(pod(
                    json!({"containers": [{"name": "2"}, {"name": "1", "o": "a"}, {"name": "9"}, {"name": "4", "v": "4"}, {"name": "3"}]}),
                )),
            },
            Case {
                name: "$setElementOrder on a primitive list",
                kind: "ConfigMap",
                original: json!({"metadata": {"finalizers": ["1", "2", "4"]}}),
                patch: json!({"metadata": {"$setElementOrder/finalizers": ["1", "2", "3"], "finalizers": ["3"]}}),
                want: Want::Ok(json!({"metadata": {"finalizers": ["1", "2", "3", "4"]}})),
            },
            Case {
                name: "$setElementOrder that contradicts the patch list",
                kind: "ConfigMap",
                original: json!({"metadata": {"finalizers": ["1"]}}),
                patch: json!({"metadata": {"$setElementOrder/finalizers": ["2", "3"], "finalizers": ["3", "2"]}}),
                want: Want::Status(500),
            },
            Case {
                name: "$setElementOrder with a $patch delete element",
                kind: "Pod",
                original: pod(json!({"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
                    "containers": [{"name": "b", "$patch": "delete"}, {"name": "c", "image": "x"}],
                }}),
                want: Want::Ok(pod(
                    json!({"containers": [{"name": "c", "image": "x"}, {"name": "a"}]}),
                )),
            },
            Case {
                name: "$setElementOrder on a live empty list with no patch list fails, as upstream",
                kind: "Secret",
                original: json!({"metadata": {"finalizers": []}}),
                patch: json!({"metadata": {"$setElementOrder/finalizers": ["a"]}}),
                want: Want::Status(500),
            },
            Case {
                name: "$deleteFromPrimitiveList also works on an untagged list (args)",
                kind: "Pod",
                original: pod(json!({"containers": [{"name": "a", "args": ["1", "2", "3"]}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "$deleteFromPrimitiveList/args": ["2"]}]}}),
                want: Want::Ok(pod(
                    json!({"containers": [{"name": "a", "args": ["1", "3"]}]}),
                )),
            },
            Case {
                name: "$patch delete element in a list merged on a numeric key",
                kind: "Pod",
                original: pod(
                    json!({"containers": [{"name": "a", "ports": [{"containerPort": 80}, {"containerPort": 81}]}]}),
                ),
                patch: json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 81, "$patch": "delete"}, {"containerPort": 82}]}]}}),
                want: Want::Ok(pod(
                    json!({"containers": [{"name": "a", "ports": [{"containerPort": 82}, {"containerPort": 80}]}]}),
                )),
            },
            Case {
                name: "a value of another type replaces the live one",
                kind: "Pod",
                original: pod(json!({"nodeSelector": null, "hostname": "x"})),
                patch: json!({"spec": {"nodeSelector": {"a": "1", "b": null}, "hostname": {"$patch": "delete"}}}),
                want: Want::Ok(pod(json!({"nodeSelector": {"a": "1"}}))),
            },
            Case {
                name: "top-level $patch replace",
                kind: "ConfigMap",
                original: json!({"metadata": {"name": "a"}, "data": {"x": "1"}}),
                patch: json!({"$patch": "replace", "metadata": {"name": "b"}}),
                want: Want::Ok(json!({"metadata": {"name": "b"}})),
            },
            Case {
                name: "$retainKeys clears unlisted live keys",
                kind: "Pod",
                original: pod(json!({"volumes": [{"name": "v", "emptyDir": {}}]})),
                patch: json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}}),
                want: Want::Ok(pod(
                    json!({"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}),
                )),
            },
            Case {
                name: "$retainKeys must list every patched key",
                kind: "Pod",
                original: pod(json!({"volumes": [{"name": "v", "emptyDir": {}}]})),
                patch: json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name"], "hostPath": {"path": "/x"}}]}}),
                want: Want::Status(400),
            },
            Case {
                name: "unknown $ keys are ignored",
                kind: "ConfigMap",
                original: json!({"data": {"a": "1"}}),
                patch: json!({"data": {"$unknown": "x", "b": "2"}}),
                want: Want::Ok(json!({"data": {"a": "1", "b": "2"}})),
            },
            Case {
                name: "custom resources are unsupported (415)",
                kind: "VolumeSnapshot",
                original: json!({"spec": {}}),
                patch: json!({"spec": {"a": 1}}),
                want: Want::Status(415),
            },
            Case {
                name: "merge key missing in a patch element",
                kind: "Pod",
                original: pod(json!({"containers": [{"name": "a"}]})),
                patch: json!({"spec": {"containers": [{"image": "x"}]}}),
                want: Want::Status(500),
            },
            Case {
                name: "$patch delete element without merge key",
                kind: "Node",
                original: json!({"status": {"conditions": [{"type": "Ready"}]}}),
                patch: json!({"status": {"conditions": [{"$patch": "delete"}]}}),
                want: Want::Status(500),
            },
            Case {
                name: "$patch merge in a map is rejected, as upstream",
                kind: "Pod",
                original: pod(json!({"nodeSelector": {"a": "1"}})),
                patch: json!({"spec": {"nodeSelector": {"$patch": "merge", "b": "2"}}}),
                want: Want::Status(500),
            },
            Case {
                name: "$patch merge in a list element is rejected, as upstream",
                kind: "Pod",
                original: pod(json!({"containers": [{"name": "a"}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
                want: Want::Status(500),
            },
            Case {
                name: "a patch that is not an object",
                kind: "Pod",
                original: pod(json!({})),
                patch: json!([{"op": "add"}]),
                want: Want::Status(400),
            },
            Case {
                name: "lists of lists",
                kind: "Secret",
                original: json!({"metadata": {"finalizers": [["a"]]}}),
                patch: json!({"metadata": {"finalizers": [["b"]]}}),
                want: Want::Status(422),
            },
            Case {
                name: "malformed $deleteFromPrimitiveList key",
                kind: "Secret",
                original: json!({"metadata": {"finalizers": ["a"]}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}),
                want: Want::Status(400),
            },
        ]
    }

    #[test]
    fn strategic_merge_cases() {
        for case in cases() {
            let got = apply_strategic_merge(case.kind, &case.original, &case.patch);
            match (&case.want, got) {
                (Want::Ok(want), Ok(got)) => assert_eq!(&got, want, "{}", case.name),
                (Want::Status(code), Err(err)) => {
                    assert_eq!(err.http_status(), *code, "{}: {err}", case.name)
                }
                (Want::Ok(_), Err(err)) => panic!("{}: unexpected error {err:?}", case.name),
                (Want::Status(code), Ok(got)) => {
                    panic!("{}: expected status {code}, got {got}", case.name)
                }
            }
        }
    }

    #[test]
    fn inputs_are_not_modified() {
        let original = pod(json!({"containers": [{"name": "a"}]}));
        let patch = json!({"spec": {"containers": [{"name": "b"}]}});
        let (o, p) = (original.clone(), patch.clone());
        apply_strategic_merge("Pod", &original, &patch).expect("patch applies");
        assert_eq!((original, patch), (o, p));
    }

    #[test]
    fn supported_kinds() {
        for kind in [
            "Pod",
            "Node",
            "PersistentVolume",
            "PersistentVolumeClaim",
            "Namespace",
            "Event",
            "ConfigMap",
            "Secret",
        ] {
            assert!(supports_kind(kind), "{kind}");
        }
        assert!(!supports_kind("VolumeSnapshot"));
        let err = apply_strategic_merge("VolumeSnapshot", &json!({}), &json!({}))
            .expect_err("unsupported");
        assert_eq!(
            err,
            StrategicMergeError::UnsupportedKind("VolumeSnapshot".into())
        );
        assert_eq!(err.reason(), "UnsupportedMediaType");
        assert!(err.to_string().contains("application/merge-patch+json"));
    }

    #[test]
    fn error_messages_follow_upstream() {
        let err = apply_strategic_merge(
            "Pod",
            &pod(json!({"containers": [{"name": "a"}]})),
            &json!({"spec": {"containers": [{"image": "x"}]}}),
        )
        .expect_err("missing merge key");
        assert_eq!(
            err.to_string(),
            r#"map: {"image":"x"} does not contain declared merge key: name"#
        );
        let err = apply_strategic_merge(
            "Pod",
            &pod(json!({"containers": [{"name": "a"}]})),
            &json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
        )
        .expect_err("merge directive in list");
        assert_eq!(
            err.to_string(),
            "merging lists cannot yet be specified in the patch"
        );
    }
}
