use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::*;

const LEASE: Duration = Duration::from_secs(15);

fn wall(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap()
}

fn held_by(holder: &str, transitions: i32, acquired: i64) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(MicroTime(wall(acquired))),
        renew_time: Some(MicroTime(wall(acquired))),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

#[test]
fn creates_a_missing_lease() {
    let now = Instant::now();
    let mut me = Candidate::new("me", LEASE);
    let Attempt::Create(spec) = me.plan(None, now, wall(0)) else {
        panic!("expected Create");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.acquire_time, Some(MicroTime(wall(0))));
    assert_eq!(spec.renew_time, Some(MicroTime(wall(0))));
}

#[test]
fn acquire_and_renew_table() {
    struct Case {
        name: &'static str,
        current: LeaseSpec,
        /// Seconds since we first saw `current` unchanged.
        observed_for: u64,
        want_held_by: Option<&'static str>,
        want_transitions: i32,
        want_acquired: i64,
    }
    let cases = [
        Case {
            name: "someone else's fresh lease is respected",
            current: held_by("other", 3, -5),
            observed_for: 5,
            want_held_by: Some("other"),
            want_transitions: 0,
            want_acquired: 0,
        },
        Case {
            name: "someone else's lease unchanged for a full duration is taken over",
            current: held_by("other", 3, -20),
            observed_for: 15,
            want_held_by: None,
            want_transitions: 4,
            want_acquired: 100,
        },
        Case {
            name: "our own lease is renewed, keeping acquire time and transitions",
            current: held_by("me", 7, -60),
            observed_for: 5,
            want_held_by: None,
            want_transitions: 7,
            want_acquired: -60,
        },
        Case {
            name: "a released lease (no holder) is taken at once",
            current: LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            },
            observed_for: 0,
            want_held_by: None,
            want_transitions: 3,
            want_acquired: 100,
        },
    ];
    for case in cases {
        let start = Instant::now();
        let mut me = Candidate::new("me", LEASE);
        // First observation starts the expiry clock; the decision happens `observed_for` later.
        let _ = me.plan(Some(&case.current), start, wall(100));
        let attempt = me.plan(
            Some(&case.current),
            start + Duration::from_secs(case.observed_for),
            wall(100),
        );
        match (attempt, case.want_held_by) {
            (Attempt::HeldBy(holder), Some(want)) => assert_eq!(holder, want, "{}", case.name),
            (Attempt::Update(spec), None) => {
                assert_eq!(spec.holder_identity.as_deref(), Some("me"), "{}", case.name);
                assert_eq!(
                    spec.lease_transitions,
                    Some(case.want_transitions),
                    "{}",
                    case.name
                );
                assert_eq!(
                    spec.acquire_time,
                    Some(MicroTime(wall(case.want_acquired))),
                    "{}",
                    case.name
                );
                assert_eq!(spec.renew_time, Some(MicroTime(wall(100))), "{}", case.name);
                assert_eq!(spec.lease_duration_seconds, Some(15), "{}", case.name);
            }
            (other, want) => panic!("{}: got {other:?}, want held by {want:?}", case.name),
        }
    }
}

#[test]
fn a_renewing_holder_is_never_taken_over() {
    // The record keeps changing (the holder renews), so our expiry clock keeps restarting,
    // whatever the wall-clock timestamps in it say (clock skew does not matter).
    let start = Instant::now();
    let mut me = Candidate::new("me", LEASE);
    for step in 0..10u64 {
        let current = held_by("other", 1, -1000 + step as i64);
        let now = start + Duration::from_secs(step * 10);
        assert_eq!(
            me.plan(Some(&current), now, wall(0)),
            Attempt::HeldBy("other".into())
        );
    }
}

/// A rolling upgrade changes `--leader-election-lease-duration`: a candidate with a short
/// duration judges the holder by the duration the holder wrote into the Lease, not its own, so
/// it does not take over (and lead alongside) while that lease is still valid.
#[test]
fn expiry_is_judged_by_the_duration_in_the_record() {
    let start = Instant::now();
    let mut long = Candidate::new("long", Duration::from_secs(60));
    let Attempt::Create(written) = long.plan(None, start, wall(0)) else {
        panic!("expected Create");
    };
    assert_eq!(written.lease_duration_seconds, Some(60));
    long.wrote(written.clone(), start);

    // The holder stops renewing (it hangs, or its node is partitioned).
    let mut short = Candidate::new("short", Duration::from_secs(15));
    let at = |seconds| start + Duration::from_secs(seconds);
    for seconds in [0, 15, 20, 59] {
        assert_eq!(
            short.plan(Some(&written), at(seconds), wall(0)),
            Attempt::HeldBy("long".into()),
            "{seconds}s after the last renewal the 60s lease is still valid"
        );
    }
    let Attempt::Update(taken) = short.plan(Some(&written), at(60), wall(60)) else {
        panic!("a 60s lease unchanged for 60s has expired");
    };
    assert_eq!(taken.holder_identity.as_deref(), Some("short"));
    assert_eq!(
        taken.lease_duration_seconds,
        Some(15),
        "the new holder writes its own duration"
    );

    // The other way round, the long candidate waits out the 15 s the short holder wrote.
    let mut long = Candidate::new("long", Duration::from_secs(60));
    assert_eq!(
        long.plan(Some(&taken), at(60), wall(60)),
        Attempt::HeldBy("short".into())
    );
    assert!(matches!(
        long.plan(Some(&taken), at(75), wall(75)),
        Attempt::Update(_)
    ));

    // A record without a duration has expired (client-go reads zero seconds).
    let without_duration = LeaseSpec {
        lease_duration_seconds: None,
        ..held_by("other", 1, 0)
    };
    let mut me = Candidate::new("me", LEASE);
    assert!(matches!(
        me.plan(Some(&without_duration), start, wall(0)),
        Attempt::Update(_)
    ));
}

#[test]
fn the_leader_renews_over_what_it_last_saw_while_that_is_unexpired() {
    let start = Instant::now();
    let at = |secs| start + Duration::from_secs(secs);
    let renewed = |transitions, acquired, renewed| LeaseSpec {
        renew_time: Some(MicroTime(wall(renewed))),
        ..held_by("me", transitions, acquired)
    };
    // (what the candidate last saw or wrote, seconds after that, the fast path's write)
    let cases = [
        ("nothing seen yet", None, 0, None),
        (
            "our lease",
            Some(held_by("me", 3, 0)),
            5,
            Some(renewed(3, 0, 5)),
        ),
        ("our lease, expired", Some(held_by("me", 3, 0)), 15, None),
        ("someone else's", Some(held_by("other", 3, 0)), 5, None),
    ];
    for (case, seen, after, want) in cases {
        let mut me = Candidate::new("me", LEASE);
        if let Some(seen) = seen {
            me.wrote(seen, start);
        }
        assert_eq!(me.renewal(at(after), wall(after as i64)), want, "{case}");
    }
}

#[test]
fn release_only_what_we_hold() {
    let now = Instant::now();
    let mut me = Candidate::new("me", LEASE);
    assert_eq!(me.release(wall(0)), None);
    me.wrote(held_by("me", 4, 0), now);
    let released = me.release(wall(9)).unwrap();
    assert_eq!(released.holder_identity, None);
    assert_eq!(released.lease_duration_seconds, Some(1));
    assert_eq!(released.lease_transitions, Some(4));
    me.wrote(held_by("other", 5, 0), now);
    assert_eq!(me.release(wall(9)), None);
}

#[test]
fn renewal_deadline() {
    let start = Instant::now();
    let deadline = Duration::from_secs(10);
    assert!(!renewal_expired(start, start, deadline));
    assert!(!renewal_expired(
        start,
        start + Duration::from_secs(9),
        deadline
    ));
    assert!(renewal_expired(
        start,
        start + Duration::from_secs(10),
        deadline
    ));
}

#[test]
fn health_check_fails_only_for_a_stale_leader() {
    let status = LeaderStatus::new(LEASE);
    let start = Instant::now();
    assert!(
        status.check_at(start + Duration::from_secs(3600)).is_ok(),
        "not leading is healthy"
    );
    status.set(true, Some(start));
    assert!(status.is_leader());
    assert!(
        status.check_at(start + Duration::from_secs(35)).is_ok(),
        "15s lease + 20s tolerance"
    );
    let error = status
        .check_at(start + Duration::from_secs(36))
        .unwrap_err();
    assert!(error.contains("failed to renew leadership"), "{error}");
    status.set(false, None);
    assert!(status.check_at(start + Duration::from_secs(36)).is_ok());
}

#[test]
fn master_status_follows_leadership() {
    let status = LeaderStatus::new(LEASE);
    let mut registry = Registry::default();
    status.register(&mut registry);
    let scrape = || csi_grpc::metrics::encode(&registry);
    assert!(
        !scrape().contains("leader_election_master_status{"),
        "no series before electing:\n{}",
        scrape()
    );
    status.set(false, None);
    assert!(
        scrape().contains("# HELP leader_election_master_status [ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.\n"),
        "component-base's help:\n{}",
        scrape()
    );
    for (leading, want) in [(false, 0), (true, 1), (false, 0)] {
        status.set(leading, leading.then(Instant::now));
        let line = format!("leader_election_master_status{{name=\"\"}} {want}\n");
        assert!(
            scrape().contains(&line),
            "{line:?} missing from\n{}",
            scrape()
        );
    }
    assert!(!scrape().contains("leader_election_slowpath_total{"));
    status.slowpath_exercised();
    assert!(
        scrape().contains("# HELP leader_election_slowpath_total [ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.\n# TYPE leader_election_slowpath_total counter\nleader_election_slowpath_total{name=\"\"} 1\n"),
        "{}",
        scrape()
    );
}

#[test]
fn lease_names_are_sanitized_like_csi_lib_utils() {
    let table = [
        ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
        (
            "external-attacher-leader-csi.example.com",
            "external-attacher-leader-csi-example-com",
        ),
        ("vendor/driver", "vendor-driver"),
        ("driver.", "driver-X"),
        ("Mixed_Case", "Mixed-Case"),
        ("node-1.example.com", "node-1-example-com"),
    ];
    for (input, want) in table {
        assert_eq!(sanitize_name(input), want);
    }
}

#[test]
fn namespace_resolution_order() {
    let table = [
        (("ns-flag", Some("ns-env"), Some("ns-sa\n")), "ns-flag"),
        (("", Some("ns-env"), Some("ns-sa\n")), "ns-env"),
        (("", None, Some("ns-sa\n")), "ns-sa"),
        (("", Some(""), None), "default"),
        (("", None, None), "default"),
    ];
    for ((flag, env, sa), want) in table {
        assert_eq!(
            resolve_namespace(flag, env.map(String::from), sa.map(String::from)),
            want
        );
    }
}

#[test]
fn timings_are_checked_like_client_go() {
    let ok = LeaderElectionTimings {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(5),
    };
    assert!(ok.validate().is_ok());
    let short_lease = LeaderElectionTimings {
        lease_duration: Duration::from_secs(10),
        ..ok
    };
    assert!(
        short_lease
            .validate()
            .unwrap_err()
            .contains("lease duration (10s)")
    );
    let slow_retry = LeaderElectionTimings {
        retry_period: Duration::from_secs(9),
        ..ok
    };
    assert!(
        slow_retry
            .validate()
            .unwrap_err()
            .contains("1.2 x the retry period (9s)")
    );
    let zero = LeaderElectionTimings {
        retry_period: Duration::ZERO,
        ..ok
    };
    assert!(zero.validate().is_err());
}

#[test]
fn jitter_stays_within_client_go_bounds() {
    for _ in 0..100 {
        let jittered = jittered(Duration::from_secs(5));
        assert!(
            jittered >= Duration::from_secs(5) && jittered < Duration::from_secs(6),
            "{jittered:?}"
        );
    }
}
