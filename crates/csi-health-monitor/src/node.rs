//! The node watcher's plan (`--enable-node-watcher`): claims of the driver's volumes used by pods
//! on a node that failed get upstream's Warning `NodeFailed`, and `NodeRecovered` when the node
//! is Ready again.
//!
//! As upstream, a node has failed once its Ready condition has not been True for
//! [`NOT_READY_GRACE`] (a node without a Ready condition never fails), and its claims are told
//! with upstream's reasons and messages. Unlike upstream (whose first sighting starts the clock,
//! which repeats the Event every five minutes, and which crashes when a Node is deleted): the
//! clock is the condition's `lastTransitionTime`, each failure is told once, and a deleted Node
//! counts as failed.

use std::time::Duration;

/// Warning reason on each claim used on a failed node (upstream's).
pub const NODE_FAILED: &str = "NodeFailed";
/// Reason on each claim told of the failure once the node is Ready again (upstream's; a
/// Warning there too).
pub const NODE_RECOVERED: &str = "NodeRecovered";
/// How long a node is NotReady before it counts as failed (upstream's fixed 5 minutes).
pub const NOT_READY_GRACE: Duration = Duration::from_secs(5 * 60);

/// A node as the watcher sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    Ready,
    /// Its Ready condition is False or Unknown, for this long.
    NotReadyFor(Duration),
    /// It has no Ready condition (yet): not judged.
    Unjudged,
    /// The Node object is gone.
    Gone,
}

/// A node's health from its Ready condition: its status (`True`, `False`, `Unknown`) and
/// when it last changed, in seconds since the Unix epoch, at `now` (same unit).
pub fn node_health(ready: Option<(&str, i64)>, now: i64) -> NodeHealth {
    match ready {
        None => NodeHealth::Unjudged,
        Some(("True", _)) => NodeHealth::Ready,
        Some((_, since)) => NodeHealth::NotReadyFor(Duration::from_secs(
            u64::try_from(now.saturating_sub(since)).unwrap_or(0),
        )),
    }
}

/// What to do about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStep {
    Nothing,
    /// Tell each claim used by pods on the node that it failed ([`failed_message`]).
    TellFailed,
    /// Tell each claim told of the failure that the node recovered ([`recovered_message`]).
    TellRecovered,
    /// Look again after this long: it fails then unless it recovers.
    RecheckIn(Duration),
}

/// The step for a node, given whether its claims were told it failed.
pub fn node_step(health: NodeHealth, told_failed: bool) -> NodeStep {
    match (health, told_failed) {
        (NodeHealth::Ready, true) => NodeStep::TellRecovered,
        (NodeHealth::Ready | NodeHealth::Unjudged, false) => NodeStep::Nothing,
        (NodeHealth::NotReadyFor(_) | NodeHealth::Gone | NodeHealth::Unjudged, true) => {
            NodeStep::Nothing
        }
        (NodeHealth::NotReadyFor(since), false) if since < NOT_READY_GRACE => {
            NodeStep::RecheckIn(NOT_READY_GRACE - since)
        }
        (NodeHealth::NotReadyFor(_) | NodeHealth::Gone, false) => NodeStep::TellFailed,
    }
}

/// Upstream's `NodeFailed` message; the pods in name order (upstream's order is a map's).
pub fn failed_message(pods: &[&str], claim: &str, namespace: &str, node: &str) -> String {
    let mut pods = pods.to_vec();
    pods.sort_unstable();
    let listed: String = pods.iter().map(|pod| format!("{pod} ")).collect();
    format!(
        "Pods: [ {listed}] consuming PVC: {claim} in namespace: {namespace} are now on a failed node: {node}"
    )
}

/// Upstream's `NodeRecovered` message.
pub fn recovered_message(node: &str) -> String {
    format!("Node: {node} recovered")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_fails_after_the_grace_once_and_recovers_once() {
        let minute = Duration::from_secs(60);
        let cases = [
            (NodeHealth::Ready, false, NodeStep::Nothing),
            (NodeHealth::Unjudged, false, NodeStep::Nothing),
            (
                NodeHealth::NotReadyFor(minute),
                false,
                NodeStep::RecheckIn(4 * minute),
            ),
            (
                NodeHealth::NotReadyFor(5 * minute),
                false,
                NodeStep::TellFailed,
            ),
            (NodeHealth::NotReadyFor(9 * minute), true, NodeStep::Nothing),
            (NodeHealth::Gone, false, NodeStep::TellFailed),
            (NodeHealth::Gone, true, NodeStep::Nothing),
            (NodeHealth::Ready, true, NodeStep::TellRecovered),
            (NodeHealth::Unjudged, true, NodeStep::Nothing),
        ];
        for (health, told, expected) in cases {
            assert_eq!(node_step(health, told), expected, "{health:?}, told {told}");
        }
    }

    #[test]
    fn the_ready_condition_says_how_long_a_node_is_down() {
        assert_eq!(node_health(None, 100), NodeHealth::Unjudged);
        assert_eq!(node_health(Some(("True", 10)), 100), NodeHealth::Ready);
        assert_eq!(
            node_health(Some(("Unknown", 40)), 100),
            NodeHealth::NotReadyFor(Duration::from_secs(60))
        );
        assert_eq!(
            node_health(Some(("False", 200)), 100),
            NodeHealth::NotReadyFor(Duration::ZERO),
            "a transition ahead of our clock counts from now"
        );
    }

    #[test]
    fn messages_are_upstreams() {
        assert_eq!(
            failed_message(&["web-1", "db-0"], "data", "shop", "node-3"),
            "Pods: [ db-0 web-1 ] consuming PVC: data in namespace: shop are now on a failed node: node-3"
        );
        assert_eq!(recovered_message("node-3"), "Node: node-3 recovered");
    }
}
