//! Writing a node's taints: a JSON patch guarded by the resourceVersion it was computed from
//! (the node lifecycle controller edits the same list), re-read and recomputed on a conflict.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

/// Attempts before giving up on a node others keep changing.
const ATTEMPTS: usize = 5;

/// Applies `change` to `node`'s taints (starting from the given, possibly cached, object);
/// `change` returns `None` when nothing is to be done. Returns whether a write happened.
pub async fn update_taints(
    api: &Api<Node>,
    mut node: Node,
    change: impl Fn(&[Taint]) -> Option<Vec<Taint>>,
) -> Result<bool, kube::Error> {
    let name = node.name_any();
    for _ in 0..ATTEMPTS {
        let Some(taints) = change(&crate::plan::taints(&node)) else {
            return Ok(false);
        };
        let patch = serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
            {"op": "add", "path": "/spec/taints", "value": taints},
        ]);
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        let params = PatchParams {
            field_manager: Some("podmon".to_string()),
            ..PatchParams::default()
        };
        match api.patch(&name, &params, &Patch::Json::<()>(patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {
                node = api.get(&name).await?;
            }
            Err(error) => return Err(error),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(
            &format!("node {name} kept changing while podmon updated its taints"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}
