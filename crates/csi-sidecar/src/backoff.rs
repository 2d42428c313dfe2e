//! Exponential retry delays (client-go's `ItemExponentialFailureRateLimiter` semantics): the
//! n-th consecutive failure waits `start * 2^(n-1)`, capped at `max`. Jitter-free, so retries
//! are predictable and testable. The per-key failure counts live in the state of
//! [`crate::workers::KeyedWorkers`]; kube-runtime has no per-object backoff of its own
//! (kube#1916). [`jitter`] is apimachinery's `wait.Jitter`, for periodic work that must not run
//! in lockstep.

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

/// `start * 2^exponent`, capped at `max`, without overflow.
pub fn delay_for(start: Duration, max: Duration, exponent: u32) -> Duration {
    let factor = 2u32.checked_pow(exponent).unwrap_or(u32::MAX);
    start
        .checked_mul(factor)
        .map_or(max, |delay| delay.min(max))
}

/// `period` plus a random share of up to `max_factor * period` (apimachinery's `wait.Jitter`).
pub fn jitter(period: Duration, max_factor: f64) -> Duration {
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    let fraction = (random % 1_000_000) as f64 / 1_000_000.0;
    period.mul_f64(1.0 + max_factor * fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_factor() {
        let period = Duration::from_secs(10);
        for _ in 0..100 {
            let delay = jitter(period, 0.5);
            assert!(
                delay >= period && delay < Duration::from_secs(15),
                "{delay:?}"
            );
        }
        assert_eq!(jitter(period, 0.0), period);
    }

    #[test]
    fn doubles_from_start_up_to_max() {
        let delays: Vec<u64> = (0..6)
            .map(|n| delay_for(Duration::from_secs(1), Duration::from_secs(10), n).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
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
