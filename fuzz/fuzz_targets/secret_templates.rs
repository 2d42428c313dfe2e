//! StorageClass secret references (`csi_kinds::secrets`): the name and namespace templates
//! (`${pv.name}`, `${pvc.annotations['…']}`, …) of every kind of secret, as a StorageClass
//! author and a claim's author may write them.
//!
//! Input, one item a line: the PV's name, the claim's name, the claim's namespace, then
//! StorageClass parameters (`key=value`) and claim annotations (`@key=value`). Properties: no
//! panic; `SecretRefs::resolve` agrees with `secret_reference` for every kind; a resolved
//! reference names a valid namespace and Secret; a template without `$` is itself.
#![no_main]

use std::collections::BTreeMap;

use csi_kinds::names::{is_dns1123_label, is_dns1123_subdomain};
use csi_kinds::secrets::{
    SecretKind, SecretRefs, TemplateInputs, deletion_secret, remove_reserved_parameters,
    resolve_template, secret_reference,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let mut lines = text.split('\n');
    let (pv_name, pvc_name, pvc_namespace) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    let (mut params, mut annotations) = (BTreeMap::new(), BTreeMap::new());
    for line in lines {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        match key.strip_prefix('@') {
            Some(key) => annotations.insert(key.to_string(), value.to_string()),
            None => params.insert(key.to_string(), value.to_string()),
        };
    }
    let inputs = TemplateInputs {
        pv_name,
        pvc_name,
        pvc_namespace,
        pvc_annotations: &annotations,
    };

    let each: Vec<_> = SecretKind::ALL
        .into_iter()
        .map(|kind| secret_reference(kind, &params, &inputs))
        .collect();
    for reference in each.iter().flatten().flatten() {
        assert!(is_dns1123_label(&reference.namespace), "{reference:?}");
        assert!(is_dns1123_subdomain(&reference.name), "{reference:?}");
    }
    match SecretRefs::resolve(&params, &inputs) {
        Ok(all) => assert_eq!(
            [
                all.provisioner,
                all.controller_publish,
                all.node_stage,
                all.node_publish,
                all.controller_expand,
                all.node_expand,
                all.controller_modify,
            ]
            .map(Ok)
            .to_vec(),
            each
        ),
        Err(error) => assert_eq!(Some(&Err(error)), each.iter().find(|r| r.is_err())),
    }

    let _ = remove_reserved_parameters(&params);
    let _ = deletion_secret(&annotations);
    let vars = BTreeMap::from([
        ("pv.name".to_string(), pv_name.to_string()),
        ("pvc.name".to_string(), pvc_name.to_string()),
    ]);
    for template in params.values() {
        let resolved = resolve_template(template, &vars);
        if !template.contains('$') {
            assert_eq!(resolved.as_deref(), Ok(template.as_str()));
        }
    }
});
