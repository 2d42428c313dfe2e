//! csi-lib-utils' slow set: objects whose last attempt the driver called infeasible
//! (InvalidArgument and kin) are not tried again until `--retry-interval-max` has passed, so a
//! request the driver can never serve does not hit it (and write an Event) every few
//! seconds. An entry carries a tag (the provisioner: the StorageClass UID the claim was
//! refused with): a different tag lifts the wait at once.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lock;

#[derive(Debug)]
pub struct SlowSet<K, T = ()> {
    retention: Duration,
    /// Key → since when it waits, and its tag.
    entries: Mutex<HashMap<K, (Instant, T)>>,
}

impl<K: Eq + Hash + Clone, T: PartialEq> SlowSet<K, T> {
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Starts the wait of `key` afresh (a new refusal; unlike csi-lib-utils' `Add`, which
    /// keeps a wait under way, as its ticker has dropped an expired one by then); expired
    /// entries are dropped.
    pub fn add(&self, key: K, tag: T, now: Instant) {
        let mut entries = lock(&self.entries);
        entries.retain(|_, (since, _)| now.duration_since(*since) < self.retention);
        entries.insert(key, (now, tag));
    }

    /// Starts the wait of `key` unless it waits already (a refusal seen again, say in the
    /// object's status after a restart).
    fn add_if_absent(&self, key: &K, tag: T, now: Instant) {
        lock(&self.entries).entry(key.clone()).or_insert((now, tag));
    }

    /// How long `key` still waits, and then, when its object still records a refusal
    /// (`refused`), a wait started unless one is under way — upstream's order (`Contains`
    /// before `markForSlowRetry`): the pass that finds a wait over goes through, once, and
    /// its refusal, still on the object, makes the next pass wait again. A refusal found
    /// only on the object (after a restart) is likewise tried once.
    pub fn remaining_then_mark(
        &self,
        key: &K,
        tag: T,
        refused: bool,
        now: Instant,
    ) -> Option<Duration> {
        let left = self.remaining(key, &tag, now);
        if refused {
            self.add_if_absent(key, tag, now);
        }
        left
    }

    /// Forgets every key `keep` rejects (objects that are gone).
    pub fn retain(&self, keep: impl Fn(&K) -> bool) {
        lock(&self.entries).retain(|key, _| keep(key));
    }

    /// How long `key` still waits; `None` when it may be tried (its wait is over, or it was
    /// refused under another tag: both forget it).
    pub fn remaining<Q>(&self, key: &Q, tag: &T, now: Instant) -> Option<Duration>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let mut entries = lock(&self.entries);
        let (since, refused_under) = entries.get(key)?;
        match self.retention.checked_sub(now.duration_since(*since)) {
            Some(left) if refused_under == tag && !left.is_zero() => Some(left),
            _ => {
                entries.remove(key);
                None
            }
        }
    }

    pub fn remove<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        lock(&self.entries).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_keys_wait_the_retention_unless_their_tag_changes() {
        let retention = Duration::from_secs(300);
        let start = Instant::now();
        // (key asked about, tag now, seconds after the refusal, wait left)
        let cases = [
            ("c1", "sc1", 0, Some(300)),
            ("c1", "sc1", 120, Some(180)),
            ("c1", "sc1", 300, None),
            ("c1", "sc1", 400, None),
            ("c1", "sc2", 10, None),
            ("c2", "sc1", 10, None),
        ];
        for (key, tag, after, want) in cases {
            let slow = SlowSet::new(retention);
            slow.add("c1", "sc1", start);
            let now = start + Duration::from_secs(after);
            assert_eq!(
                slow.remaining(&key, &tag, now),
                want.map(Duration::from_secs),
                "{key} {tag} +{after}s"
            );
        }
    }

    #[test]
    fn waits_are_forgotten_restarted_or_kept() {
        let slow = SlowSet::new(Duration::from_secs(60));
        let start = Instant::now();
        slow.add("c1", "sc1", start);
        assert_eq!(slow.remaining(&"c1", &"sc2", start), None, "tag replaced");
        assert_eq!(slow.remaining(&"c1", &"sc1", start), None, "forgotten");
        slow.add("c2", "sc1", start);
        slow.add("c3", "sc1", start + Duration::from_secs(61));
        assert_eq!(lock(&slow.entries).len(), 1, "c2 expired when c3 came");

        let later = start + Duration::from_secs(70);
        slow.add_if_absent(&"c3", "sc1", later);
        assert_eq!(
            slow.remaining(&"c3", &"sc1", later),
            Some(Duration::from_secs(51)),
            "a wait under way is not restarted"
        );
        slow.add("c3", "sc1", later);
        assert_eq!(
            slow.remaining(&"c3", &"sc1", later),
            Some(Duration::from_secs(60))
        );
        slow.remove(&"c3");
        assert_eq!(slow.remaining(&"c3", &"sc1", later), None);
        slow.add("c4", "sc1", later);
        slow.add("c5", "sc1", later);
        slow.retain(|key| *key != "c4");
        assert_eq!(slow.remaining(&"c4", &"sc1", later), None, "gone");
        assert!(slow.remaining(&"c5", &"sc1", later).is_some());
    }

    #[test]
    fn a_refusal_kept_on_the_object_lets_one_pass_through_then_waits() {
        let slow = SlowSet::new(Duration::from_secs(60));
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        // (seconds after start, the object still records the refusal, wait left)
        let passes = [
            (0, true, None),
            (1, true, Some(59)),
            (30, true, Some(30)),
            (60, true, None),
            (61, true, Some(59)),
            (200, false, None),
            (201, false, None),
            (202, true, None),
            (203, true, Some(59)),
        ];
        for (secs, refused, want) in passes {
            assert_eq!(
                slow.remaining_then_mark(&"c1", (), refused, at(secs)),
                want.map(Duration::from_secs),
                "+{secs}s refused={refused}"
            );
        }
    }
}
