//! The secrets a VolumeSnapshotClass names (external-snapshotter `GetSecretReference`): the
//! snapshotter secret for CreateSnapshot/DeleteSnapshot, resolved by the snapshot-controller
//! when it makes a content and recorded in the content's deletion-secret annotations, and the
//! list secret for ListSnapshots, resolved by the sidecar. The CreateSnapshot parameters are
//! the class's parameters without these reserved keys.

use std::collections::{BTreeMap, HashMap};

use csi_kinds::names::{is_dns1123_label, is_dns1123_subdomain};
use csi_kinds::secrets::{PARAMETER_PREFIX, SecretRef, resolve_template};

use csi_kinds::snapshot::{DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE};

/// One pair of class keys naming a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretKeys {
    /// Upstream's label in messages.
    pub label: &'static str,
    pub name: &'static str,
    pub namespace: &'static str,
}

/// CreateSnapshot / DeleteSnapshot.
pub const SNAPSHOTTER: SecretKeys = SecretKeys {
    label: "Snapshotter",
    name: "csi.storage.k8s.io/snapshotter-secret-name",
    namespace: "csi.storage.k8s.io/snapshotter-secret-namespace",
};
/// ListSnapshots.
pub const SNAPSHOTTER_LIST: SecretKeys = SecretKeys {
    label: "SnapshotterList",
    name: "csi.storage.k8s.io/snapshotter-list-secret-name",
    namespace: "csi.storage.k8s.io/snapshotter-list-secret-namespace",
};
/// The group-snapshot pairs: reserved (stripped from parameters) though the group API is not
/// served here.
const GROUP_KEYS: [&str; 4] = [
    "csi.storage.k8s.io/group-snapshotter-secret-name",
    "csi.storage.k8s.io/group-snapshotter-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-get-secret-name",
    "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
];

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
        "cannot retrieve secrets for snapshot content {0:?}, err: secret name or namespace not specified"
    )]
    EmptyAnnotation(String),
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
/// snapshot is given. `None` when the class names none.
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
    let mut vars = BTreeMap::from([(
        "volumesnapshotcontent.name".to_string(),
        content_name.to_string(),
    )]);
    if let Some((namespace, _)) = snapshot {
        vars.insert("volumesnapshot.namespace".into(), namespace.to_string());
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
        vars.insert("volumesnapshot.name".into(), name.to_string());
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
        SNAPSHOTTER.name,
        SNAPSHOTTER.namespace,
        SNAPSHOTTER_LIST.name,
        SNAPSHOTTER_LIST.namespace,
    ];
    let mut kept = HashMap::new();
    for (key, value) in params {
        if !key.starts_with(PARAMETER_PREFIX) {
            kept.insert(key.clone(), value.clone());
        } else if !reserved.contains(&key.as_str()) && !GROUP_KEYS.contains(&key.as_str()) {
            return Err(SecretError::UnknownReservedKey(key.clone()));
        }
    }
    Ok(kept)
}

/// The secret recorded on a content (upstream `GetCredentialsFromAnnotation`): both
/// annotations or none; present but empty is an error.
pub fn annotated_secret(
    content_name: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Option<SecretRef>, SecretError> {
    match (
        annotations.get(DELETION_SECRET_NAME),
        annotations.get(DELETION_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
            Ok(Some(SecretRef {
                name: name.clone(),
                namespace: namespace.clone(),
            }))
        }
        (Some(_), Some(_)) => Err(SecretError::EmptyAnnotation(content_name.to_string())),
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
            annotated_secret("c", &both).unwrap(),
            Some(SecretRef {
                name: "s".into(),
                namespace: "ns".into()
            })
        );
        assert_eq!(annotated_secret("c", &params(&[])).unwrap(), None);
        let empty = params(&[
            (DELETION_SECRET_NAME, ""),
            (DELETION_SECRET_NAMESPACE, "ns"),
        ]);
        assert!(annotated_secret("c", &empty).is_err());
    }
}
