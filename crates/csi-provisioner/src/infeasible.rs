//! Claims whose CreateVolume the driver called infeasible (InvalidArgument): sig-storage-lib's
//! slow set. Such a claim is not tried again for `--retry-interval-max` after the refusal, so
//! a request the driver cannot ever serve does not hit it (and write an Event) every few
//! seconds; a change of its StorageClass (a new UID: deleted and created again, fixed) lifts
//! the wait at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use csi_sidecar::lock;

#[derive(Debug)]
pub struct InfeasibleClaims {
    retention: Duration,
    /// Claim UID → when CreateVolume was refused, and the UID of the class it was made from.
    refused: Mutex<HashMap<String, (Instant, String)>>,
}

impl InfeasibleClaims {
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// Records the refusal of the claim `claim_uid`, made from the class `class_uid`.
    pub fn mark(&self, claim_uid: &str, class_uid: &str, now: Instant) {
        let mut refused = lock(&self.refused);
        refused.retain(|_, (at, _)| now.duration_since(*at) < self.retention);
        refused.insert(claim_uid.to_string(), (now, class_uid.to_string()));
    }

    /// How long the claim still waits; `None` when it may be provisioned.
    pub fn remaining(&self, claim_uid: &str, class_uid: &str, now: Instant) -> Option<Duration> {
        let mut refused = lock(&self.refused);
        let (at, class) = refused.get(claim_uid)?;
        let left = self.retention.checked_sub(now.duration_since(*at));
        match left {
            Some(left) if class == class_uid && !left.is_zero() => Some(left),
            _ => {
                refused.remove(claim_uid);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_claims_wait_the_retention_unless_their_class_changes() {
        let retention = Duration::from_secs(300);
        let start = Instant::now();
        // (claim asked about, class UID now, seconds after the refusal, wait left)
        let cases = [
            ("c1", "sc1", 0, Some(300)),
            ("c1", "sc1", 120, Some(180)),
            ("c1", "sc1", 300, None),
            ("c1", "sc1", 400, None),
            ("c1", "sc2", 10, None),
            ("c2", "sc1", 10, None),
        ];
        for (claim, class, after, want) in cases {
            let slow = InfeasibleClaims::new(retention);
            slow.mark("c1", "sc1", start);
            let now = start + Duration::from_secs(after);
            assert_eq!(
                slow.remaining(claim, class, now),
                want.map(Duration::from_secs),
                "{claim} {class} +{after}s"
            );
        }
    }

    #[test]
    fn a_lifted_wait_is_forgotten_and_expired_ones_are_dropped() {
        let slow = InfeasibleClaims::new(Duration::from_secs(60));
        let start = Instant::now();
        slow.mark("c1", "sc1", start);
        assert_eq!(slow.remaining("c1", "sc2", start), None, "class replaced");
        assert_eq!(slow.remaining("c1", "sc1", start), None, "forgotten");
        slow.mark("c2", "sc1", start);
        slow.mark("c3", "sc1", start + Duration::from_secs(61));
        assert_eq!(lock(&slow.refused).len(), 1, "c2 expired when c3 came");
    }
}
