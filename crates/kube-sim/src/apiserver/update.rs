//! Update (PUT) of an object or of its status subresource; patches are stored through it too.

use std::sync::Arc;

use serde_json::Value;

use super::delete::after_removal;
use super::{Server, admission, key, objects, rbac_objects, schema, validation};
use crate::errors::ApiError;
use crate::resources::ResourceType;

/// Writes an update over the current object: optimistic concurrency on resourceVersion
/// (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts), then the
/// registry's update rules; an object being deleted whose last finalizer goes is removed
/// (k8s.io/apiserver/pkg/registry/generic/registry/store.go Update, deleteWithoutFinalizers).
pub(super) fn update(
    server: &Arc<Server>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    incoming: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    // Read before the commit, which holds the store: the class a resized claim names.
    let resizes_claim = rt.group.is_empty() && rt.kind == "PersistentVolumeClaim" && !status_only;
    let class = incoming["spec"]["storageClassName"]
        .as_str()
        .filter(|_| resizes_claim)
        .and_then(|class| {
            let classes = server
                .resource("storage.k8s.io", "v1", "storageclasses")
                .ok()?;
            server.store.get(&key(&classes, None, class))
        });
    let written = server.store.commit(&key(rt, ns, name), |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        if let Some(expected) = objects::expected_version(&incoming)
            && Some(expected) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let mut next = objects::prepare_update(rt, current, incoming, status_only)?;
        rbac_objects::default(rt, &mut next);
        validation::on_update(rt, current, &next)?;
        schema::apply(rt, &mut next, Some(current))?;
        if resizes_claim {
            admission::admit_claim_update(current, &next, class.as_deref())?;
        }
        if objects::is_deleting(&next) && objects::finalizers(&next).is_empty() && !is_pod_in_grace(rt, &next) {
            return Ok(None);
        }
        Ok(Some(next))
    })?;
    let written = written.map(|o| (*o).clone()).unwrap_or_default();
    if !objects::is_deleting(&written) || server.store.get(&key(rt, ns, name)).is_some() {
        return Ok(written);
    }
    after_removal(server, rt, &written);
    Ok(written)
}

/// A pod deleted with a grace period stays until the kubelet (or a grace-0 delete) removes it
/// (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination).
fn is_pod_in_grace(rt: &ResourceType, object: &Value) -> bool {
    rt.kind == "Pod"
        && object["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            > 0
}
