//! StorageClass secret references, as external-provisioner resolves them
//! (`pkg/controller/controller.go`: `secretParamsMap`, `verifyAndGetSecretNameAndNamespaceTemplate`,
//! `getSecretReference`, `resolveTemplate`, `removePrefixedParameters`, `getCredentials`,
//! `handleSecretsForDeletion`).
//!
//! Everything here is pure: fetching a Secret's data is `csi_sidecar::secrets::fetch_secret_data`.
//! The resolver only handles references (names and namespaces); secret values exist only in
//! [`SecretData`], whose `Debug` output shows neither keys nor values.

use crate::names::{is_dns1123_label, is_dns1123_subdomain};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::{Secret, SecretReference};

/// StorageClass parameters with this prefix are meant for the sidecar and never reach the
/// driver; an unknown key with it is an error.
pub const PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";

/// The fsType parameter: reserved (stripped) but not a secret key.
pub const FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";

/// PV annotations that keep the provisioner secret for DeleteVolume, so deleting does not
/// depend on the StorageClass still existing (upstream PR #713, issue #330).
pub const DELETION_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";

/// PV annotations that carry the controller-modify secret to external-resizer (v6.2).
pub const MODIFY_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/controller-modify-secret-name";
pub const MODIFY_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";

/// The CSI calls a StorageClass can name a secret for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretKind {
    /// CreateVolume / DeleteVolume.
    Provisioner,
    ControllerPublish,
    NodeStage,
    NodePublish,
    ControllerExpand,
    NodeExpand,
    /// ControllerModifyVolume (VolumeAttributesClass).
    ControllerModify,
}

/// One set of StorageClass keys that name a secret: a [`SecretKind`]'s own pair, or the
/// default pair every kind falls back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretParams {
    Kind(SecretKind),
    Default,
}

/// The keys of one [`SecretParams`]: upstream's `secretParamsMap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamKeys {
    /// Upstream's name for the pair in error messages ("Provisioner", "Default", ...).
    pub label: &'static str,
    pub name: &'static str,
    pub namespace: &'static str,
    /// The deprecated un-prefixed `(name, namespace)` keys still accepted. They are not
    /// reserved, so they also reach the driver as ordinary parameters. (Upstream looks up the
    /// key `""` for pairs without deprecated keys, so a parameter with an empty key would
    /// count as one; that accident is not reproduced.)
    pub deprecated: Option<(&'static str, &'static str)>,
}

impl SecretKind {
    /// In the order upstream resolves them in `prepareProvision`.
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];
}

impl SecretParams {
    pub fn keys(self) -> ParamKeys {
        let (label, name, namespace, deprecated) = match self {
            SecretParams::Default => (
                "Default",
                "csi.storage.k8s.io/secret-name",
                "csi.storage.k8s.io/secret-namespace",
                None,
            ),
            SecretParams::Kind(SecretKind::Provisioner) => (
                "Provisioner",
                "csi.storage.k8s.io/provisioner-secret-name",
                "csi.storage.k8s.io/provisioner-secret-namespace",
                Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace")),
            ),
            SecretParams::Kind(SecretKind::ControllerPublish) => (
                "ControllerPublish",
                "csi.storage.k8s.io/controller-publish-secret-name",
                "csi.storage.k8s.io/controller-publish-secret-namespace",
                Some((
                    "csiControllerPublishSecretName",
                    "csiControllerPublishSecretNamespace",
                )),
            ),
            SecretParams::Kind(SecretKind::NodeStage) => (
                "NodeStage",
                "csi.storage.k8s.io/node-stage-secret-name",
                "csi.storage.k8s.io/node-stage-secret-namespace",
                Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace")),
            ),
            SecretParams::Kind(SecretKind::NodePublish) => (
                "NodePublish",
                "csi.storage.k8s.io/node-publish-secret-name",
                "csi.storage.k8s.io/node-publish-secret-namespace",
                Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace")),
            ),
            SecretParams::Kind(SecretKind::ControllerExpand) => (
                "ControllerExpand",
                "csi.storage.k8s.io/controller-expand-secret-name",
                "csi.storage.k8s.io/controller-expand-secret-namespace",
                None,
            ),
            SecretParams::Kind(SecretKind::NodeExpand) => (
                "NodeExpand",
                "csi.storage.k8s.io/node-expand-secret-name",
                "csi.storage.k8s.io/node-expand-secret-namespace",
                None,
            ),
            SecretParams::Kind(SecretKind::ControllerModify) => (
                "ControllerModify",
                "csi.storage.k8s.io/controller-modify-secret-name",
                "csi.storage.k8s.io/controller-modify-secret-namespace",
                None,
            ),
        };
        ParamKeys {
            label,
            name,
            namespace,
            deprecated,
        }
    }

    fn all() -> impl Iterator<Item = SecretParams> {
        SecretKind::ALL
            .into_iter()
            .map(SecretParams::Kind)
            .chain([SecretParams::Default])
    }
}

/// Whether `key` is one of the reserved `csi.storage.k8s.io/` keys upstream knows: fsType and
/// every secret name/namespace key. The extra-metadata keys (`csi.storage.k8s.io/pvc/name`, ...)
/// are not: the provisioner adds them itself and a StorageClass may not set them.
pub fn is_known_reserved_key(key: &str) -> bool {
    key == FS_TYPE_KEY
        || SecretParams::all().any(|p| {
            let keys = p.keys();
            key == keys.name || key == keys.namespace
        })
}

/// The parameters for CreateVolume: the StorageClass parameters without the reserved keys.
/// Deprecated un-prefixed keys (`csiProvisionerSecretName`, `fstype`, ...) are kept, as
/// upstream keeps them for backwards compatibility.
pub fn remove_reserved_parameters(
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, SecretsError> {
    let mut kept = BTreeMap::new();
    for (key, value) in params {
        if !key.starts_with(PARAMETER_PREFIX) {
            kept.insert(key.clone(), value.clone());
        } else if !is_known_reserved_key(key) {
            return Err(SecretsError::UnknownReservedKey(key.clone()));
        }
    }
    Ok(kept)
}

/// A resolved reference to a Secret. Only names: no secret value ever passes through here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

impl From<SecretRef> for SecretReference {
    fn from(r: SecretRef) -> Self {
        SecretReference {
            name: Some(r.name),
            namespace: Some(r.namespace),
        }
    }
}

/// What a template may refer to. For the deletion fallback (a PV without the deletion
/// annotations) upstream builds a claim from the PV's claimRef, so `pvc_annotations` is empty
/// there and `${pvc.annotations['…']}` templates fail.
#[derive(Debug, Clone, Copy)]
pub struct TemplateInputs<'a> {
    pub pv_name: &'a str,
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    pub pvc_annotations: &'a BTreeMap<String, String>,
}

/// Every secret reference one StorageClass gives a volume; `None` where not configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRefs {
    pub provisioner: Option<SecretRef>,
    pub controller_publish: Option<SecretRef>,
    pub node_stage: Option<SecretRef>,
    pub node_publish: Option<SecretRef>,
    pub controller_expand: Option<SecretRef>,
    pub node_expand: Option<SecretRef>,
    pub controller_modify: Option<SecretRef>,
}

impl SecretRefs {
    /// Resolves every kind in upstream's order (struct fields are evaluated as written),
    /// stopping at the first error.
    pub fn resolve(
        params: &BTreeMap<String, String>,
        inputs: &TemplateInputs<'_>,
    ) -> Result<Self, SecretsError> {
        let resolve = |kind| secret_reference(kind, params, inputs);
        Ok(SecretRefs {
            provisioner: resolve(SecretKind::Provisioner)?,
            controller_publish: resolve(SecretKind::ControllerPublish)?,
            node_stage: resolve(SecretKind::NodeStage)?,
            node_publish: resolve(SecretKind::NodePublish)?,
            controller_expand: resolve(SecretKind::ControllerExpand)?,
            node_expand: resolve(SecretKind::NodeExpand)?,
            controller_modify: resolve(SecretKind::ControllerModify)?,
        })
    }
}

/// The secret a StorageClass names for `kind` (upstream `getSecretReference`): the kind's own
/// pair (prefixed or deprecated key), else the default pair, else `None`. The namespace
/// template may use `${pv.name}` and `${pvc.namespace}` only, so a PVC author can pick a
/// namespace only through the PVC's own namespace (issue #213); the name template may also
/// use `${pvc.name}` and `${pvc.annotations['<key>']}`. The namespace must resolve to a
/// DNS-1123 label, the name to a DNS-1123 subdomain. The Secret itself is not looked up.
pub fn secret_reference(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    inputs: &TemplateInputs<'_>,
) -> Result<Option<SecretRef>, SecretsError> {
    let templates = match pair_templates(SecretParams::Kind(kind), params)? {
        Some(t) => Some(t),
        None => pair_templates(SecretParams::Default, params)?,
    };
    let Some((name_template, namespace_template)) = templates else {
        return Ok(None);
    };

    let mut vars = BTreeMap::from([
        ("pv.name".to_string(), inputs.pv_name.to_string()),
        (
            "pvc.namespace".to_string(),
            inputs.pvc_namespace.to_string(),
        ),
    ]);
    let namespace = resolve_template(namespace_template, &vars)?;
    if !is_dns1123_label(&namespace) {
        return Err(SecretsError::InvalidNamespace {
            template: namespace_template.to_string(),
            resolved: namespace,
        });
    }

    vars.insert("pvc.name".to_string(), inputs.pvc_name.to_string());
    vars.extend(
        inputs
            .pvc_annotations
            .iter()
            .map(|(k, v)| (format!("pvc.annotations['{k}']"), v.clone())),
    );
    let name = resolve_template(name_template, &vars)?;
    if !is_dns1123_subdomain(&name) {
        return Err(SecretsError::InvalidName {
            template: name_template.to_string(),
            resolved: name,
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// The `(name, namespace)` templates of one pair (upstream
/// `verifyAndGetSecretNameAndNamespaceTemplate`), `None` when neither key is present.
fn pair_templates(
    pair: SecretParams,
    params: &BTreeMap<String, String>,
) -> Result<Option<(&str, &str)>, SecretsError> {
    let keys = pair.keys();
    let (deprecated_name, deprecated_namespace) = keys.deprecated.unzip();
    let lookup = |current: &str, deprecated: Option<&str>| -> Vec<&str> {
        [deprecated, Some(current)]
            .into_iter()
            .flatten()
            .filter_map(|k| params.get(k).map(String::as_str))
            .collect()
    };
    let names = lookup(keys.name, deprecated_name);
    let namespaces = lookup(keys.namespace, deprecated_namespace);
    match (names.as_slice(), namespaces.as_slice()) {
        ([], []) => Ok(None),
        ([name], [namespace]) if !name.is_empty() && !namespace.is_empty() => {
            Ok(Some((name, namespace)))
        }
        ([_], [_]) => Err(SecretsError::EmptyValue(pair)),
        (n, ns) if n.len() > 1 || ns.len() > 1 => Err(SecretsError::BothKeyForms(pair)),
        _ => Err(SecretsError::HalfPair(pair)),
    }
}

/// Go's `os.Expand` (which upstream's `resolveTemplate` uses), failing on unknown variables.
/// Its quirks are kept because they decide which templates are errors: `$name` without braces
/// is a variable too, a shell special character after `$` (`$$`, `$1`, `${*}`, ...) is a
/// one-character variable, `${}` and an unclosed `${` are dropped, and a `$` followed by
/// anything else (or at the end) stays as it is. The snapshotter's templates use it too.
pub fn resolve_template(
    template: &str,
    vars: &BTreeMap<String, String>,
) -> Result<String, SecretsError> {
    let mut missing = BTreeSet::new();
    let mut out = String::with_capacity(template.len());
    let bytes = template.as_bytes();
    let (mut start, mut j) = (0, 0);
    while j < bytes.len() {
        if bytes[j] == b'$' && j + 1 < bytes.len() {
            out.push_str(&template[start..j]);
            let (name, width) = shell_name(&template[j + 1..]);
            match name {
                Some(name) => match vars.get(name) {
                    Some(value) => out.push_str(value),
                    None => {
                        missing.insert(name.to_string());
                    }
                },
                None if width == 0 => out.push('$'),
                None => {}
            }
            j += width;
            start = j + 1;
        }
        j += 1;
    }
    out.push_str(&template[start..]);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(SecretsError::InvalidTokens {
            template: template.to_string(),
            tokens: missing.into_iter().collect(),
        })
    }
}

/// Go's `getShellName`: the variable name at the start of `s` (the text after a `$`) and how
/// many bytes it takes; no name with a non-zero width means bad syntax that is dropped.
fn shell_name(s: &str) -> (Option<&str>, usize) {
    let bytes = s.as_bytes();
    let special = |c: u8| b"*#$@!?-0123456789".contains(&c);
    if bytes[0] == b'{' {
        if bytes.len() > 2 && special(bytes[1]) && bytes[2] == b'}' {
            return (Some(&s[1..2]), 3);
        }
        return match bytes.iter().position(|&c| c == b'}') {
            Some(1) => (None, 2),
            Some(close) => (Some(&s[1..close]), close + 1),
            None => (None, 1),
        };
    }
    if special(bytes[0]) {
        return (Some(&s[..1]), 1);
    }
    let len = bytes
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count();
    ((len > 0).then(|| &s[..len]), len)
}

/// The two deletion annotations every provisioned PV gets: the provisioner secret, or two
/// empty strings meaning "DeleteVolume needs no secret" (upstream sets them even then).
pub fn deletion_secret_annotations(provisioner: Option<&SecretRef>) -> [(&'static str, String); 2] {
    let (name, namespace) = provisioner
        .map(|r| (r.name.clone(), r.namespace.clone()))
        .unwrap_or_default();
    [
        (DELETION_SECRET_NAME_ANNOTATION, name),
        (DELETION_SECRET_NAMESPACE_ANNOTATION, namespace),
    ]
}

/// The controller-modify annotations, only when that secret is configured.
pub fn modify_secret_annotations(modify: Option<&SecretRef>) -> Vec<(&'static str, String)> {
    modify
        .map(|r| {
            vec![
                (MODIFY_SECRET_NAME_ANNOTATION, r.name.clone()),
                (MODIFY_SECRET_NAMESPACE_ANNOTATION, r.namespace.clone()),
            ]
        })
        .unwrap_or_default()
}

/// Where DeleteVolume's secret comes from (upstream `handleSecretsForDeletion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionSecret {
    /// Both annotations are on the PV: this secret, or none. Upstream also sends no secret,
    /// silently, when exactly one of the two values is empty; so does this.
    Annotated(Option<SecretRef>),
    /// An older PV without both annotations: resolve the provisioner secret from the
    /// StorageClass (if it still exists) with inputs from the PV's claimRef.
    FromStorageClass,
}

pub fn deletion_secret(pv_annotations: &BTreeMap<String, String>) -> DeletionSecret {
    match (
        pv_annotations.get(DELETION_SECRET_NAME_ANNOTATION),
        pv_annotations.get(DELETION_SECRET_NAMESPACE_ANNOTATION),
    ) {
        (Some(name), Some(namespace)) => {
            DeletionSecret::Annotated((!name.is_empty() && !namespace.is_empty()).then(|| {
                SecretRef {
                    name: name.clone(),
                    namespace: namespace.clone(),
                }
            }))
        }
        _ => DeletionSecret::FromStorageClass,
    }
}

/// A Secret's data as the CSI `secrets` map. `Debug` shows only how many keys there are, as
/// csi-proto's redacted `Debug` does for request `secrets` (keys can be telling too).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData(HashMap<String, String>);

impl SecretData {
    /// Upstream (`getCredentials`) converts with Go's `string(bytes)`, which keeps invalid
    /// UTF-8, and the CSI call then fails when protobuf refuses to marshal a proto3 string
    /// that is not UTF-8. A Rust `String` cannot hold such bytes, so the same secret fails
    /// here, earlier, naming the key (never the value). `stringData` is write-only in the API
    /// and never present on a read Secret, so only `data` counts.
    pub fn from_secret(secret: &Secret) -> Result<Self, SecretsError> {
        let mut map = HashMap::new();
        for (key, value) in secret.data.iter().flatten() {
            let value = String::from_utf8(value.0.clone())
                .map_err(|_| SecretsError::NotUtf8 { key: key.clone() })?;
            map.insert(key.clone(), value);
        }
        Ok(SecretData(map))
    }

    /// For `CreateVolumeRequest.secrets` / `DeleteVolumeRequest.secrets`.
    pub fn into_inner(self) -> HashMap<String, String> {
        self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            1 => f.write_str("SecretData(<redacted 1 key>)"),
            n => write!(f, "SecretData(<redacted {n} keys>)"),
        }
    }
}

/// Errors of the resolver. The texts are upstream's, since they reach users as Events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{0}\" with reserved namespace {PARAMETER_PREFIX}"
    )]
    UnknownReservedKey(String),
    #[error(
        "{}{} secrets specified in parameters with both \"csi\" and \"{PARAMETER_PREFIX}\" keys",
        template_context(*.0),
        .0.keys().label
    )]
    BothKeyForms(SecretParams),
    #[error(
        "{}either name and namespace for {} secrets specified, Both must be specified",
        template_context(*.0),
        .0.keys().label
    )]
    HalfPair(SecretParams),
    #[error(
        "{}{} secrets specified in parameters but value of either namespace or name is empty",
        template_context(*.0),
        .0.keys().label
    )]
    EmptyValue(SecretParams),
    #[error(
        "error resolving value {template:?}: invalid tokens: {}",
        go_quoted_list(tokens)
    )]
    InvalidTokens {
        template: String,
        tokens: Vec<String>,
    },
    #[error("{}", invalid_result(template, resolved, "namespace"))]
    InvalidNamespace { template: String, resolved: String },
    #[error("{}", invalid_result(template, resolved, "secret"))]
    InvalidName { template: String, resolved: String },
    #[error("secret data key {key:?} is not valid UTF-8")]
    NotUtf8 { key: String },
}

/// The prefix `getSecretReference` wraps a pair error in.
fn template_context(pair: SecretParams) -> &'static str {
    match pair {
        SecretParams::Default => "failed to get default name and namespace template from params: ",
        SecretParams::Kind(_) => "failed to get name and namespace template from params: ",
    }
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

fn invalid_result(template: &str, resolved: &str, what: &str) -> String {
    if template == resolved {
        format!("{template:?} is not a valid {what} name")
    } else {
        format!("{template:?} resolved to {resolved:?} which is not a valid {what} name")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    /// A resolution outcome with the error as its message, which is what users see.
    type Resolved = Result<Option<SecretRef>, String>;
    type Pairs<'a> = &'a [(&'a str, &'a str)];

    fn params(pairs: Pairs) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(kind: SecretKind, sc: Pairs, annotations: Pairs) -> Resolved {
        let annotations = params(annotations);
        let inputs = TemplateInputs {
            pv_name: "pvc-1234",
            pvc_name: "data",
            pvc_namespace: "team-a",
            pvc_annotations: &annotations,
        };
        secret_reference(kind, &params(sc), &inputs).map_err(|e| e.to_string())
    }

    fn found(name: &str, namespace: &str) -> Resolved {
        Ok(Some(SecretRef {
            name: name.into(),
            namespace: namespace.into(),
        }))
    }

    #[test]
    fn remove_reserved_parameters_strips_known_keys_and_keeps_the_rest() {
        let mut sc = vec![
            (FS_TYPE_KEY, "ext4"),
            ("fstype", "xfs"),
            ("csiProvisionerSecretName", "legacy"),
            ("csiProvisionerSecretNamespace", "legacy-ns"),
            ("type", "fast"),
            ("csi.storage.k8s.io", "no slash: not the prefix"),
        ];
        let all_keys: Vec<ParamKeys> = SecretParams::all().map(SecretParams::keys).collect();
        for keys in &all_keys {
            sc.push((keys.name, "n"));
            sc.push((keys.namespace, "ns"));
        }
        assert_eq!(
            remove_reserved_parameters(&params(&sc)),
            Ok(params(&[
                ("csi.storage.k8s.io", "no slash: not the prefix"),
                ("csiProvisionerSecretName", "legacy"),
                ("csiProvisionerSecretNamespace", "legacy-ns"),
                ("fstype", "xfs"),
                ("type", "fast"),
            ]))
        );
    }

    #[test]
    fn remove_reserved_parameters_rejects_unknown_reserved_keys() {
        for key in [
            "csi.storage.k8s.io/pvc/name",
            "csi.storage.k8s.io/pvc/namespace",
            "csi.storage.k8s.io/pv/name",
            "csi.storage.k8s.io/fsType",
            "csi.storage.k8s.io/",
        ] {
            let sc = params(&[("type", "fast"), (key, "x")]);
            assert_eq!(
                remove_reserved_parameters(&sc).map_err(|e| e.to_string()),
                Err(format!(
                    "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{key}\" with reserved namespace csi.storage.k8s.io/"
                )),
                "{key}"
            );
        }
    }

    #[test]
    fn each_kind_reads_its_own_prefixed_and_deprecated_keys() {
        let cases = [
            (
                SecretKind::Provisioner,
                "provisioner",
                Some("csiProvisionerSecret"),
            ),
            (
                SecretKind::ControllerPublish,
                "controller-publish",
                Some("csiControllerPublishSecret"),
            ),
            (
                SecretKind::NodeStage,
                "node-stage",
                Some("csiNodeStageSecret"),
            ),
            (
                SecretKind::NodePublish,
                "node-publish",
                Some("csiNodePublishSecret"),
            ),
            (SecretKind::ControllerExpand, "controller-expand", None),
            (SecretKind::NodeExpand, "node-expand", None),
            (SecretKind::ControllerModify, "controller-modify", None),
        ];
        for (kind, infix, deprecated) in cases {
            let name_key = format!("csi.storage.k8s.io/{infix}-secret-name");
            let namespace_key = format!("csi.storage.k8s.io/{infix}-secret-namespace");
            let sc = [
                (name_key.as_str(), "own"),
                (namespace_key.as_str(), "own-ns"),
            ];
            assert_eq!(resolve(kind, &sc, &[]), found("own", "own-ns"), "{kind:?}");
            // Another kind's pair is not this kind's.
            assert_eq!(
                resolve(SecretKind::ALL[(kind as usize + 1) % 7], &sc, &[]),
                Ok(None),
                "{kind:?}"
            );
            let deprecated_name = deprecated.map(|p| format!("{p}Name"));
            let deprecated_namespace = deprecated.map(|p| format!("{p}Namespace"));
            let keys = SecretParams::Kind(kind).keys();
            assert_eq!(
                keys.deprecated,
                deprecated_name
                    .as_deref()
                    .zip(deprecated_namespace.as_deref()),
                "{kind:?}"
            );
            if let Some((name, namespace)) = keys.deprecated {
                let sc = [(name, "old"), (namespace, "old-ns")];
                assert_eq!(resolve(kind, &sc, &[]), found("old", "old-ns"), "{kind:?}");
            }
        }
    }

    #[test]
    fn pair_rules_and_default_fallback() {
        use SecretKind::{ControllerExpand, NodeStage, Provisioner};
        const P_NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
        const P_NS: &str = "csi.storage.k8s.io/provisioner-secret-namespace";
        const D_NAME: &str = "csi.storage.k8s.io/secret-name";
        const D_NS: &str = "csi.storage.k8s.io/secret-namespace";
        const PREFIX: &str = "failed to get name and namespace template from params: ";
        const DEFAULT: &str = "failed to get default name and namespace template from params: ";
        let err = |prefix: &str, text: &str| Err(format!("{prefix}{text}"));
        let cases: [(&str, SecretKind, Pairs, Resolved); 12] = [
            ("nothing configured", Provisioner, &[], Ok(None)),
            (
                "default pair serves every kind",
                ControllerExpand,
                &[(D_NAME, "d"), (D_NS, "dns")],
                found("d", "dns"),
            ),
            (
                "own pair wins over default",
                Provisioner,
                &[(P_NAME, "p"), (P_NS, "pns"), (D_NAME, "d"), (D_NS, "dns")],
                found("p", "pns"),
            ),
            (
                "deprecated and prefixed name",
                Provisioner,
                &[
                    ("csiProvisionerSecretName", "a"),
                    (P_NAME, "b"),
                    (P_NS, "ns"),
                ],
                err(
                    PREFIX,
                    "Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys",
                ),
            ),
            (
                "deprecated and prefixed namespace",
                NodeStage,
                &[
                    ("csiNodeStageSecretNamespace", "a"),
                    ("csi.storage.k8s.io/node-stage-secret-namespace", "b"),
                    ("csi.storage.k8s.io/node-stage-secret-name", "n"),
                ],
                err(
                    PREFIX,
                    "NodeStage secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys",
                ),
            ),
            (
                "deprecated name with prefixed namespace mix",
                Provisioner,
                &[("csiProvisionerSecretName", "old"), (P_NS, "new-ns")],
                found("old", "new-ns"),
            ),
            (
                "name without namespace",
                Provisioner,
                &[(P_NAME, "p")],
                err(
                    PREFIX,
                    "either name and namespace for Provisioner secrets specified, Both must be specified",
                ),
            ),
            (
                "namespace without name",
                Provisioner,
                &[(P_NS, "pns")],
                err(
                    PREFIX,
                    "either name and namespace for Provisioner secrets specified, Both must be specified",
                ),
            ),
            (
                "half an own pair does not fall back to default",
                Provisioner,
                &[(P_NAME, "p"), (D_NAME, "d"), (D_NS, "dns")],
                err(
                    PREFIX,
                    "either name and namespace for Provisioner secrets specified, Both must be specified",
                ),
            ),
            (
                "empty value",
                Provisioner,
                &[(P_NAME, ""), (P_NS, "pns")],
                err(
                    PREFIX,
                    "Provisioner secrets specified in parameters but value of either namespace or name is empty",
                ),
            ),
            (
                "half default pair",
                ControllerExpand,
                &[(D_NS, "dns")],
                err(
                    DEFAULT,
                    "either name and namespace for Default secrets specified, Both must be specified",
                ),
            ),
            (
                "empty default value",
                ControllerExpand,
                &[(D_NAME, "d"), (D_NS, "")],
                err(
                    DEFAULT,
                    "Default secrets specified in parameters but value of either namespace or name is empty",
                ),
            ),
        ];
        for (what, kind, sc, want) in cases {
            assert_eq!(resolve(kind, sc, &[]), want, "{what}");
        }
    }

    #[test]
    fn templates_resolve_only_the_variables_allowed_per_field() {
        const NAME: &str = "csi.storage.k8s.io/node-publish-secret-name";
        const NS: &str = "csi.storage.k8s.io/node-publish-secret-namespace";
        let annotations = [("example.com/secret", "from-annotation")];
        let cases = [
            ("pv name in both", "s-${pv.name}", "${pv.name}", found("s-pvc-1234", "pvc-1234")),
            ("pvc namespace in both", "${pvc.namespace}", "${pvc.namespace}", found("team-a", "team-a")),
            ("pvc name in name", "${pvc.name}-creds", "fixed", found("data-creds", "fixed")),
            (
                "annotation in name",
                "${pvc.annotations['example.com/secret']}",
                "fixed",
                found("from-annotation", "fixed"),
            ),
            (
                "pvc name not allowed in namespace",
                "x",
                "${pvc.name}",
                Err("error resolving value \"${pvc.name}\": invalid tokens: [\"pvc.name\"]".into()),
            ),
            (
                "annotation not allowed in namespace",
                "x",
                "${pvc.annotations['example.com/secret']}",
                Err("error resolving value \"${pvc.annotations['example.com/secret']}\": invalid tokens: [\"pvc.annotations['example.com/secret']\"]".into()),
            ),
            (
                "missing annotation",
                "${pvc.annotations['other']}",
                "x",
                Err("error resolving value \"${pvc.annotations['other']}\": invalid tokens: [\"pvc.annotations['other']\"]".into()),
            ),
            (
                "unknown tokens listed sorted once",
                "${zeta}${alpha}${zeta}",
                "x",
                Err("error resolving value \"${zeta}${alpha}${zeta}\": invalid tokens: [\"alpha\" \"zeta\"]".into()),
            ),
            (
                "namespace is checked before name",
                "${bad}",
                "${worse}",
                Err("error resolving value \"${worse}\": invalid tokens: [\"worse\"]".into()),
            ),
            (
                "namespace must be a DNS label",
                "x",
                "team.a",
                Err("\"team.a\" is not a valid namespace name".into()),
            ),
            (
                "resolved namespace must be a DNS label",
                "x",
                "${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}",
                Err("\"${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}-${pv.name}\" resolved to \"pvc-1234-pvc-1234-pvc-1234-pvc-1234-pvc-1234-pvc-1234-pvc-1234-pvc-1234\" which is not a valid namespace name".into()),
            ),
            ("name may be a dotted subdomain", "a.b-c.d", "x", found("a.b-c.d", "x")),
            ("name must be a DNS subdomain", "Upper", "x", Err("\"Upper\" is not a valid secret name".into())),
            (
                "resolved name must be a DNS subdomain",
                "${pvc.name}_x",
                "x",
                Err("\"${pvc.name}_x\" resolved to \"data_x\" which is not a valid secret name".into()),
            ),
        ];
        for (what, name, namespace, want) in cases {
            assert_eq!(
                resolve(
                    SecretKind::NodePublish,
                    &[(NAME, name), (NS, namespace)],
                    &annotations
                ),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn template_expansion_follows_go_os_expand() {
        let vars = params(&[("pv.name", "pv1"), ("a", "A"), ("a_1", "B")]);
        let cases = [
            ("no variables", "plain", Ok("plain")),
            ("braced", "x${pv.name}y", Ok("xpv1y")),
            ("bare name stops at non-alphanumerics", "$a.$a_1", Ok("A.B")),
            ("bare name is a variable too", "$pv.name", Err(vec!["pv"])),
            (
                "special character is a one-letter variable",
                "$$",
                Err(vec!["$"]),
            ),
            ("braced special character", "${1}", Err(vec!["1"])),
            ("empty braces are dropped", "a${}b", Ok("ab")),
            ("unclosed brace drops the ${", "a${pv.name", Ok("apv.name")),
            ("dollar before other text stays", "a$.b", Ok("a$.b")),
            ("trailing dollar stays", "ab$", Ok("ab$")),
        ];
        for (what, template, want) in cases {
            let got = resolve_template(template, &vars).map_err(|e| match e {
                SecretsError::InvalidTokens { tokens, .. } => tokens,
                other => panic!("{other}"),
            });
            let want = want
                .map(str::to_string)
                .map_err(|t| t.into_iter().map(str::to_string).collect::<Vec<_>>());
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn dns_validation_matches_apimachinery() {
        let long_label = "a".repeat(64);
        let long_subdomain = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62)
        );
        let cases: [(&str, bool, bool); 9] = [
            ("abc-1", true, true),
            ("1abc", true, true),
            ("-abc", false, false),
            ("abc-", false, false),
            ("a.b", false, true),
            ("a..b", false, false),
            ("", false, false),
            (&long_label, false, true),
            (&long_subdomain, false, false),
        ];
        for (value, label, subdomain) in cases {
            assert_eq!(is_dns1123_label(value), label, "label {value}");
            assert_eq!(is_dns1123_subdomain(value), subdomain, "subdomain {value}");
        }
        assert!(is_dns1123_subdomain(&long_subdomain[1..]));
    }

    #[test]
    fn resolve_all_kinds_and_stop_at_the_first_error() {
        let annotations = BTreeMap::new();
        let inputs = TemplateInputs {
            pv_name: "pv",
            pvc_name: "claim",
            pvc_namespace: "ns",
            pvc_annotations: &annotations,
        };
        let sc = params(&[
            ("csi.storage.k8s.io/secret-name", "default"),
            ("csi.storage.k8s.io/secret-namespace", "kube-system"),
            ("csi.storage.k8s.io/node-stage-secret-name", "${pvc.name}"),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.namespace}",
            ),
        ]);
        let default = Some(SecretRef {
            name: "default".into(),
            namespace: "kube-system".into(),
        });
        assert_eq!(
            SecretRefs::resolve(&sc, &inputs),
            Ok(SecretRefs {
                provisioner: default.clone(),
                controller_publish: default.clone(),
                node_stage: Some(SecretRef {
                    name: "claim".into(),
                    namespace: "ns".into(),
                }),
                node_publish: default.clone(),
                controller_expand: default.clone(),
                node_expand: default.clone(),
                controller_modify: default,
            })
        );

        let mut broken = sc.clone();
        broken.insert(
            "csi.storage.k8s.io/node-expand-secret-name".into(),
            "x".into(),
        );
        assert_eq!(
            SecretRefs::resolve(&broken, &inputs),
            Err(SecretsError::HalfPair(SecretParams::Kind(
                SecretKind::NodeExpand
            )))
        );
        assert_eq!(
            SecretRefs::resolve(&BTreeMap::new(), &inputs),
            Ok(SecretRefs::default())
        );
    }

    #[test]
    fn deletion_fallback_has_no_annotations_so_annotation_templates_fail() {
        // Upstream getSecretsFromSC resolves with a claim built from the PV's claimRef only.
        assert_eq!(
            resolve(
                SecretKind::Provisioner,
                &[
                    ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.annotations['k']}"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
                ],
                &[],
            ),
            Err("error resolving value \"${pvc.annotations['k']}\": invalid tokens: [\"pvc.annotations['k']\"]".into())
        );
    }

    #[test]
    fn deletion_and_modify_annotations_round_trip() {
        let r = SecretRef {
            name: "s".into(),
            namespace: "ns".into(),
        };
        assert_eq!(
            deletion_secret_annotations(Some(&r)),
            [
                (DELETION_SECRET_NAME_ANNOTATION, "s".to_string()),
                (DELETION_SECRET_NAMESPACE_ANNOTATION, "ns".to_string()),
            ]
        );
        assert_eq!(
            deletion_secret_annotations(None),
            [
                (DELETION_SECRET_NAME_ANNOTATION, String::new()),
                (DELETION_SECRET_NAMESPACE_ANNOTATION, String::new()),
            ]
        );
        assert_eq!(
            modify_secret_annotations(Some(&r)),
            vec![
                (MODIFY_SECRET_NAME_ANNOTATION, "s".to_string()),
                (MODIFY_SECRET_NAMESPACE_ANNOTATION, "ns".to_string()),
            ]
        );
        assert!(modify_secret_annotations(None).is_empty());

        let from = |pairs: &[(&str, String)]| {
            let annotations: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            deletion_secret(&annotations)
        };
        let cases = [
            (
                "written with a secret",
                from(&deletion_secret_annotations(Some(&r))),
                DeletionSecret::Annotated(Some(r.clone())),
            ),
            (
                "written without a secret",
                from(&deletion_secret_annotations(None)),
                DeletionSecret::Annotated(None),
            ),
            (
                "one value empty means no secret",
                from(&[
                    (DELETION_SECRET_NAME_ANNOTATION, "s".into()),
                    (DELETION_SECRET_NAMESPACE_ANNOTATION, String::new()),
                ]),
                DeletionSecret::Annotated(None),
            ),
            (
                "one annotation missing falls back",
                from(&[(DELETION_SECRET_NAME_ANNOTATION, "s".into())]),
                DeletionSecret::FromStorageClass,
            ),
            (
                "older PV falls back",
                from(&[]),
                DeletionSecret::FromStorageClass,
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn secret_data_converts_bytes_and_redacts_debug() {
        let secret = |data: &[(&str, &[u8])]| Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let data = SecretData::from_secret(&secret(&[("user", b"admin"), ("pass", b"hunter2")]))
            .expect("valid UTF-8");
        assert_eq!(format!("{data:?}"), "SecretData(<redacted 2 keys>)");
        assert_eq!(
            data.clone().into_inner(),
            HashMap::from([
                ("user".into(), "admin".into()),
                ("pass".into(), "hunter2".into())
            ])
        );
        assert_eq!(data.len(), 2);

        let one = SecretData::from_secret(&secret(&[("k", b"v")])).expect("valid");
        assert_eq!(format!("{one:?}"), "SecretData(<redacted 1 key>)");

        let empty = SecretData::from_secret(&Secret::default()).expect("no data");
        assert!(empty.is_empty());

        let err = SecretData::from_secret(&secret(&[("ok", b"v"), ("bin", &[0xff, 0xfe])]))
            .expect_err("invalid UTF-8");
        assert_eq!(err, SecretsError::NotUtf8 { key: "bin".into() });
        assert_eq!(
            err.to_string(),
            "secret data key \"bin\" is not valid UTF-8"
        );
    }

    #[test]
    fn secret_ref_becomes_a_kubernetes_secret_reference() {
        let r = SecretRef {
            name: "s".into(),
            namespace: "ns".into(),
        };
        assert_eq!(
            SecretReference::from(r),
            SecretReference {
                name: Some("s".into()),
                namespace: Some("ns".into()),
            }
        );
    }
}
