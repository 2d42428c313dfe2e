use super::*;
use serde_json::json;

const FENCED: &str = "hostpath.podmon.storage/fenced";
const OFFLINE: &str = "hostpath.podmon.storage/driver-offline";

fn node(taints: &[(&str, &str)]) -> Node {
    let taints: Vec<_> = taints
        .iter()
        .map(|(k, e)| json!({"key": k, "effect": e}))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"taints": taints}})).unwrap()
}

fn pod(ready: &str, crash_loop: bool, phase: &str) -> Pod {
    let waiting = if crash_loop {
        json!({"waiting": {"reason": "CrashLoopBackOff"}})
    } else {
        json!({"running": {}})
    };
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}],
                   "containerStatuses": [{"name": "c", "ready": false, "restartCount": 3, "image": "i", "imageID": "", "state": waiting}]},
    }))
    .unwrap()
}

#[test]
fn taint_keys_derive_from_the_driver_name() {
    for (driver, short) in [
        ("hostpath.csi-suite.io", "hostpath"),
        ("csi-powerstore.dellemc.com", "csi-powerstore"),
        ("Ebs_CSI.aws.com", "ebs-csi"),
        ("...", "csi"),
    ] {
        assert_eq!(short_driver_name(driver), short, "{driver}");
    }
    assert_eq!(fenced_taint_key("hostpath.csi-suite.io"), FENCED);
    assert_eq!(offline_taint_key("hostpath.csi-suite.io"), OFFLINE);
    assert_eq!(
        lease_name("hostpath.csi-suite.io"),
        "podmon-hostpath.csi-suite.io"
    );
}

#[test]
fn the_trigger_is_not_ready_on_a_failed_node() {
    let unreachable = node(&[
        (UNREACHABLE_TAINT, NO_SCHEDULE),
        (UNREACHABLE_TAINT, NO_EXECUTE),
    ]);
    let no_schedule_only = node(&[(UNREACHABLE_TAINT, NO_SCHEDULE)]);
    let ours = node(&[(FENCED, NO_SCHEDULE)]);
    let offline = node(&[(OFFLINE, NO_SCHEDULE)]);
    let not_ready_taint = node(&[("node.kubernetes.io/not-ready", NO_EXECUTE)]);
    let healthy = node(&[]);
    let clean = |n: &Node| PodAction::CleanUp(NodeSignals::of(n, FENCED));
    let mut deleting = pod("False", false, "Running");
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    for (pod, node, expected, why) in [
        (
            pod("False", false, "Running"),
            Some(&unreachable),
            clean(&unreachable),
            "unreachable",
        ),
        (
            pod("False", false, "Running"),
            Some(&no_schedule_only),
            clean(&no_schedule_only),
            "unreachable NoSchedule only",
        ),
        (
            pod("False", false, "Running"),
            Some(&ours),
            clean(&ours),
            "our taint",
        ),
        (
            pod("False", false, "Running"),
            Some(&offline),
            PodAction::Nothing,
            "a driver plugin that is not Ready is no node failure",
        ),
        (
            deleting.clone(),
            Some(&unreachable),
            clean(&unreachable),
            "evicted on a failed node: Terminating until forced",
        ),
        (
            {
                let mut crash_looping = pod("False", true, "Running");
                crash_looping.metadata.deletion_timestamp =
                    deleting.metadata.deletion_timestamp.clone();
                crash_looping
            },
            Some(&healthy),
            PodAction::Nothing,
            "a crash-looping pod already being deleted",
        ),
        (
            pod("True", false, "Running"),
            Some(&unreachable),
            PodAction::Nothing,
            "ready pods are left alone",
        ),
        (
            pod("False", false, "Running"),
            Some(&not_ready_taint),
            PodAction::Nothing,
            "not-ready is not unreachable (Dell)",
        ),
        (
            pod("False", false, "Running"),
            Some(&healthy),
            PodAction::Nothing,
            "healthy node",
        ),
        (
            pod("False", false, "Running"),
            None,
            PodAction::Nothing,
            "unknown node: no evidence",
        ),
        (
            pod("False", false, "Succeeded"),
            Some(&unreachable),
            PodAction::Nothing,
            "finished pod",
        ),
        (
            pod("False", true, "Running"),
            Some(&healthy),
            PodAction::DeleteCrashLooping,
            "crash loop",
        ),
        (
            pod("False", true, "Running"),
            Some(&unreachable),
            clean(&unreachable),
            "a failed node wins over a crash loop",
        ),
        (
            pod("True", true, "Running"),
            Some(&healthy),
            PodAction::Nothing,
            "ready again",
        ),
    ] {
        assert_eq!(pod_action(&pod, node, FENCED), expected, "{why}");
    }
    let mut unscheduled = pod("False", false, "Pending");
    unscheduled.spec.as_mut().unwrap().node_name = None;
    assert_eq!(
        pod_action(&unscheduled, Some(&unreachable), FENCED),
        PodAction::Nothing
    );
    assert_eq!(
        clean(&unreachable),
        PodAction::CleanUp(NodeSignals {
            unreachable_no_schedule: true,
            unreachable_no_execute: true,
            podmon: false
        })
    );
}

#[test]
fn validation_follows_dells_rule() {
    let answer = |connected, ios_in_progress| Connectivity::Answer {
        connected,
        ios_in_progress,
    };
    let plain = NodeSignals {
        unreachable_no_schedule: true,
        ..Default::default()
    };
    let no_execute = NodeSignals {
        unreachable_no_execute: true,
        ..plain
    };
    let tainted = NodeSignals {
        podmon: true,
        ..plain
    };
    let failure = Trigger::NodeFailure;
    for (answer, rwx, signals, skip, allowed, why) in [
        (
            answer(false, false),
            false,
            plain,
            false,
            true,
            "disconnected, idle",
        ),
        (
            answer(true, false),
            false,
            plain,
            false,
            false,
            "still connected",
        ),
        (
            answer(false, true),
            false,
            plain,
            false,
            false,
            "I/O in progress",
        ),
        (
            answer(false, true),
            true,
            plain,
            false,
            true,
            "RWX ignores I/O",
        ),
        (
            answer(true, false),
            false,
            tainted,
            false,
            true,
            "our taint: connected is not believed",
        ),
        (
            answer(true, true),
            false,
            tainted,
            false,
            false,
            "our taint does not excuse I/O",
        ),
        (
            Connectivity::Error,
            false,
            plain,
            false,
            false,
            "error: never on doubt",
        ),
        (
            answer(true, true),
            false,
            no_execute,
            true,
            true,
            "skip with NoExecute",
        ),
        (
            Connectivity::Error,
            false,
            no_execute,
            true,
            true,
            "skip with NoExecute, error",
        ),
        (
            answer(true, false),
            false,
            plain,
            true,
            false,
            "skip needs NoExecute",
        ),
    ] {
        assert_eq!(
            validation_allows(failure, answer, rwx, signals, skip).is_ok(),
            allowed,
            "{why}"
        );
    }
    assert_eq!(
        validation_allows(failure, Connectivity::Error, false, plain, false),
        Err("due to error while validating volume host connectivity")
    );
}

#[test]
fn ready_pods_of_a_ready_node_move_only_when_the_driver_says_disconnected_and_idle() {
    let answer = |connected, ios_in_progress| Connectivity::Answer {
        connected,
        ios_in_progress,
    };
    let none = NodeSignals::default();
    let fenced = NodeSignals {
        podmon: true,
        ..none
    };
    let no_execute = NodeSignals {
        unreachable_no_execute: true,
        ..none
    };
    for (answer, rwx, signals, skip, allowed, why) in [
        (
            answer(false, false),
            false,
            none,
            false,
            true,
            "disconnected, idle",
        ),
        (answer(true, false), false, none, false, false, "connected"),
        (
            answer(true, false),
            false,
            fenced,
            false,
            false,
            "our taint does not make connected unbelievable here",
        ),
        (
            answer(false, true),
            true,
            none,
            false,
            false,
            "RWX I/O may be the Ready pod's own",
        ),
        (
            answer(true, true),
            false,
            no_execute,
            true,
            false,
            "skipArrayConnectionValidation does not apply",
        ),
        (
            Connectivity::Error,
            false,
            no_execute,
            true,
            false,
            "an error is no answer",
        ),
    ] {
        assert_eq!(
            validation_allows(Trigger::ArrayConnectivityLoss, answer, rwx, signals, skip).is_ok(),
            allowed,
            "{why}"
        );
    }
}

#[test]
fn a_silent_node_counts_only_while_its_driver_plugin_is_up() {
    for (previous, connected, plugin_up, expected, why) in [
        (0, false, true, 1, "first disconnected sample"),
        (2, false, true, 3, "one more"),
        (2, true, true, 0, "connected resets"),
        (2, false, false, 0, "plugin down: no evidence, reset"),
        (0, true, false, 0, "plugin down and connected"),
    ] {
        assert_eq!(
            loss_after_sample(previous, connected, plugin_up),
            expected,
            "{why}"
        );
    }
    let ready = pod("True", false, "Running");
    let not_ready = pod("False", false, "Running");
    let mut terminating = pod("True", false, "Running");
    terminating.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let offline = node(&[(OFFLINE, NO_SCHEDULE)]);
    let healthy = node(&[]);
    for (node, pods, expected, why) in [
        (Some(&healthy), vec![&ready], true, "a Ready driver pod"),
        (Some(&healthy), vec![&not_ready], false, "not Ready"),
        (Some(&healthy), vec![&terminating], false, "being replaced"),
        (
            Some(&healthy),
            vec![&terminating, &ready],
            true,
            "the new one is Ready",
        ),
        (Some(&offline), vec![&ready], false, "the offline taint"),
        (Some(&healthy), vec![], true, "no driver pods: cannot tell"),
        (None, vec![], true, "unknown node"),
    ] {
        assert_eq!(plugin_up(node, OFFLINE, pods), expected, "{why}");
    }
}

#[test]
fn the_live_node_and_pod_must_still_show_what_the_cleanup_was_decided_on() {
    let with_ready = |taints: &[(&str, &str)], ready: &str| {
        let mut n = node(taints);
        n.status = Some(
            serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": ready}]}))
                .unwrap(),
        );
        n
    };
    let unreachable = NodeSignals {
        unreachable_no_execute: true,
        ..Default::default()
    };
    let fenced = NodeSignals {
        podmon: true,
        ..Default::default()
    };
    for (decided, live, expected, why) in [
        (
            unreachable,
            with_ready(&[(UNREACHABLE_TAINT, NO_EXECUTE)], "Unknown"),
            Ok(()),
            "still unreachable",
        ),
        (
            unreachable,
            with_ready(
                &[(UNREACHABLE_TAINT, NO_EXECUTE), (FENCED, NO_SCHEDULE)],
                "Unknown",
            ),
            Ok(()),
            "still unreachable, tainted by this cleanup",
        ),
        (
            unreachable,
            with_ready(&[(FENCED, NO_SCHEDULE)], "Unknown"),
            Err("the node is no longer unreachable"),
            "our own fresh taint is no evidence",
        ),
        (
            unreachable,
            with_ready(&[(UNREACHABLE_TAINT, NO_EXECUTE)], "True"),
            Err("the node is Ready again"),
            "Ready before the taint went",
        ),
        (
            fenced,
            with_ready(&[(FENCED, NO_SCHEDULE)], "True"),
            Ok(()),
            "fenced before, still tainted",
        ),
        (
            fenced,
            with_ready(&[], "True"),
            Err("the node's podmon taint is gone"),
            "node-podmon cleaned it meanwhile",
        ),
    ] {
        assert_eq!(node_still_failed(decided, &live, FENCED), expected, "{why}");
    }

    let same = pod("False", false, "Running");
    let mut replaced = pod("False", false, "Running");
    replaced.metadata.uid = Some("u2".into());
    let mut deleting = pod("False", false, "Running");
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    for (live, expected) in [
        (Some(&same), Ok(())),
        (None, Err("the pod is gone")),
        (Some(&replaced), Err("the pod was replaced")),
        (Some(&deleting), Ok(())),
    ] {
        assert_eq!(pod_still_to_delete("u1", live), expected);
    }
}

#[test]
fn the_circuit_breaker_holds_beyond_the_fraction() {
    for (total, fraction, limit) in [
        (3, 0.3333, 1),
        (2, 0.3333, 1),
        (9, 0.3333, 2),
        (10, 0.5, 5),
        (4, 1.0, 4),
        (1, 0.1, 1),
        (6, 1.0 / 3.0, 2),
    ] {
        assert_eq!(
            evacuation_limit(total, fraction),
            limit,
            "{total} × {fraction}"
        );
    }
    assert!(breaker_allows("a", [], 3, 0.3333));
    assert!(
        !breaker_allows("b", ["a"], 3, 0.3333),
        "a second node of three is held"
    );
    assert!(
        breaker_allows("a", ["a"], 3, 0.3333),
        "the node already evacuated goes on"
    );
    assert!(breaker_allows("b", ["a"], 3, 1.0));
}

#[test]
fn taints_are_added_first_once_and_removed_by_key() {
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let current = taints(&node(&[(UNREACHABLE_TAINT, NO_EXECUTE)]));
    let added = with_taint(&current, FENCED, "", NO_SCHEDULE, now.clone()).unwrap();
    assert_eq!(
        added.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        [FENCED, UNREACHABLE_TAINT]
    );
    assert_eq!(added[0].value, None);
    assert_eq!(
        with_taint(&added, FENCED, "", NO_SCHEDULE, now.clone()),
        None
    );
    let out_of_service = with_taint(
        &added,
        OUT_OF_SERVICE_TAINT,
        OUT_OF_SERVICE_VALUE,
        NO_EXECUTE,
        now,
    )
    .unwrap();
    assert_eq!(out_of_service[0].value.as_deref(), Some("nodeshutdown"));
    assert_eq!(without_taint(&added, FENCED).unwrap(), current);
    assert_eq!(without_taint(&current, FENCED), None);
}

#[test]
fn a_remembered_pod_is_a_zombie_once_gone_or_replaced() {
    let current = pod("True", false, "Running");
    assert_eq!(judge("u1", Some(&current)), Remembered::StillThere);
    assert_eq!(judge("u0", Some(&current)), Remembered::Zombie);
    assert_eq!(judge("u1", None), Remembered::Zombie);
}

#[test]
fn claims_of_a_pod_include_generic_ephemeral_volumes() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app-0"},
        "spec": {"containers": [], "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-app-0"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            {"name": "config", "configMap": {"name": "c"}},
        ]},
    }))
    .unwrap();
    assert_eq!(claim_names(&pod), ["data-app-0", "app-0-scratch"]);
}

#[test]
fn a_crash_looping_pod_name_is_deleted_once_per_incarnation_at_most_five_times() {
    let mut deletes = CrashLoopDeletes::default();
    // A stale cache shows the deleted incarnation again: not a second delete.
    assert!(deletes.admit("u1"));
    assert!(!deletes.admit("u1"));
    for uid in ["u2", "u3", "u4", "u5"] {
        assert!(deletes.admit(uid), "{uid}");
    }
    assert!(!deletes.admit("u6"), "a sixth incarnation is left alone");
}

#[test]
fn only_unimplemented_means_the_extension_is_not_served() {
    for (outcome, expected) in [
        (Ok(()), Extension::Served),
        (Err(tonic::Code::Unimplemented), Extension::NotServed),
        (Err(tonic::Code::Unavailable), Extension::Unknown),
        (Err(tonic::Code::DeadlineExceeded), Extension::Unknown),
        (Err(tonic::Code::Internal), Extension::Unknown),
        (Err(tonic::Code::Cancelled), Extension::Unknown),
    ] {
        assert_eq!(Extension::from_probe(outcome), expected, "{outcome:?}");
    }
}

#[test]
fn other_pods_using_a_claim_count_protected_or_not_unless_finished() {
    let using = |name: &str, uid: &str, namespace: &str, claim: &str, phase: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
            ]},
            "status": {"phase": phase},
        }))
        .unwrap()
    };
    let pods = [
        using("zombie", "u1", "ns", "data", "Running"),
        using("unprotected", "u2", "ns", "data", "Running"),
        using("starting", "u3", "ns", "data", "Pending"),
        using("done", "u4", "ns", "data", "Succeeded"),
        using("elsewhere", "u5", "other", "data", "Running"),
        using("another-claim", "u6", "ns", "logs", "Running"),
    ];
    assert_eq!(
        pods_using_claim(&pods, "ns", "data", "u1"),
        ["ns/unprotected", "ns/starting"]
    );
    assert!(pods_using_claim(&pods[..1], "ns", "data", "u1").is_empty());
}
