//! Per-object exponential backoff (client-go's `ItemExponentialFailureRateLimiter` semantics):
//! the n-th consecutive failure of a key waits `start * 2^(n-1)`, capped at `max`; success
//! forgets the key. Jitter-free, so retries are predictable and testable. kube-runtime has no
//! per-object backoff of its own (kube#1916).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub struct Backoff<K> {
    start: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    pub fn new(start: Duration, max: Duration) -> Self {
        Self {
            start,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &K) -> Duration {
        let mut failures = self.lock();
        let count = failures.entry(key.clone()).or_insert(0);
        let exponent = *count;
        *count = count.saturating_add(1);
        delay_for(self.start, self.max, exponent)
    }

    /// Forgets the failures of `key` (after it succeeded or disappeared).
    pub fn reset(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Forgets the failures of every key `keep` refuses.
    pub fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.lock().retain(|key, _| keep(key));
    }

    /// How many consecutive failures `key` has had.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, u32>> {
        // A panic while holding this lock cannot leave the map inconsistent; keep going.
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `start * 2^exponent`, capped at `max`, without overflow.
pub fn delay_for(start: Duration, max: Duration, exponent: u32) -> Duration {
    let factor = 2u32.checked_pow(exponent).unwrap_or(u32::MAX);
    start
        .checked_mul(factor)
        .map_or(max, |delay| delay.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_start_up_to_max_then_resets() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let key = "pvc-1".to_string();
        let delays: Vec<u64> = (0..6).map(|_| backoff.next_delay(&key).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff.failures(&key), 6);
        backoff.reset(&key);
        assert_eq!(backoff.failures(&key), 0);
        assert_eq!(backoff.next_delay(&key), Duration::from_secs(1));
    }

    #[test]
    fn keys_are_independent() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        assert_eq!(backoff.next_delay(&"a"), Duration::from_millis(100));
        assert_eq!(backoff.next_delay(&"a"), Duration::from_millis(200));
        assert_eq!(backoff.next_delay(&"b"), Duration::from_millis(100));
    }

    #[test]
    fn never_overflows() {
        let table = [
            (0, Duration::from_secs(1)),
            (3, Duration::from_secs(8)),
            (31, Duration::from_secs(300)),
            (32, Duration::from_secs(300)),
            (u32::MAX, Duration::from_secs(300)),
        ];
        for (exponent, want) in table {
            assert_eq!(
                delay_for(Duration::from_secs(1), Duration::from_secs(300), exponent),
                want,
                "exponent {exponent}"
            );
        }
    }
}
