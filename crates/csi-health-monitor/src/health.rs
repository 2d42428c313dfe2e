//! The health plan: what one check of a volume's health means for its claim.
//!
//! Each check of a bound volume ends in a [`Check`]: the driver reported it normal or abnormal
//! (in either CSI generation: the v1.12 `VolumeCondition`, or the v1.13 health statuses, an
//! empty list meaning healthy), a v1.13 list left it out, the driver does not know it, or the
//! call failed. [`decide`] turns the check and what the monitor last knew of the claim into a
//! [`Step`]. Upstream's external-health-monitor records `VolumeConditionAbnormal` on every check
//! that finds a volume abnormal and `VolumeConditionNormal` on every healthy check for as long
//! as an abnormal Event of the claim exists (up to an hour of repeats); here an Event is
//! recorded only when the claim's health changes: a Warning when the volume turns abnormal or
//! its condition changes, one Normal when it recovers. What was last recorded survives a
//! restart through the claim's own Events ([`last_recorded`]).

use std::collections::HashMap;

use csi_proto::csi::v1::VolumeHealthErrorType;

/// The Warning reason of an abnormal volume (upstream's).
pub const ABNORMAL: &str = "VolumeConditionAbnormal";
/// The Normal reason of a volume back to health (upstream's).
pub const NORMAL: &str = "VolumeConditionNormal";
/// The message of [`NORMAL`] (upstream's).
pub const RECOVERED: &str = "The Volume returns to the healthy state";

/// A volume's health as the driver reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Normal,
    /// Abnormal, with what the claim's Event says: the v1.12 condition's message verbatim, or
    /// the v1.13 statuses ([`describe`]).
    Abnormal(String),
}

/// One check of one volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The driver answered for the volume.
    Reported(Health),
    /// A v1.13 ControllerListVolumeHealth left the volume out: drivers list only abnormal
    /// volumes, so it is healthy — or unknown to the driver, which only a GET tells.
    NotListed,
    /// The driver does not know the volume (NOT_FOUND from a GET, or absent from a v1.12
    /// ListVolumes, which lists every volume).
    NotFound,
}

/// What the monitor knows of a claim's volume from its last checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    Health(Health),
    /// The driver did not know the volume (logged once).
    Missing,
}

/// The next thing to do for a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing changed.
    Nothing,
    /// Remember `known`; record `event` on the claim if there is one.
    Record {
        known: Known,
        event: Option<HealthEvent>,
    },
    /// Ask the driver about this volume alone (ControllerGetVolumeHealth) and decide again with
    /// its answer: a list left out a volume last known abnormal, and only a GET says whether it
    /// recovered or is gone.
    Confirm,
}

/// An Event on the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl HealthEvent {
    fn abnormal(message: &str) -> Self {
        Self {
            warning: true,
            reason: ABNORMAL,
            message: message.to_string(),
        }
    }

    fn recovered() -> Self {
        Self {
            warning: false,
            reason: NORMAL,
            message: RECOVERED.to_string(),
        }
    }
}

/// The step for a claim whose volume was checked, given what was known before (`None`: never
/// checked, and no Event of this monitor on the claim).
pub fn decide(previous: Option<&Known>, check: &Check) -> Step {
    let record = |known: Known, event: Option<HealthEvent>| Step::Record { known, event };
    match check {
        Check::Reported(health) => {
            if previous == Some(&Known::Health(health.clone())) {
                return Step::Nothing;
            }
            let event = match (health, previous) {
                (Health::Abnormal(message), _) => Some(HealthEvent::abnormal(message)),
                (Health::Normal, Some(Known::Health(Health::Abnormal(_)))) => {
                    Some(HealthEvent::recovered())
                }
                (Health::Normal, _) => None,
            };
            record(Known::Health(health.clone()), event)
        }
        Check::NotListed => match previous {
            Some(Known::Health(Health::Abnormal(_)) | Known::Missing) => Step::Confirm,
            Some(Known::Health(Health::Normal)) => Step::Nothing,
            None => record(Known::Health(Health::Normal), None),
        },
        Check::NotFound => match previous {
            Some(Known::Missing) => Step::Nothing,
            _ => record(Known::Missing, None),
        },
    }
}

/// One Event of this monitor on a claim, as listed at start-up.
#[derive(Clone, Debug)]
pub struct RecordedEvent {
    pub claim_uid: String,
    pub reason: String,
    pub message: String,
    /// When it was last recorded, in seconds since the Unix epoch.
    pub last_seen: i64,
}

/// What the monitor last recorded on each claim, from its Events: the newest of its
/// [`ABNORMAL`] and [`NORMAL`] Events per claim. A claim whose newest Event says abnormal is
/// known abnormal (its recovery gets a Normal Event; the same condition gets none).
pub fn last_recorded(events: impl IntoIterator<Item = RecordedEvent>) -> HashMap<String, Known> {
    let mut newest: HashMap<String, RecordedEvent> = HashMap::new();
    for event in events {
        if event.reason != ABNORMAL && event.reason != NORMAL {
            continue;
        }
        match newest.get(&event.claim_uid) {
            Some(kept) if kept.last_seen >= event.last_seen => {}
            _ => {
                newest.insert(event.claim_uid.clone(), event);
            }
        }
    }
    newest
        .into_iter()
        .map(|(uid, event)| {
            let health = if event.reason == ABNORMAL {
                Health::Abnormal(event.message)
            } else {
                Health::Normal
            };
            (uid, Known::Health(health))
        })
        .collect()
}

/// One v1.13 health status of a volume: its `VolumeHealthErrorType` number, reason and
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthStatus {
    pub status: i32,
    pub reason: String,
    pub message: String,
}

/// A volume's health from its v1.13 statuses: an empty list is healthy; otherwise abnormal,
/// each status as `Degraded (Reason): message`, joined by `; `. A status this monitor does not
/// know (a newer spec's) is shown with its number and not acted on otherwise, as the spec asks.
pub fn describe(statuses: &[HealthStatus]) -> Health {
    if statuses.is_empty() {
        return Health::Normal;
    }
    let parts: Vec<String> = statuses
        .iter()
        .map(|s| {
            let status = match VolumeHealthErrorType::try_from(s.status) {
                Ok(VolumeHealthErrorType::Degraded) => "Degraded".to_string(),
                Ok(VolumeHealthErrorType::Inaccessible) => "Inaccessible".to_string(),
                Ok(VolumeHealthErrorType::DataLoss) => "DataLoss".to_string(),
                Ok(VolumeHealthErrorType::UnknownVolumeHealthType) | Err(_) => {
                    format!("Unknown status {}", s.status)
                }
            };
            match s.message.as_str() {
                "" => format!("{status} ({})", s.reason),
                message => format!("{status} ({}): {message}", s.reason),
            }
        })
        .collect();
    Health::Abnormal(parts.join("; "))
}

#[cfg(test)]
mod tests;
