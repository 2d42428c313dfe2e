use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use csi_kinds::cached::{CachedAttachment, CachedClaim, CachedVolume};
use csi_kinds::volume_attachment::NODE_ID_ANNOTATION;
use serde_json::{Value, json};

use super::*;

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
    let mut forged = node(&[(FENCED, NO_SCHEDULE)]);
    forged.metadata.name = Some("n2".into());
    let offline = node(&[(OFFLINE, NO_SCHEDULE)]);
    let not_ready_taint = node(&[("node.kubernetes.io/not-ready", NO_EXECUTE)]);
    let healthy = node(&[]);
    let tainted_by_us: BTreeSet<String> = ["n1".to_string()].into();
    let fenced = FencedTaint {
        key: FENCED,
        ours: &tainted_by_us,
    };
    let clean = |n: &Node| PodAction::CleanUp(NodeSignals::of(n, &fenced));
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
            Some(&forged),
            PodAction::Nothing,
            "our taint's key on a node podmon did not taint: no evidence (node-podmon may write it)",
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
        assert_eq!(pod_action(&pod, node, &fenced), expected, "{why}");
    }
    let mut unscheduled = pod("False", false, "Pending");
    unscheduled.spec.as_mut().unwrap().node_name = None;
    assert_eq!(
        pod_action(&unscheduled, Some(&unreachable), &fenced),
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
        (0, 0.3333, 1),
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
fn the_circuit_breaker_counts_the_nodes_running_the_driver() {
    let csi_node = |name: &str, drivers: &[&str]| -> Arc<CSINode> {
        let drivers: Vec<_> = drivers
            .iter()
            .map(|d| json!({"name": d, "nodeID": name}))
            .collect();
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}),
            )
            .unwrap(),
        )
    };
    for (csi_nodes, expected, why) in [
        (vec![], 0, "no CSINode yet: the limit falls to one node"),
        (
            vec![
                csi_node("a", &[DRIVER]),
                csi_node("b", &[DRIVER, "other.csi.io"]),
            ],
            2,
            "every node with the driver",
        ),
        (
            vec![
                csi_node("a", &[DRIVER]),
                csi_node("b", &["other.csi.io"]),
                csi_node("c", &[]),
            ],
            1,
            "nodes of other drivers or none do not raise the limit",
        ),
    ] {
        assert_eq!(driver_node_count(&csi_nodes, DRIVER), expected, "{why}");
    }
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

// The pass and the cleanup plans, on a world of cached objects.

const DRIVER: &str = "hostpath.csi-suite.io";

/// The cached objects by name, as the controller's stores hold them.
#[derive(Default)]
struct World {
    nodes: BTreeMap<String, Arc<Node>>,
    claims: BTreeMap<(String, String), Arc<CachedClaim>>,
    volumes: BTreeMap<String, Arc<CachedVolume>>,
    csi_nodes: BTreeMap<String, Arc<CSINode>>,
}

impl Objects for World {
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).cloned()
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<CachedClaim>> {
        self.claims
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn volume(&self, name: &str) -> Option<Arc<CachedVolume>> {
        self.volumes.get(name).cloned()
    }

    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csi_nodes.get(name).cloned()
    }
}

impl World {
    fn with_node(mut self, name: &str, taints: &[(&str, &str)], annotations: Value) -> Self {
        let taints: Vec<_> = taints
            .iter()
            .map(|(k, e)| json!({"key": k, "effect": e}))
            .collect();
        let node = json!({"metadata": {"name": name, "annotations": annotations}, "spec": {"taints": taints}});
        self.nodes
            .insert(name.into(), Arc::new(serde_json::from_value(node).unwrap()));
        self
    }

    /// Claim `claim` in `ns` bound to PV `pv` of `driver` (`modes` its access modes).
    fn with_volume(mut self, claim: &str, pv: &str, driver: &str, modes: &[&str]) -> Self {
        let pvc =
            json!({"metadata": {"name": claim, "namespace": "ns"}, "spec": {"volumeName": pv}});
        self.claims.insert(
            ("ns".into(), claim.into()),
            Arc::new(serde_json::from_value(pvc).unwrap()),
        );
        let pv_object = json!({"metadata": {"name": pv}, "spec": {
            "accessModes": modes,
            "csi": {"driver": driver, "volumeHandle": format!("handle-{pv}"),
                    "controllerPublishSecretRef": {"name": "s", "namespace": "sns"}}}});
        self.volumes.insert(
            pv.into(),
            Arc::new(serde_json::from_value(pv_object).unwrap()),
        );
        self
    }

    fn with_csi_node(mut self, name: &str, id: &str) -> Self {
        let csi_node = json!({"metadata": {"name": name}, "spec": {"drivers": [{"name": DRIVER, "nodeID": id}]}});
        self.csi_nodes.insert(
            name.into(),
            Arc::new(serde_json::from_value(csi_node).unwrap()),
        );
        self
    }
}

/// A protected pod `name` (uid `uid-<name>`) on `node`, Ready or not, using `claims`.
fn pod_on(name: &str, node: &str, ready: bool, claims: &[&str]) -> Arc<Pod> {
    let volumes: Vec<_> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let ready = if ready { "True" } else { "False" };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "c"}], "volumes": volumes},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap(),
    )
}

fn crash_looping_on(name: &str, node: &str) -> Arc<Pod> {
    let mut pod = pod("False", true, "Running");
    pod.metadata.name = Some(name.into());
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod.spec.as_mut().unwrap().node_name = Some(node.into());
    Arc::new(pod)
}

fn attachment(name: &str, node: &str, pv: &str, node_id: Option<&str>) -> Arc<CachedAttachment> {
    let annotations = node_id.map_or(json!({}), |id| json!({NODE_ID_ANNOTATION: id}));
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}},
        }))
        .unwrap(),
    )
}

fn names(pods: &[Arc<Pod>]) -> Vec<String> {
    pods.iter().map(|p| key(p)).collect()
}

fn unreachable_signals() -> NodeSignals {
    NodeSignals {
        unreachable_no_schedule: true,
        ..NodeSignals::default()
    }
}

#[test]
fn pods_group_by_node_and_a_node_failure_wins_over_connectivity_loss() {
    let world = World::default()
        .with_node("failed", &[(UNREACHABLE_TAINT, NO_SCHEDULE)], json!({}))
        .with_node("lost", &[], json!({}))
        .with_node("healthy", &[], json!({}))
        .with_volume("c1", "pv1", DRIVER, &["ReadWriteOnce"])
        .with_volume("other", "pv-other", "other.driver", &["ReadWriteOnce"]);
    let disconnected: BTreeSet<String> = ["lost".to_string(), "failed".to_string()].into();
    for (pods, cleaned, expected, crash, ready, why) in [
        (
            vec![
                pod_on("a", "failed", false, &[]),
                pod_on("b", "healthy", false, &[]),
            ],
            vec![],
            vec![("failed", Trigger::NodeFailure, vec!["ns/a"])],
            vec![],
            vec![],
            "not Ready on a failed node only",
        ),
        (
            vec![
                pod_on("a", "lost", true, &["c1"]),
                pod_on("b", "lost", true, &[]),
                pod_on("c", "lost", true, &["other"]),
            ],
            vec![],
            vec![("lost", Trigger::ArrayConnectivityLoss, vec!["ns/a"])],
            vec![],
            vec!["ns/a", "ns/b", "ns/c"],
            "connectivity loss moves Ready pods with our volumes only",
        ),
        (
            vec![
                pod_on("r", "failed", true, &["c1"]),
                pod_on("f", "failed", false, &[]),
            ],
            vec![],
            vec![("failed", Trigger::NodeFailure, vec!["ns/f"])],
            vec![],
            vec!["ns/r"],
            "a node failure replaces the connectivity group, its Ready pods wait",
        ),
        (
            vec![
                pod_on("f", "failed", false, &[]),
                pod_on("r", "failed", true, &["c1"]),
                pod_on("g", "failed", false, &["c1"]),
            ],
            vec![],
            vec![("failed", Trigger::NodeFailure, vec!["ns/f", "ns/g"])],
            vec![],
            vec!["ns/r"],
            "in any order",
        ),
        (
            vec![
                pod_on("a", "failed", false, &[]),
                pod_on("b", "failed", false, &[]),
            ],
            vec!["uid-a"],
            vec![("failed", Trigger::NodeFailure, vec!["ns/b"])],
            vec![],
            vec![],
            "force-deleted pods are not looked at again",
        ),
        (
            vec![
                crash_looping_on("cl", "healthy"),
                crash_looping_on("cf", "failed"),
            ],
            vec![],
            vec![("failed", Trigger::NodeFailure, vec!["ns/cf"])],
            vec!["ns/cl"],
            vec![],
            "crash loops on healthy nodes only",
        ),
    ] {
        let cleaned: HashSet<String> = cleaned.into_iter().map(String::from).collect();
        let fenced = FencedTaint {
            key: FENCED,
            ours: &BTreeSet::new(),
        };
        let groups = node_groups(&pods, &cleaned, &disconnected, &world, DRIVER, &fenced);
        let found: Vec<_> = groups
            .nodes
            .iter()
            .map(|(node, g)| (node.as_str(), g.trigger, names(&g.pods)))
            .collect();
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(n, t, p)| (n, t, p.into_iter().map(String::from).collect::<Vec<_>>()))
            .collect();
        assert_eq!(found, expected, "{why}");
        assert_eq!(names(&groups.crash_looping), crash, "{why}");
        assert_eq!(groups.ready, ready, "{why}");
    }
}

/// A pass's input over `pods` with `nodes` nodes in all, `fenced` of them fenced.
fn pass_input<'a>(
    pods: &'a [Arc<Pod>],
    fenced: &'a BTreeSet<String>,
    node_count: usize,
    maintenance: bool,
) -> PassInput<'a> {
    PassInput {
        pods,
        fenced_nodes: fenced,
        node_count,
        maintenance,
        max_evacuated_fraction: 0.5,
        loss_threshold: 3,
        driver: DRIVER,
        fenced_key: FENCED,
    }
}

/// The actions of a pass in short: `hold node: why` / `clean node` / `delete ns/name`.
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::DeleteCrashLooping(pod) => format!("delete {}", key(pod)),
            Action::Hold { node, why, .. } => format!("hold {node}: {why}"),
            Action::CleanUp { node, .. } => format!("clean {node}"),
        })
        .collect()
}

/// The memory of a controller whose driver serves the podmon extension.
fn served() -> Memory {
    Memory {
        extension: Extension::Served,
        ..Memory::default()
    }
}

#[test]
fn a_pass_holds_or_starts_each_failed_nodes_cleanup() {
    let now = Instant::now();
    let unreachable = [(UNREACHABLE_TAINT, NO_SCHEDULE)];
    let world = World::default()
        .with_node("n1", &unreachable, json!({}))
        .with_node("n2", &unreachable, json!({}))
        .with_node("n3", &unreachable, json!({MAINTENANCE_ANNOTATION: "True"}))
        .with_node("n4", &[], json!({}));
    let pods = vec![
        pod_on("a", "n1", false, &[]),
        pod_on("b", "n2", false, &[]),
        pod_on("c", "n3", false, &[]),
    ];
    let none = BTreeSet::new();
    let fenced_n4: BTreeSet<String> = ["n4".to_string()].into();
    for (mut memory, input, expected, why) in [
        (
            Memory::default(),
            pass_input(&pods, &none, 4, false),
            vec![
                "hold n1: the driver has not said yet whether it serves the podmon extension",
                "hold n2: the driver has not said yet whether it serves the podmon extension",
                "hold n3: the driver has not said yet whether it serves the podmon extension",
            ],
            "no cleanup until the driver says whether it serves the extension",
        ),
        (
            served(),
            pass_input(&pods, &none, 4, true),
            vec![
                "hold n1: maintenance: PODMON_MAINTENANCE is on",
                "hold n2: maintenance: PODMON_MAINTENANCE is on",
                "hold n3: maintenance: PODMON_MAINTENANCE is on",
            ],
            "maintenance holds every node",
        ),
        (
            served(),
            pass_input(&pods, &none, 4, false),
            vec![
                "clean n1",
                "clean n2",
                "hold n3: maintenance: the node is annotated for maintenance",
            ],
            "two of four nodes may be evacuated; the annotated node waits",
        ),
        (
            served(),
            pass_input(&pods, &fenced_n4, 4, false),
            vec![
                "clean n1",
                "hold n2: circuit breaker: 2 of 4 nodes already evacuated (limit 2)",
                "hold n3: maintenance: the node is annotated for maintenance",
            ],
            "a fenced node counts against the breaker",
        ),
        (
            Memory {
                fenced: [("n4".to_string(), (BTreeSet::new(), now))].into(),
                ..served()
            },
            pass_input(&pods, &none, 4, false),
            vec![
                "clean n1",
                "hold n2: circuit breaker: 2 of 4 nodes already evacuated (limit 2)",
                "hold n3: maintenance: the node is annotated for maintenance",
            ],
            "a node just cleaned counts before the cache shows its taint",
        ),
        (
            Memory {
                busy: ["n1".to_string()].into(),
                backoff: [("n2".to_string(), (now + Duration::from_secs(1), 1))].into(),
                held: ["n3".to_string()].into(),
                ..served()
            },
            pass_input(&pods, &none, 4, false),
            vec![],
            "running, backing off, or already reported held: nothing to do",
        ),
        (
            Memory {
                backoff: [("n2".to_string(), (now, 1))].into(),
                held: ["n1".to_string(), "n3".to_string()].into(),
                ..served()
            },
            pass_input(&pods, &none, 4, false),
            vec!["clean n1", "clean n2"],
            "a backoff that is over and a hold that lifted",
        ),
    ] {
        let actions = pass(&mut memory, &input, &world, now);
        assert_eq!(summary(&actions), expected, "{why}");
        for action in &actions {
            if let Action::CleanUp { node, .. } = action {
                assert!(memory.busy.contains(node), "{why}: {node} is busy");
                assert!(
                    !memory.held.contains(node),
                    "{why}: {node} is no longer held"
                );
            }
            if let Action::Hold { node, .. } = action {
                assert!(memory.held.contains(node), "{why}: {node} is reported held");
            }
        }
    }
}

#[test]
fn a_fenced_taint_starts_a_cleanup_only_on_a_node_this_controller_tainted() {
    let now = Instant::now();
    let fenced_taint = [(FENCED, NO_SCHEDULE)];
    // Both nodes Ready by Kubernetes' account; node-podmon could have written the taint on
    // either (without the chart's admission policy, any node-podmon on any Node).
    let world = World::default()
        .with_node("ours", &fenced_taint, json!({}))
        .with_node("forged", &fenced_taint, json!({}));
    let pods = vec![
        pod_on("a", "ours", false, &[]),
        pod_on("b", "forged", false, &[]),
    ];
    let tainted: BTreeSet<String> = ["ours".to_string(), "forged".to_string()].into();
    let mut remembering = served();
    remembering.tainted("ours", &["pv1".to_string()].into(), now);
    for (mut memory, expected, why) in [
        (
            remembering,
            vec!["clean ours"],
            "our own taint: its pods that are not Ready are cleaned up",
        ),
        (
            served(),
            vec![],
            "after a restart no fenced taint is believed: the unreachable taint must come again",
        ),
    ] {
        let input = pass_input(&pods, &tainted, 10, false);
        let actions = pass(&mut memory, &input, &world, now);
        assert_eq!(summary(&actions), expected, "{why}");
        for action in actions {
            let Action::CleanUp { group, .. } = action else {
                continue;
            };
            assert!(group.signals.podmon, "{why}");
            assert_eq!(
                validation_allows(
                    group.trigger,
                    Connectivity::Answer {
                        connected: true,
                        ios_in_progress: false
                    },
                    false,
                    group.signals,
                    false
                ),
                Ok(()),
                "{why}: the driver's \"connected\" is not believed on a node we fenced"
            );
        }
    }
    let world = world.with_node("failed", &[(UNREACHABLE_TAINT, NO_SCHEDULE)], json!({}));
    let pods = vec![pod_on("c", "failed", false, &[])];
    assert_eq!(
        summary(&pass(
            &mut served(),
            &pass_input(&pods, &tainted, 4, false),
            &world,
            now
        )),
        ["hold failed: circuit breaker: 2 of 4 nodes already evacuated (limit 2)"],
        "every fenced taint counts against the breaker: a forged one may hold a cleanup, never start one"
    );
}

#[test]
fn a_pass_deletes_a_crash_looping_pod_at_most_once_per_incarnation_and_forgets_the_gone() {
    let now = Instant::now();
    let world = World::default().with_node("n1", &[], json!({}));
    let none = BTreeSet::new();
    let looping = vec![crash_looping_on("p", "n1")];
    let mut memory = Memory::default();
    let input = pass_input(&looping, &none, 1, false);
    assert_eq!(
        summary(&pass(&mut memory, &input, &world, now)),
        ["delete ns/p"]
    );
    assert!(
        pass(&mut memory, &input, &world, now).is_empty(),
        "the same incarnation"
    );
    let ready = vec![pod_on("p", "n1", true, &[])];
    pass(
        &mut memory,
        &pass_input(&ready, &none, 1, false),
        &world,
        now,
    );
    assert!(
        memory.crash_deletes.is_empty(),
        "Ready again: the count is reset"
    );

    memory
        .crash_deletes
        .insert("ns/gone".into(), (CrashLoopDeletes::default(), now));
    memory.cleaned.insert("uid-gone".into());
    let later = now + CRASH_LOOP_MEMORY;
    pass(&mut memory, &pass_input(&[], &none, 1, false), &world, now);
    assert!(
        memory.crash_deletes.contains_key("ns/gone"),
        "remembered a while"
    );
    assert!(
        memory.cleaned.is_empty(),
        "a force-deleted pod the cache no longer shows"
    );
    pass(
        &mut memory,
        &pass_input(&[], &none, 1, false),
        &world,
        later,
    );
    assert!(memory.crash_deletes.is_empty(), "then forgotten");
}

#[test]
fn a_cleanups_outcome_sets_the_backoff_the_loss_count_and_the_fences() {
    let now = Instant::now();
    let (start, max) = (Duration::from_secs(1), Duration::from_secs(5));
    let mut memory = Memory::default();
    memory.loss.insert("n1".into(), 3);
    let delays: Vec<u64> = (0..5)
        .map(|_| {
            memory.busy.insert("n1".into());
            memory.cleanup_failed("n1", now, start, max).as_secs()
        })
        .collect();
    assert_eq!(delays, [1, 2, 4, 5, 5]);
    assert_eq!(memory.backoff["n1"], (now + max, 5));
    assert!(memory.busy.is_empty());
    assert!(
        !memory.cleanup_succeeded("n1", vec![]),
        "nothing left: no failover"
    );
    assert!(memory.backoff.is_empty() && memory.loss.is_empty());
    assert!(
        memory.fenced.is_empty(),
        "a cleanup that tainted nothing makes no taint ours"
    );
    let later = now + Duration::from_secs(1);
    memory.tainted("n1", &["pv1".to_string()].into(), later);
    assert!(memory.cleanup_succeeded("n1", vec!["u1".into()]));
    assert!(memory.cleaned.contains("u1"));
    assert_eq!(memory.fenced["n1"], (["pv1".to_string()].into(), later));

    let fenced_nodes: BTreeSet<String> = BTreeSet::new();
    assert_eq!(
        memory
            .kept_fences(&fenced_nodes, later + TAINT_CACHE_GRACE / 2)
            .len(),
        1,
        "until the cache shows the taint"
    );
    assert!(
        memory
            .kept_fences(&fenced_nodes, later + TAINT_CACHE_GRACE)
            .is_empty(),
        "then only while tainted"
    );
    memory.tainted("n1", &["pv1".to_string()].into(), now);
    let tainted: BTreeSet<String> = ["n1".to_string()].into();
    assert_eq!(
        memory.kept_fences(&tainted, now + CRASH_LOOP_MEMORY).len(),
        1,
        "kept while tainted"
    );
}

#[test]
fn connectivity_samples_count_up_and_reset() {
    let mut memory = Memory::default();
    for (connected, plugin_up, count) in [
        (false, true, 1),
        (false, true, 2),
        (false, false, 0),
        (false, true, 1),
        (true, true, 0),
    ] {
        assert_eq!(memory.record_sample("n1", connected, plugin_up), count);
        assert_eq!(memory.loss.get("n1").copied().unwrap_or(0), count);
    }
}

#[test]
fn the_node_id_comes_from_an_attachment_then_the_csi_node_then_the_node_annotation() {
    let world = World::default()
        .with_node(
            "n1",
            &[],
            json!({NODE_IDS_ANNOTATION: format!("{{\"{DRIVER}\":\"from-node\",\"x\":\"y\"}}")}),
        )
        .with_node("n2", &[], json!({NODE_IDS_ANNOTATION: "not json"}))
        .with_csi_node("n1", "from-csi-node")
        .with_csi_node("n3", "");
    let annotated = [attachment("va", "n1", "pv1", Some("from-va"))];
    let blank = [attachment("va", "n1", "pv1", Some(""))];
    for (node, attachments, expected) in [
        ("n1", &annotated[..], Some("from-va")),
        ("n1", &blank[..], Some("from-csi-node")),
        ("n1", &[][..], Some("from-csi-node")),
        ("n2", &[][..], None),
        ("n3", &[][..], None),
        ("unknown", &[][..], None),
    ] {
        let id = node_id(
            DRIVER,
            attachments,
            world.csi_node(node).as_deref(),
            world.node(node).as_deref(),
        );
        assert_eq!(id.as_deref(), expected, "{node}");
    }
    let without_csi_node = World::default().with_node(
        "n1",
        &[],
        json!({NODE_IDS_ANNOTATION: format!("{{\"{DRIVER}\":\"from-node\"}}")}),
    );
    assert_eq!(
        node_id(DRIVER, &[], None, without_csi_node.node("n1").as_deref()).as_deref(),
        Some("from-node")
    );
}

/// A world with a failed node n1 (CSINode ID `id-1`) and a volume pv1 (claim c1), pv2 (c2).
fn failed_world() -> World {
    World::default()
        .with_node("n1", &[(UNREACHABLE_TAINT, NO_SCHEDULE)], json!({}))
        .with_csi_node("n1", "id-1")
        .with_volume("c1", "pv1", DRIVER, &["ReadWriteOnce"])
        .with_volume("c2", "pv2", DRIVER, &["ReadWriteMany"])
}

fn group(trigger: Trigger, pods: &[Arc<Pod>]) -> Group {
    Group {
        trigger,
        signals: unreachable_signals(),
        pods: pods.to_vec(),
    }
}

/// The steps in short.
fn step_names(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Step::Validate { request, rwx } => {
                format!(
                    "validate {} {:?} rwx={rwx}",
                    request.node_id, request.volume_ids
                )
            }
            Step::ConfirmLive(recheck) => format!("confirm node={}", recheck.node.is_some()),
            Step::DeleteAttachments(names) => format!("delete {names:?}"),
            Step::Fence {
                pv,
                request,
                secret,
            } => format!(
                "fence {pv} {} {} secret={}",
                request.volume_id,
                request.node_id,
                secret.as_ref().map_or("", |s| &s.name)
            ),
            Step::CannotFence => "cannot fence".into(),
            Step::Taint => "taint".into(),
            Step::ForceDelete(recheck) => format!("force delete node={}", recheck.node.is_some()),
        })
        .collect()
}

#[test]
fn a_cleanup_validates_confirms_deletes_attachments_fences_taints_and_force_deletes_in_order() {
    let world = failed_world();
    let a = pod_on("a", "n1", false, &["c1"]);
    let va_name = csi_kinds::kubelet_paths::attachment_name("handle-pv1", DRIVER, "n1");
    let computed = format!("{va_name:?}");
    let cached = [attachment("cached-va", "n1", "pv1", None)];
    let cached_names = format!("{{\"cached-va\", {computed}}}");
    for (trigger, extension, can_fence, attachments, expected, why) in [
        (
            Trigger::NodeFailure,
            Extension::Served,
            true,
            &[][..],
            vec![
                "validate id-1 [\"handle-pv1\"] rwx=false".to_string(),
                "confirm node=true".into(),
                format!("delete {{{computed}}}"),
                "fence pv1 handle-pv1 id-1 secret=s".into(),
                "taint".into(),
                "force delete node=true".into(),
            ],
            "the whole story",
        ),
        (
            Trigger::NodeFailure,
            Extension::NotServed,
            true,
            &cached[..],
            vec![
                "confirm node=true".to_string(),
                format!("delete {cached_names}"),
                "fence pv1 handle-pv1 id-1 secret=s".into(),
                "taint".into(),
                "force delete node=true".into(),
            ],
            "without the extension nothing to ask; a cached attachment goes too",
        ),
        (
            Trigger::ArrayConnectivityLoss,
            Extension::Served,
            false,
            &[][..],
            vec![
                "validate id-1 [\"handle-pv1\"] rwx=false".to_string(),
                "confirm node=false".into(),
                format!("delete {{{computed}}}"),
                "cannot fence".into(),
                "taint".into(),
                "force delete node=false".into(),
            ],
            "a node Kubernetes sees Ready is not rechecked; no fencing without the capability",
        ),
    ] {
        let group = group(trigger, std::slice::from_ref(&a));
        let input = CleanupInput {
            node: "n1",
            group: &group,
            extension,
            pods: std::slice::from_ref(&a),
            attachments,
            driver: DRIVER,
            can_fence,
            ignore_volumeless_pods: false,
        };
        let plan = cleanup(&input, &world).unwrap();
        assert_eq!(step_names(&plan.steps), expected, "{why}");
        assert_eq!(plan.pods.keys().collect::<Vec<_>>(), ["ns/a"], "{why}");
        assert_eq!(plan.volumes, ["pv1".to_string()].into(), "{why}");
    }
}

#[test]
fn a_cleanup_takes_the_pods_sharing_a_volume_and_leaves_out_the_replaced() {
    let world = failed_world().with_volume("c3", "pv3", DRIVER, &["ReadWriteOnce"]);
    let a = pod_on("a", "n1", false, &["c1"]);
    let sharer = pod_on("s", "n1", true, &["c1", "c2"]);
    let bystander = pod_on("b", "n1", true, &["c3"]);
    let volumeless = pod_on("v", "n1", false, &[]);
    let elsewhere = pod_on("e", "n2", false, &["c1"]);
    let mut replaced = (*pod_on("r", "n1", false, &["c3"])).clone();
    replaced.metadata.uid = Some("new".into());
    let cached = vec![
        a.clone(),
        sharer.clone(),
        bystander.clone(),
        volumeless.clone(),
        elsewhere.clone(),
        Arc::new(replaced),
    ];
    let decided = [
        a.clone(),
        volumeless.clone(),
        pod_on("r", "n1", false, &["c3"]),
    ];
    for (ignore_volumeless_pods, pods, volumes, why) in [
        (
            false,
            vec!["ns/a", "ns/s", "ns/v"],
            vec!["pv1"],
            "a sharer joins; a replaced pod and pods elsewhere do not",
        ),
        (
            true,
            vec!["ns/a", "ns/s"],
            vec!["pv1"],
            "--ignoreVolumelessPods",
        ),
    ] {
        let group = group(Trigger::NodeFailure, &decided);
        let input = CleanupInput {
            node: "n1",
            group: &group,
            extension: Extension::NotServed,
            pods: &cached,
            attachments: &[],
            driver: DRIVER,
            can_fence: true,
            ignore_volumeless_pods,
        };
        let plan = cleanup(&input, &world).unwrap();
        assert_eq!(plan.pods.keys().collect::<Vec<_>>(), pods, "{why}");
        assert_eq!(plan.volumes.iter().collect::<Vec<_>>(), volumes, "{why}");
        let validate = plan.steps.iter().find_map(|s| match s {
            Step::Validate { rwx, .. } => Some(*rwx),
            _ => None,
        });
        assert_eq!(validate, None, "{why}: the extension is not served");
    }
}

#[test]
fn a_cleanup_refuses_without_node_id_or_cached_volume_and_does_nothing_without_pods() {
    let world = World::default()
        .with_node("n1", &[(UNREACHABLE_TAINT, NO_SCHEDULE)], json!({}))
        .with_volume("c1", "pv1", DRIVER, &["ReadWriteMany"]);
    let mut unknown_pv = failed_world();
    unknown_pv.volumes.clear();
    let a = pod_on("a", "n1", false, &["c1"]);
    let volumeless = pod_on("v", "n1", false, &[]);
    let rwx = failed_world().with_volume("c1", "pv1", DRIVER, &["ReadWriteMany"]);
    type Case<'a> = (
        &'a World,
        &'a Arc<Pod>,
        bool,
        Result<Vec<&'a str>, Refusal>,
        &'a str,
    );
    let cases: [Case; 4] = [
        (
            &world,
            &a,
            false,
            Err(Refusal::MissingNodeId),
            "no node ID anywhere",
        ),
        (
            &unknown_pv,
            &a,
            false,
            Err(Refusal::UnknownVolume {
                pv: "pv1".into(),
                pod: "ns/a".into(),
            }),
            "a bound PV not cached yet",
        ),
        (
            &world,
            &volumeless,
            true,
            Ok(vec![]),
            "no pod left: nothing to do",
        ),
        (
            &rwx,
            &a,
            false,
            Ok(vec!["validate id-1 [\"handle-pv1\"] rwx=true"]),
            "a ReadWriteMany volume",
        ),
    ];
    for (world, pod, ignore_volumeless_pods, expected, why) in cases {
        let group = group(Trigger::NodeFailure, std::slice::from_ref(pod));
        let input = CleanupInput {
            node: "n1",
            group: &group,
            extension: Extension::Served,
            pods: std::slice::from_ref(pod),
            attachments: &[],
            driver: DRIVER,
            can_fence: true,
            ignore_volumeless_pods,
        };
        let outcome = cleanup(&input, world).map(|plan| {
            step_names(&plan.steps)
                .into_iter()
                .filter(|s| s.starts_with("validate"))
                .collect::<Vec<_>>()
        });
        let expected = expected.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(outcome, expected, "{why}");
    }
    assert_eq!(
        cleanup(
            &CleanupInput {
                node: "n1",
                group: &group(Trigger::NodeFailure, std::slice::from_ref(&volumeless)),
                extension: Extension::Served,
                pods: std::slice::from_ref(&volumeless),
                attachments: &[],
                driver: DRIVER,
                can_fence: true,
                ignore_volumeless_pods: true,
            },
            &world
        ),
        Ok(Cleanup::default())
    );
    assert!(Refusal::MissingNodeId.aborted() && Refusal::PodsChanged.aborted());
    assert!(
        !Refusal::UnknownVolume {
            pv: "p".into(),
            pod: "q".into()
        }
        .aborted()
    );
}

#[test]
fn every_pod_decided_on_must_be_confirmed_live() {
    let a = pod_on("a", "n1", false, &[]);
    let b = pod_on("b", "n1", false, &[]);
    let both: BTreeMap<String, Arc<Pod>> =
        [("ns/a".to_string(), a.clone()), ("ns/b".to_string(), b)].into();
    let one: BTreeMap<String, Arc<Pod>> = [("ns/a".to_string(), a)].into();
    assert_eq!(confirmed(&both, &both), Ok(()));
    assert_eq!(confirmed(&both, &one), Err(Refusal::PodsChanged));
}

#[test]
fn a_cleanup_taints_with_fenced_and_optionally_out_of_service() {
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let keys = |t: Option<Vec<Taint>>| {
        t.map(|t| {
            t.into_iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect::<Vec<_>>()
        })
    };
    let fenced = format!("{FENCED}:{NO_SCHEDULE}");
    let oos = format!("{OUT_OF_SERVICE_TAINT}:{NO_EXECUTE}");
    let bare = taints(&node(&[]));
    let has_fenced = taints(&node(&[(FENCED, NO_SCHEDULE)]));
    let has_both = taints(&node(&[
        (FENCED, NO_SCHEDULE),
        (OUT_OF_SERVICE_TAINT, NO_EXECUTE),
    ]));
    for (current, out_of_service, expected) in [
        (&bare, false, Some(vec![fenced.clone()])),
        (&bare, true, Some(vec![oos.clone(), fenced.clone()])),
        (&has_fenced, false, None),
        (&has_fenced, true, Some(vec![oos.clone(), fenced.clone()])),
        (&has_both, true, None),
    ] {
        assert_eq!(
            keys(cleanup_taints(current, FENCED, out_of_service, &now)),
            expected
        );
    }
}

#[test]
fn only_aborted_unpublishes_are_retried_and_only_so_often() {
    for (code, attempt, retry) in [
        (tonic::Code::Aborted, 1, true),
        (tonic::Code::Aborted, PENDING_RETRIES - 1, true),
        (tonic::Code::Aborted, PENDING_RETRIES, false),
        (tonic::Code::Unavailable, 1, false),
        (tonic::Code::NotFound, 1, false),
    ] {
        assert_eq!(fence_retry(code, attempt), retry, "{code:?} #{attempt}");
    }
}

#[test]
fn reattached_fenced_volumes_no_pod_uses_are_detached_again() {
    let world = failed_world();
    let user = pod_on("u", "n1", true, &["c2"]);
    let mut deleting = (*attachment("deleting", "n1", "pv1", None)).clone();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let mut other_driver = (*attachment("other", "n1", "pv1", None)).clone();
    other_driver.spec.attacher = "other.driver".into();
    let attachments = [
        attachment("again", "n1", "pv1", None),
        attachment("in-use", "n1", "pv2", None),
        attachment("elsewhere", "n2", "pv1", None),
        attachment("not-fenced", "n1", "pv3", None),
        Arc::new(deleting),
        Arc::new(other_driver),
    ];
    let fences: BTreeMap<String, BTreeSet<String>> = [(
        "n1".to_string(),
        ["pv1".to_string(), "pv2".to_string()].into(),
    )]
    .into();
    let stale = refenced_attachments(&fences, &[user], &attachments, &world, DRIVER);
    let expected: BTreeMap<String, BTreeSet<String>> =
        [("n1".to_string(), ["again".to_string()].into())].into();
    assert_eq!(stale, expected);
}

#[test]
fn nodes_are_fenced_by_taint_and_driver_pods_make_a_node_ready() {
    let nodes = [
        Arc::new(node(&[(FENCED, NO_SCHEDULE)])),
        Arc::new({
            let mut n = node(&[(FENCED, NO_EXECUTE)]);
            n.metadata.name = Some("n2".into());
            n
        }),
    ];
    assert_eq!(fenced_nodes(&nodes, FENCED), ["n1".to_string()].into());
    let driver_pods = [
        pod_on("d1", "n1", false, &[]),
        pod_on("d2", "n1", true, &[]),
        pod_on("d3", "n2", false, &[]),
    ];
    let expected: BTreeMap<String, bool> =
        [("n1".to_string(), true), ("n2".to_string(), false)].into();
    assert_eq!(driver_readiness(&driver_pods), expected);
}
