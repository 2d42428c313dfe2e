//! Our writes a cache does not show yet. A cache lags our writes: a sync that reads a version
//! older than our write would plan from stale state and redo what was done (a second
//! CreateSnapshot, a second ControllerUnpublish — external-attacher #587; a second
//! CreateVolume or finalizer patch), so it waits for the watch to bring our write instead.
//!
//! resourceVersions are opaque: a cached version is known to be older than our write only when
//! it is one our write replaced, or when the watch has not yet brought the version the server
//! answered with. The watch delivers an object's versions in order, so until it brings the
//! answer every version the cache shows — the one our write replaced, or one in between (a
//! `test`-guarded patch lands on whatever version is current, and kube-controller-manager
//! updates a claim while it binds it) — predates the write. A relist ends the wait unless it
//! shows the very copy our write replaced (a list begun before the write).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use kube::{Resource, ResourceExt};

use crate::informers::Observed;
use crate::lock;

#[derive(Debug)]
pub struct Superseded<K> {
    entries: Mutex<HashMap<K, Entry>>,
}

/// What is known of our writes to one object.
#[derive(Debug, Default)]
struct Entry {
    /// Versions our writes replaced. Lists, not sets: they hold one or two versions, and an
    /// entry lives for each object we wrote until the cache catches up (a thousand at once in
    /// a burst), where a one-element hash set allocates four times the space.
    replaced: Versions,
    /// The version the server answered our last write with, until the watch brings it.
    answered: Option<String>,
    /// Writes under way ([`Superseded::writing`]).
    writing: usize,
    /// Versions the watch brought while a write was under way: the watch may deliver the
    /// answer before the write's response arrives.
    seen: Versions,
    /// We created (true) or deleted (false) the object, and the cache does not show it yet.
    presence: Option<bool>,
}

/// A few resourceVersions, each once.
#[derive(Debug, Default)]
struct Versions(Vec<String>);

impl Versions {
    fn contains(&self, version: &str) -> bool {
        self.0.iter().any(|v| v == version)
    }

    fn insert(&mut self, version: String) {
        if !self.contains(&version) {
            self.0.push(version);
        }
    }

    fn extend(&mut self, versions: impl IntoIterator<Item = String>) {
        for version in versions {
            self.insert(version);
        }
    }

    /// Also gives the space back: an entry may stay (a write under way) long after.
    fn clear(&mut self) {
        self.0 = Vec::new();
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Entry {
    /// [`Superseded::lags`], dropping what the cache has caught up with.
    fn lags(&mut self, cached: bool, version: Option<&str>) -> bool {
        if self.presence.is_some_and(|present| present != cached) {
            return true;
        }
        self.presence = None;
        let older = cached
            && (self.answered.is_some()
                || version.is_some_and(|version| self.replaced.contains(version)));
        if !older {
            self.answered = None;
            self.replaced.clear();
        }
        older
    }

    fn is_empty(&self) -> bool {
        self.replaced.is_empty()
            && self.answered.is_none()
            && self.writing == 0
            && self.presence.is_none()
    }
}

impl<K> Default for Superseded<K> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Clone + Eq + Hash> Superseded<K> {
    /// Whether `version` (the cache's) is one our writes replaced. A version not among them
    /// means the cache moved past them: the key's replaced versions are dropped.
    pub fn is_stale(&self, key: &K, version: Option<&str>) -> bool {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        if version.is_some_and(|v| entry.replaced.contains(v)) {
            return true;
        }
        entry.replaced.clear();
        if entry.is_empty() {
            entries.remove(key);
        }
        false
    }

    /// Whether `version` is one our writes replaced, leaving the entry as it is.
    pub fn contains(&self, key: &K, version: Option<&str>) -> bool {
        version.is_some_and(|version| {
            lock(&self.entries)
                .get(key)
                .is_some_and(|entry| entry.replaced.contains(version))
        })
    }

    /// Records that a write replaced `old`.
    pub fn supersede<R: Resource>(&self, key: K, old: &R) {
        if let Some(version) = old.resource_version() {
            lock(&self.entries)
                .entry(key)
                .or_default()
                .replaced
                .insert(version);
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

    /// A write of `old` begins: until its [`Write::answered`], the versions the watch brings
    /// for `key` are remembered. Dropped without an answer (the write failed), it leaves no
    /// trace.
    pub fn writing<'a, R: Resource>(&'a self, key: K, old: &R) -> Write<'a, K> {
        lock(&self.entries).entry(key.clone()).or_default().writing += 1;
        Write {
            superseded: self,
            key: Some(key),
            old: old.resource_version(),
        }
    }

    /// What the watch brought for `key`, in the watch's order, after the cache holds it
    /// (the callback of [`crate::informers::Informers::all_observing`]).
    pub fn observed(&self, key: &K, version: Option<&str>, how: Observed) {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        match how {
            // A list that shows the copy our write replaced began before the write: the
            // watch resumes from it and brings the answer.
            Observed::Listed if version.is_some_and(|v| entry.replaced.contains(v)) => {}
            Observed::Listed | Observed::Deleted => {
                entry.answered = None;
                entry.replaced.clear();
                entry.seen.clear();
            }
            Observed::Changed => {
                let version = version.map(str::to_string);
                if version.is_some() && version == entry.answered {
                    entry.answered = None;
                    entry.replaced.clear();
                } else if entry.writing > 0
                    && let Some(version) = version
                {
                    entry.seen.insert(version);
                }
            }
        }
        if entry.is_empty() {
            entries.remove(key);
        }
    }

    /// We created `key`'s object: the cache lags until it holds it.
    pub fn created(&self, key: K) {
        lock(&self.entries).entry(key).or_default().presence = Some(true);
    }

    /// We deleted `key`'s object: the cache lags while it still holds it.
    pub fn deleted(&self, key: K) {
        lock(&self.entries).entry(key).or_default().presence = Some(false);
    }

    /// Whether a sync reading the cache would miss one of our writes to `key`: the cache
    /// holds (`cached`, at `version`) a version our write replaced or one before the answer
    /// to our last write, or lacks an object we created, or holds one we deleted. Once the
    /// cache has caught up, what is known of the key goes.
    pub fn lags(&self, key: &K, cached: bool, version: Option<&str>) -> bool {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        let lags = entry.lags(cached, version);
        if entry.is_empty() {
            entries.remove(key);
        }
        lags
    }

    /// Forgets the keys the cache has caught up with: `cached` tells a key's object's
    /// version in the cache (`None`: not cached).
    pub fn forget_caught_up(&self, mut cached: impl FnMut(&K) -> Option<Option<String>>) {
        lock(&self.entries).retain(|key, entry| {
            let state = cached(key);
            entry.lags(state.is_some(), state.flatten().as_deref());
            !entry.is_empty()
        });
    }

    /// Drops what is known of a key whose object is gone.
    pub fn forget(&self, key: &K) {
        lock(&self.entries).remove(key);
    }

    fn finish(&self, key: K, old: Option<String>, new: Option<Option<String>>) {
        let mut entries = lock(&self.entries);
        let entry = entries.entry(key.clone()).or_default();
        entry.writing = entry.writing.saturating_sub(1);
        if let Some(new) = new {
            match new {
                // The object was gone: nothing of ours can show up; only the copy the write
                // was built from is known to be older.
                None => entry.replaced.extend(old),
                Some(new) if Some(&new) == old.as_ref() => {}
                Some(new) => {
                    entry.replaced.extend(old);
                    if entry.seen.contains(&new) {
                        entry.answered = None;
                        entry.replaced.clear();
                    } else {
                        entry.answered = Some(new);
                    }
                }
            }
        }
        if entry.writing == 0 {
            entry.seen.clear();
        }
        if entry.is_empty() {
            entries.remove(&key);
        }
    }
}

/// A write under way ([`Superseded::writing`]).
#[derive(Debug)]
#[must_use = "a write is known only once answered"]
pub struct Write<'a, K: Clone + Eq + Hash> {
    superseded: &'a Superseded<K>,
    key: Option<K>,
    old: Option<String>,
}

impl<K: Clone + Eq + Hash> Write<'_, K> {
    /// The server answered with `new` (`None`: the object was gone). An answer at the old
    /// version (a no-op write) records nothing.
    pub fn answered<R: Resource>(mut self, new: Option<&R>) {
        if let Some(key) = self.key.take() {
            let new = new.map(ResourceExt::resource_version);
            self.superseded
                .finish(key, self.old.take(), Some(new.flatten()));
        }
    }
}

impl<K: Clone + Eq + Hash> Drop for Write<'_, K> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.superseded.finish(key, None, None);
        }
    }
}

#[cfg(test)]
mod tests;
