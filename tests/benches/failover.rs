//! podmon failover time: protected pods (1 and 10 per node, each with its own volume) run on
//! a node; the node fails (control plane and storage network); we measure from the moment the
//! node carries the unreachable taint until every replacement (created by the test as the
//! StatefulSet controller would, as soon as the old pod is gone) is Running on the other node.
//! Then the node comes back and node-podmon untaints it before the next run. 20 runs per
//! size (`BENCH_FAILOVER_RUNS`); p50/p99. kube-sim with its cluster roles, the reference
//! driver, csi-attacher and podmon in this process, with skipArrayConnectionValidation (the
//! reference driver counts a volume busy for 10 s after its last write, which would measure
//! the driver, not podmon). Writes the "podmon" section of `BENCHMARKS.md`. Needs root (the
//! driver mounts). Nothing asserts a timing.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use csi_suite_scenarios::bench::{main_with_count, percentile};
use csi_suite_scenarios::fixtures::{is_running, pod, static_claim};
use csi_suite_scenarios::{Cluster, Options, can_mount};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;

const HEADING: &str = "## podmon";
const SIZES: [usize; 2] = [1, 10];

fn main() -> anyhow::Result<()> {
    if !can_mount() {
        anyhow::bail!("the failover benchmark needs root: the driver mounts for real");
    }
    main_with_count("BENCH_FAILOVER_RUNS", 20, bench)
}

/// One size's results.
struct Row {
    pods: usize,
    detection: Vec<Duration>,
    failover: Vec<Duration>,
    cleanup: Vec<Duration>,
}

async fn bench(runs: usize) -> anyhow::Result<()> {
    csi_suite_scenarios::init_logging_at("error");
    let options = Options {
        nodes: vec!["node-a".to_string(), "node-b".to_string()],
        ..Options::default()
    };
    let cluster = Cluster::start_with("bench-failover", options).await;
    let attacher = cluster.start_attacher().await;
    // Validation skipped on NoExecute (Dell's skipArrayConnectionValidation): the reference
    // driver reports I/O for 10 s after a volume's last write, which would dominate.
    let controller = cluster
        .start_podmon_controller(|_, t| t.skip_validation = true)
        .await;
    let agents = [
        cluster.start_podmon_node(&cluster.node("node-a")).await,
        cluster.start_podmon_node(&cluster.node("node-b")).await,
    ];
    let mut rows = Vec::new();
    for pods in SIZES {
        let mut row = Row {
            pods,
            detection: Vec::new(),
            failover: Vec::new(),
            cleanup: Vec::new(),
        };
        for run in 0..runs {
            // Alternate the failing node, so each run starts from a clean, untainted cluster.
            let (failing, other) = if run % 2 == 0 {
                (&cluster.node("node-a"), &cluster.node("node-b"))
            } else {
                (&cluster.node("node-b"), &cluster.node("node-a"))
            };
            let names = start_pods(&cluster, &format!("p{pods}-r{run}"), pods, failing).await;
            let timings = fail_over(&cluster, &names, failing, other).await;
            row.detection.push(timings.0);
            row.failover.push(timings.1);
            row.cleanup.push(timings.2);
            remove_pods(&cluster, &names).await;
            print!(".");
        }
        println!(" {pods} pod(s) per node done");
        rows.push(row);
    }
    for agent in agents {
        agent.stop().await;
    }
    controller.sidecar.stop().await;
    attacher.stop().await;

    let mut report = format!(
        "Failover of protected pods from a failed node, {runs} runs per size (kube-sim roles, reference \
         driver, csi-attacher, podmon in one process; node grace period {} s as configured for the \
         simulation; skipArrayConnectionValidation, since with Dell's default validation the \
         reference driver's 10 s I/O window after a volume's last write dominates). *Failover* runs from the unreachable taint to every replacement Running; \
         *detection* from the failure to the taint (the node lifecycle controller's grace \
         period, not podmon); *node cleanup* from the node's return to podmon's taint removed.\n\n\
         | pods per node | failover p50 | failover p99 | detection p50 | node cleanup p50 |\n\
         |---|---|---|---|---|\n",
        cluster.timing.node_grace_period.as_secs()
    );
    for mut row in rows {
        for list in [&mut row.detection, &mut row.failover, &mut row.cleanup] {
            list.sort();
        }
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        writeln!(
            report,
            "| {} | {} | {} | {} | {} |",
            row.pods,
            ms(percentile(&row.failover, 50.0)),
            ms(percentile(&row.failover, 99.0)),
            ms(percentile(&row.detection, 50.0)),
            ms(percentile(&row.cleanup, 50.0)),
        )?;
    }
    println!("{report}");
    let body = format!(
        "{}\n{report}",
        kube_sim_harness::benchmarks::machine(
            "make bench (cargo bench -p csi-suite-scenarios --bench failover)"
        )
    );
    let path = kube_sim_harness::benchmarks::write_section(HEADING, &body)?;
    println!("written to {}", path.display());
    cluster.stop().await;
    Ok(())
}

/// `count` protected pods on `node`, each with its own static volume, all Running.
async fn start_pods(cluster: &Cluster, prefix: &str, count: usize, node: &str) -> Vec<String> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        static_claim(cluster, name).await;
        let mut manifest = pod(name, node, Some(name), false);
        cluster.protect(&mut manifest);
        cluster.create(&cluster.namespaced::<Pod>(), manifest).await;
    }
    for name in &names {
        cluster
            .wait_for(
                &cluster.namespaced::<Pod>(),
                name,
                "the pod Running",
                is_running,
            )
            .await;
    }
    names
}

fn unreachable(node: &Node) -> bool {
    podmon::plan::has_taint(node, podmon::plan::UNREACHABLE_TAINT, "NoExecute")
}

/// Fails `node` and acts as the StatefulSet controller; returns (detection, failover, node
/// cleanup).
async fn fail_over(
    cluster: &Cluster,
    names: &[String],
    node: &str,
    other: &str,
) -> (Duration, Duration, Duration) {
    let pods = cluster.namespaced::<Pod>();
    let nodes = cluster.cluster_scoped::<Node>();
    let failed = Instant::now();
    cluster.fail_node(node);
    let mut tainted = None;
    let mut replaced: Vec<bool> = vec![false; names.len()];
    let mut running: Vec<bool> = vec![false; names.len()];
    while running.iter().any(|r| !r) {
        if tainted.is_none() && nodes.get(node).await.is_ok_and(|n| unreachable(&n)) {
            tainted = Some(Instant::now());
        }
        for (i, name) in names.iter().enumerate() {
            if running[i] {
                continue;
            }
            match pods.get_opt(name).await.ok().flatten() {
                None if !replaced[i] => {
                    cluster.replace_pod(name, Some(name), false).await;
                    replaced[i] = true;
                }
                Some(pod) if replaced[i] && is_running(&pod) => {
                    assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some(other));
                    running[i] = true;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = Instant::now();
    let tainted = tainted.unwrap_or(done);
    let recovering = Instant::now();
    cluster.recover_node(node);
    cluster
        .wait_for(&nodes, node, "the node cleaned and untainted", |n| {
            !cluster.has_podmon_taint(n) && !unreachable(n)
        })
        .await;
    (tainted - failed, done - tainted, recovering.elapsed())
}

/// Deletes the replacements, their claims and volumes.
async fn remove_pods(cluster: &Cluster, names: &[String]) {
    for name in names {
        cluster
            .delete_and_wait(
                &cluster.namespaced::<Pod>(),
                name,
                "the replacement deleted",
            )
            .await;
        cluster
            .namespaced::<PersistentVolumeClaim>()
            .delete(name, &DeleteParams::default())
            .await
            .ok();
        let pv = format!("{}-{name}", cluster.namespace);
        cluster
            .cluster_scoped::<PersistentVolume>()
            .delete(&pv, &DeleteParams::default())
            .await
            .ok();
    }
}
