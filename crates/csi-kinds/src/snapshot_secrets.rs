//! The secrets a VolumeSnapshotClass or VolumeGroupSnapshotClass names (external-snapshotter
//! `GetSecretReference`, `GetGroupSnapshotSecretReference`): the snapshotter secret for
//! CreateSnapshot/DeleteSnapshot (the group snapshotter secret for the group RPCs), resolved by
//! the snapshot-controller when it makes a content and recorded in the content's deletion-secret
//! annotations, and the list secret for ListSnapshots (the get secret for
//! GetVolumeGroupSnapshot), resolved by the sidecar. The create parameters are the class's
//! parameters without these reserved keys.

use std::collections::{BTreeMap, HashMap};

use crate::names::{is_dns1123_label, is_dns1123_subdomain};
use crate::secrets::{PARAMETER_PREFIX, SecretRef, resolve_template};

use crate::snapshot::{DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE};

/// One pair of class keys naming a secret, and the template variables they may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretKeys {
    /// Upstream's label in messages.
    pub label: &'static str,
    pub name: &'static str,
    pub namespace: &'static str,
    /// The content's name variable (`volumesnapshotcontent.name`).
    pub content_variable: &'static str,
    /// The prefix of the object's variables (`volumesnapshot` for `volumesnapshot.name`).
    pub object_variable: &'static str,
}

/// CreateSnapshot / DeleteSnapshot.
pub const SNAPSHOTTER: SecretKeys = SecretKeys {
    label: "Snapshotter",
    name: "csi.storage.k8s.io/snapshotter-secret-name",
    namespace: "csi.storage.k8s.io/snapshotter-secret-namespace",
    content_variable: "volumesnapshotcontent.name",
    object_variable: "volumesnapshot",
};
/// ListSnapshots.
pub const SNAPSHOTTER_LIST: SecretKeys = SecretKeys {
    label: "SnapshotterList",
    name: "csi.storage.k8s.io/snapshotter-list-secret-name",
    namespace: "csi.storage.k8s.io/snapshotter-list-secret-namespace",
    ..SNAPSHOTTER
};
/// CreateVolumeGroupSnapshot / DeleteVolumeGroupSnapshot.
pub const GROUP_SNAPSHOTTER: SecretKeys = SecretKeys {
    label: "GroupSnapshotter",
    name: "csi.storage.k8s.io/group-snapshotter-secret-name",
    namespace: "csi.storage.k8s.io/group-snapshotter-secret-namespace",
    content_variable: "volumegroupsnapshotcontent.name",
    object_variable: "volumegroupsnapshot",
};
/// GetVolumeGroupSnapshot.
pub const GROUP_SNAPSHOTTER_GET: SecretKeys = SecretKeys {
    label: "GroupSnapshotterGet",
    name: "csi.storage.k8s.io/group-snapshotter-get-secret-name",
    namespace: "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
    ..GROUP_SNAPSHOTTER
};

/// With `--extra-create-metadata`, CreateSnapshot gets these.
pub const SNAPSHOT_NAME_KEY: &str = "csi.storage.k8s.io/volumesnapshot/name";
pub const SNAPSHOT_NAMESPACE_KEY: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
pub const CONTENT_NAME_KEY: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "failed to get name and namespace template from params: either name and namespace for {0} secrets specified, Both must be specified"
    )]
    HalfPair(&'static str),
    #[error(
        "failed to get name and namespace template from params: {0} secrets specified in parameters but value of either namespace or name is empty"
    )]
    EmptyValue(&'static str),
    /// Upstream's "error resolving value ..." message.
    #[error("{0}")]
    Template(String),
    #[error("{}", invalid(template, resolved, "namespace"))]
    InvalidNamespace { template: String, resolved: String },
    #[error("{}", invalid(template, resolved, "secret"))]
    InvalidName { template: String, resolved: String },
    #[error(
        "failed to remove CSI Parameters of prefixed keys: found unknown parameter key \"{0}\" with reserved namespace {PARAMETER_PREFIX}"
    )]
    UnknownReservedKey(String),
    #[error(
        "cannot retrieve secrets for {kind} {content:?}, err: secret name or namespace not specified"
    )]
    EmptyAnnotation { kind: &'static str, content: String },
}

fn invalid(template: &str, resolved: &str, what: &str) -> String {
    if template == resolved {
        format!("{template:?} is not a valid {what} name")
    } else {
        format!("{template:?} resolved to {resolved:?} which is not a valid {what} name")
    }
}

/// The snapshot a template may name: `(namespace, name)`; absent for the list secret.
pub type SnapshotName<'a> = Option<(&'a str, &'a str)>;

/// The secret `keys` name in `params` for content `content_name`: `${volumesnapshotcontent.name}`
/// everywhere, `${volumesnapshot.namespace}` and (in the name) `${volumesnapshot.name}` when a
/// snapshot is given (the `volumegroupsnapshot` variables for the group keys). `None` when the
/// class names none.
pub fn secret_reference(
    keys: SecretKeys,
    params: &BTreeMap<String, String>,
    content_name: &str,
    snapshot: SnapshotName<'_>,
) -> Result<Option<SecretRef>, SecretError> {
    let (name_template, namespace_template) =
        match (params.get(keys.name), params.get(keys.namespace)) {
            (None, None) => return Ok(None),
            (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
                (name, namespace)
            }
            (Some(_), Some(_)) => return Err(SecretError::EmptyValue(keys.label)),
            _ => return Err(SecretError::HalfPair(keys.label)),
        };
    let mut vars = BTreeMap::from([(keys.content_variable.to_string(), content_name.to_string())]);
    if let Some((namespace, _)) = snapshot {
        vars.insert(
            format!("{}.namespace", keys.object_variable),
            namespace.to_string(),
        );
    }
    let resolve = |template: &String, vars: &BTreeMap<String, String>| {
        resolve_template(template, vars).map_err(|error| SecretError::Template(error.to_string()))
    };
    let namespace = resolve(namespace_template, &vars)?;
    if !is_dns1123_label(&namespace) {
        return Err(SecretError::InvalidNamespace {
            template: namespace_template.clone(),
            resolved: namespace,
        });
    }
    if let Some((_, name)) = snapshot {
        vars.insert(format!("{}.name", keys.object_variable), name.to_string());
    }
    let name = resolve(name_template, &vars)?;
    if !is_dns1123_subdomain(&name) {
        return Err(SecretError::InvalidName {
            template: name_template.clone(),
            resolved: name,
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// The class parameters CreateSnapshot gets: without the reserved keys, which are refused when
/// unknown (upstream `RemovePrefixedParameters`).
pub fn create_parameters(
    params: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, SecretError> {
    let reserved = [
        SNAPSHOTTER,
        SNAPSHOTTER_LIST,
        GROUP_SNAPSHOTTER,
        GROUP_SNAPSHOTTER_GET,
    ]
    .iter()
    .flat_map(|keys| [keys.name, keys.namespace])
    .collect::<Vec<_>>();
    let mut kept = HashMap::new();
    for (key, value) in params {
        if !key.starts_with(PARAMETER_PREFIX) {
            kept.insert(key.clone(), value.clone());
        } else if !reserved.contains(&key.as_str()) {
            return Err(SecretError::UnknownReservedKey(key.clone()));
        }
    }
    Ok(kept)
}

/// The annotations a content records its secret in, and its kind in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretAnnotations {
    pub kind: &'static str,
    pub name: &'static str,
    pub namespace: &'static str,
}

/// On a VolumeSnapshotContent.
pub const CONTENT_SECRET: SecretAnnotations = SecretAnnotations {
    kind: "snapshot content",
    name: DELETION_SECRET_NAME,
    namespace: DELETION_SECRET_NAMESPACE,
};
/// On a VolumeGroupSnapshotContent.
pub const GROUP_CONTENT_SECRET: SecretAnnotations = SecretAnnotations {
    kind: "group snapshot content",
    name: crate::groupsnapshot::DELETION_SECRET_NAME,
    namespace: crate::groupsnapshot::DELETION_SECRET_NAMESPACE,
};

/// The secret recorded on a content (upstream `GetCredentialsFromAnnotation`): both
/// annotations or none; present but empty is an error.
pub fn annotated_secret(
    keys: SecretAnnotations,
    content_name: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Option<SecretRef>, SecretError> {
    match (annotations.get(keys.name), annotations.get(keys.namespace)) {
        (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
            Ok(Some(SecretRef {
                name: name.clone(),
                namespace: namespace.clone(),
            }))
        }
        (Some(_), Some(_)) => Err(SecretError::EmptyAnnotation {
            kind: keys.kind,
            content: content_name.to_string(),
        }),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Class parameters, the snapshot `(namespace, name)`, and the `(name, namespace)` resolved
    /// or the error message.
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        Option<(&'a str, &'a str)>,
        Result<Option<(&'a str, &'a str)>, &'a str>,
    );

    #[test]
    fn snapshotter_secrets_resolve_as_upstream() {
        let cases: &[Case] = &[
            (&[], Some(("ns", "snap")), Ok(None)),
            (
                &[(SNAPSHOTTER.name, "s"), (SNAPSHOTTER.namespace, "ns1")],
                Some(("ns", "snap")),
                Ok(Some(("s", "ns1"))),
            ),
            (
                &[
                    (
                        SNAPSHOTTER.name,
                        "${volumesnapshot.name}-${volumesnapshotcontent.name}",
                    ),
                    (SNAPSHOTTER.namespace, "${volumesnapshot.namespace}"),
                ],
                Some(("team", "snap")),
                Ok(Some(("snap-snapcontent-1", "team"))),
            ),
            (
                &[(SNAPSHOTTER.name, "s")],
                Some(("ns", "snap")),
                Err(
                    "failed to get name and namespace template from params: either name and namespace for Snapshotter secrets specified, Both must be specified",
                ),
            ),
            (
                &[(SNAPSHOTTER.name, ""), (SNAPSHOTTER.namespace, "ns")],
                Some(("ns", "snap")),
                Err(
                    "failed to get name and namespace template from params: Snapshotter secrets specified in parameters but value of either namespace or name is empty",
                ),
            ),
            (
                &[(SNAPSHOTTER.name, "s"), (SNAPSHOTTER.namespace, "Bad_NS")],
                Some(("ns", "snap")),
                Err("\"Bad_NS\" is not a valid namespace name"),
            ),
            (
                &[
                    (SNAPSHOTTER.name, "s"),
                    (SNAPSHOTTER.namespace, "${volumesnapshot.name}"),
                ],
                Some(("ns", "snap")),
                Err(
                    "error resolving value \"${volumesnapshot.name}\": invalid tokens: [\"volumesnapshot.name\"]",
                ),
            ),
        ];
        for (pairs, snapshot, expected) in cases {
            let got = secret_reference(SNAPSHOTTER, &params(pairs), "snapcontent-1", *snapshot)
                .map(|r| r.map(|r| (r.name, r.namespace)))
                .map_err(|e| e.to_string());
            let expected = expected
                .map(|r| r.map(|(n, ns)| (n.to_string(), ns.to_string())))
                .map_err(str::to_string);
            assert_eq!(got, expected, "{pairs:?}");
        }
    }

    #[test]
    fn the_list_secret_knows_only_the_content_name() {
        let p = params(&[
            (SNAPSHOTTER_LIST.name, "${volumesnapshot.name}"),
            (SNAPSHOTTER_LIST.namespace, "ns"),
        ]);
        assert!(secret_reference(SNAPSHOTTER_LIST, &p, "c", None).is_err());
        let p = params(&[
            (SNAPSHOTTER_LIST.name, "list-${volumesnapshotcontent.name}"),
            (SNAPSHOTTER_LIST.namespace, "ns"),
        ]);
        assert_eq!(
            secret_reference(SNAPSHOTTER_LIST, &p, "c", None).unwrap(),
            Some(SecretRef {
                name: "list-c".into(),
                namespace: "ns".into()
            })
        );
    }

    #[test]
    fn group_secrets_resolve_the_group_variables() {
        let p = params(&[
            (
                GROUP_SNAPSHOTTER.name,
                "${volumegroupsnapshot.name}-${volumegroupsnapshotcontent.name}",
            ),
            (
                GROUP_SNAPSHOTTER.namespace,
                "${volumegroupsnapshot.namespace}",
            ),
        ]);
        assert_eq!(
            secret_reference(GROUP_SNAPSHOTTER, &p, "gc", Some(("team", "g"))).unwrap(),
            Some(SecretRef {
                name: "g-gc".into(),
                namespace: "team".into()
            })
        );
        // Member contents resolve it without the group, as upstream: its variables fail.
        assert!(secret_reference(GROUP_SNAPSHOTTER, &p, "gc", None).is_err());
        let snapshot_variables = params(&[
            (GROUP_SNAPSHOTTER.name, "${volumesnapshot.name}"),
            (GROUP_SNAPSHOTTER.namespace, "ns"),
        ]);
        assert!(
            secret_reference(
                GROUP_SNAPSHOTTER,
                &snapshot_variables,
                "gc",
                Some(("ns", "g"))
            )
            .is_err()
        );
        let empty = params(&[
            (GROUP_CONTENT_SECRET.name, ""),
            (GROUP_CONTENT_SECRET.namespace, "ns"),
        ]);
        assert_eq!(
            annotated_secret(GROUP_CONTENT_SECRET, "gc", &empty)
                .unwrap_err()
                .to_string(),
            "cannot retrieve secrets for group snapshot content \"gc\", err: secret name or namespace not specified"
        );
    }

    #[test]
    fn create_parameters_drop_reserved_keys_and_refuse_unknown_ones() {
        let p = params(&[
            ("type", "fast"),
            (SNAPSHOTTER.name, "s"),
            (SNAPSHOTTER.namespace, "ns"),
            ("csi.storage.k8s.io/group-snapshotter-secret-name", "g"),
        ]);
        assert_eq!(
            create_parameters(&p).unwrap(),
            HashMap::from([("type".to_string(), "fast".to_string())])
        );
        let bad = params(&[("csi.storage.k8s.io/fstype", "ext4")]);
        assert_eq!(
            create_parameters(&bad).unwrap_err().to_string(),
            "failed to remove CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/fstype\" with reserved namespace csi.storage.k8s.io/"
        );
    }

    #[test]
    fn annotated_secrets_need_both_values() {
        let both = params(&[
            (DELETION_SECRET_NAME, "s"),
            (DELETION_SECRET_NAMESPACE, "ns"),
        ]);
        assert_eq!(
            annotated_secret(CONTENT_SECRET, "c", &both).unwrap(),
            Some(SecretRef {
                name: "s".into(),
                namespace: "ns".into()
            })
        );
        assert_eq!(
            annotated_secret(CONTENT_SECRET, "c", &params(&[])).unwrap(),
            None
        );
        let empty = params(&[
            (DELETION_SECRET_NAME, ""),
            (DELETION_SECRET_NAMESPACE, "ns"),
        ]);
        assert!(annotated_secret(CONTENT_SECRET, "c", &empty).is_err());
    }
}
