//! Exponential retry delays (client-go's `ItemExponentialFailureRateLimiter` semantics): the
//! n-th consecutive failure waits `start * 2^(n-1)`, capped at `max`. Jitter-free, so retries
//! are predictable and testable. The per-key failure counts live in the state of
//! [`crate::workers::KeyedWorkers`]; kube-runtime has no per-object backoff of its own
//! (kube#1916).

use std::time::Duration;

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
