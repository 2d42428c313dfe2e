//! The versions of objects our own writes replaced. A cache lags our writes: a sync that reads
//! a replaced version from it would plan from stale state and redo what was done (a second
//! CreateSnapshot, a second ControllerUnpublish — external-attacher #587), so it waits for the
//! watch to bring our write instead. Once the cache shows a newer version, the key's entry goes.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;

use kube::{Resource, ResourceExt};

use crate::lock;

#[derive(Debug)]
pub struct Superseded<K> {
    versions: Mutex<HashMap<K, HashSet<String>>>,
}

impl<K> Default for Superseded<K> {
    fn default() -> Self {
        Self {
            versions: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Clone + Eq + Hash> Superseded<K> {
    /// Whether `version` (the cache's) is one our writes replaced. A version not among them
    /// means the cache moved past them: the key's entry is dropped.
    pub fn is_stale(&self, key: &K, version: Option<&str>) -> bool {
        let mut versions = lock(&self.versions);
        let Some(replaced) = versions.get(key) else {
            return false;
        };
        if version.is_some_and(|v| replaced.contains(v)) {
            return true;
        }
        versions.remove(key);
        false
    }

    /// Whether `version` is one our writes replaced, leaving the entry as it is.
    pub fn contains(&self, key: &K, version: Option<&str>) -> bool {
        version.is_some_and(|version| {
            lock(&self.versions)
                .get(key)
                .is_some_and(|replaced| replaced.contains(version))
        })
    }

    /// Records that a write replaced `old`.
    pub fn supersede<R: Resource>(&self, key: K, old: &R) {
        if let Some(version) = old.resource_version() {
            lock(&self.versions).entry(key).or_default().insert(version);
        }
    }

    /// Records that our write of `old` gave `new` — unless the write changed nothing: the API
    /// server keeps the resourceVersion of a no-op write, and waiting for a newer version would
    /// then wait forever.
    pub fn wrote<R: Resource>(&self, key: K, old: &R, new: &R) {
        if new.resource_version() != old.resource_version() {
            self.supersede(key, old);
        }
    }

    /// Drops what is known of a key whose object is gone.
    pub fn forget(&self, key: &K) {
        lock(&self.versions).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn at(version: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.resource_version = Some(version.into());
        object
    }

    #[test]
    fn a_replaced_version_is_stale_until_the_cache_moves_past_it() {
        let superseded = Superseded::default();
        superseded.wrote("a", &at("1"), &at("2"));
        assert!(superseded.is_stale(&"a", Some("1")));
        assert!(superseded.contains(&"a", Some("1")));
        assert!(!superseded.is_stale(&"a", Some("2")));
        assert!(
            !superseded.contains(&"a", Some("1")),
            "moving past forgets the replaced versions"
        );
    }

    #[test]
    fn a_no_op_write_supersedes_nothing() {
        let superseded = Superseded::default();
        superseded.wrote("a", &at("1"), &at("1"));
        assert!(!superseded.is_stale(&"a", Some("1")));
        superseded.supersede("b", &at("7"));
        superseded.forget(&"b");
        assert!(!superseded.is_stale(&"b", Some("7")));
    }
}
