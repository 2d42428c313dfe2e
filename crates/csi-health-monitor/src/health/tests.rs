use super::*;

fn abnormal(message: &str) -> Health {
    Health::Abnormal(message.to_string())
}

fn known(health: Health) -> Option<Known> {
    Some(Known::Health(health))
}

fn warning(message: &str) -> Option<HealthEvent> {
    Some(HealthEvent {
        warning: true,
        reason: ABNORMAL,
        message: message.to_string(),
    })
}

fn recovered() -> Option<HealthEvent> {
    Some(HealthEvent {
        warning: false,
        reason: NORMAL,
        message: RECOVERED.to_string(),
    })
}

#[test]
fn each_check_against_what_was_known() {
    let cases: Vec<(&str, Option<Known>, Check, Step)> = vec![
        (
            "first check, healthy: remembered, no Event",
            None,
            Check::Reported(Health::Normal),
            Step::Record {
                known: Known::Health(Health::Normal),
                event: None,
            },
        ),
        (
            "first check, abnormal: a Warning with the driver's message",
            None,
            Check::Reported(abnormal("image missing")),
            Step::Record {
                known: Known::Health(abnormal("image missing")),
                event: warning("image missing"),
            },
        ),
        (
            "the same condition again: no repeat",
            known(abnormal("image missing")),
            Check::Reported(abnormal("image missing")),
            Step::Nothing,
        ),
        (
            "another condition: a new Warning",
            known(abnormal("image missing")),
            Check::Reported(abnormal("over capacity")),
            Step::Record {
                known: Known::Health(abnormal("over capacity")),
                event: warning("over capacity"),
            },
        ),
        (
            "recovery: one Normal",
            known(abnormal("image missing")),
            Check::Reported(Health::Normal),
            Step::Record {
                known: Known::Health(Health::Normal),
                event: recovered(),
            },
        ),
        (
            "healthy again: nothing",
            known(Health::Normal),
            Check::Reported(Health::Normal),
            Step::Nothing,
        ),
        (
            "healthy to abnormal",
            known(Health::Normal),
            Check::Reported(abnormal("")),
            Step::Record {
                known: Known::Health(abnormal("")),
                event: warning(""),
            },
        ),
        (
            "left out of a v1.13 list, never checked: healthy",
            None,
            Check::NotListed,
            Step::Record {
                known: Known::Health(Health::Normal),
                event: None,
            },
        ),
        (
            "left out of a v1.13 list, healthy before: nothing",
            known(Health::Normal),
            Check::NotListed,
            Step::Nothing,
        ),
        (
            "left out of a v1.13 list, abnormal before: a GET tells recovered or gone",
            known(abnormal("image missing")),
            Check::NotListed,
            Step::Confirm,
        ),
        (
            "left out of a v1.13 list, missing before: a GET tells",
            Some(Known::Missing),
            Check::NotListed,
            Step::Confirm,
        ),
        (
            "the driver does not know the volume: remembered, no Event (as upstream)",
            known(abnormal("image missing")),
            Check::NotFound,
            Step::Record {
                known: Known::Missing,
                event: None,
            },
        ),
        (
            "still missing: nothing",
            Some(Known::Missing),
            Check::NotFound,
            Step::Nothing,
        ),
        (
            "missing, then reported healthy: no recovery Event (it was never abnormal to us)",
            Some(Known::Missing),
            Check::Reported(Health::Normal),
            Step::Record {
                known: Known::Health(Health::Normal),
                event: None,
            },
        ),
    ];
    for (name, previous, check, expected) in cases {
        assert_eq!(decide(previous.as_ref(), &check), expected, "{name}");
    }
}

#[test]
fn a_restart_knows_what_it_last_recorded_on_each_claim() {
    let event = |claim_uid: &str, reason: &str, message: &str, last_seen| RecordedEvent {
        claim_uid: claim_uid.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_seen,
    };
    let known = last_recorded([
        event("a", ABNORMAL, "image missing", 1_000),
        event("a", NORMAL, RECOVERED, 1_300),
        event("b", NORMAL, RECOVERED, 900),
        event("b", ABNORMAL, "over capacity", 950),
        event("c", "NodeFailed", "Pods: [ p ] ...", 2_000),
    ]);
    assert_eq!(known.get("a"), Some(&Known::Health(Health::Normal)));
    assert_eq!(
        known.get("b"),
        Some(&Known::Health(abnormal("over capacity")))
    );
    assert_eq!(known.get("c"), None, "other reasons say nothing of health");
    // What a restart then does: the same condition is not repeated, a recovery is told.
    assert_eq!(
        decide(known.get("b"), &Check::Reported(abnormal("over capacity"))),
        Step::Nothing
    );
    assert_eq!(
        decide(known.get("b"), &Check::Reported(Health::Normal)),
        Step::Record {
            known: Known::Health(Health::Normal),
            event: recovered(),
        }
    );
}

#[test]
fn v1_13_statuses_describe_the_volume() {
    let status = |status, reason: &str, message: &str| HealthStatus {
        status,
        reason: reason.to_string(),
        message: message.to_string(),
    };
    assert_eq!(describe(&[]), Health::Normal);
    assert_eq!(
        describe(&[status(2, "ImageMissing", "the image of pvc-1 is gone")]),
        abnormal("Inaccessible (ImageMissing): the image of pvc-1 is gone")
    );
    assert_eq!(
        describe(&[
            status(1, "OverCapacity", "12 MiB used of 10 MiB"),
            status(3, "FilesystemErrors", ""),
            status(9, "MultipathLoss", "2 of 4 paths"),
        ]),
        abnormal(
            "Degraded (OverCapacity): 12 MiB used of 10 MiB; DataLoss (FilesystemErrors); Unknown status 9 (MultipathLoss): 2 of 4 paths"
        )
    );
}
