//! Strategic merge patches (`kube_sim::strategic::apply_strategic_merge`), as kube-sim's API
//! server applies them to the objects it stores.
//!
//! Input: one byte choosing the kind, then the object and the patch as two JSON documents one
//! after the other. Properties: no panic; a merged object is an object; an empty patch
//! changes nothing (of a kind that takes one).
#![no_main]

use kube_sim::strategic::{apply_strategic_merge, supports_kind};
use libfuzzer_sys::fuzz_target;
use serde_json::{Deserializer, Value, json};

/// A kind of each scope of patch tags, and one without any.
const KINDS: [&str; 8] = [
    "Pod",
    "Node",
    "PersistentVolumeClaim",
    "Namespace",
    "ServiceAccount",
    "CSINode",
    "PersistentVolume",
    "MyCustomResource",
];

fuzz_target!(|input: &[u8]| {
    let Some((&kind, documents)) = input.split_first() else {
        return;
    };
    let kind = KINDS[usize::from(kind) % KINDS.len()];
    let mut documents = Deserializer::from_slice(documents).into_iter::<Value>();
    let (Some(Ok(object)), Some(Ok(patch))) = (documents.next(), documents.next()) else {
        return;
    };
    if let Ok(merged) = apply_strategic_merge(kind, &object, &patch) {
        assert!(merged.is_object(), "{merged}");
    }
    if object.is_object() && supports_kind(kind) {
        for empty in [json!({}), Value::Null] {
            assert_eq!(
                apply_strategic_merge(kind, &object, &empty).as_ref(),
                Ok(&object)
            );
        }
    }
});
