//! The `snapshot-metadata-lister` binary's failures as a user meets them: usage errors exit 2
//! with upstream's validation message; a bad kubeconfig, a server without SelfSubjectReview
//! (asked for the caller's own ServiceAccount) and a snapshot that does not exist exit 1 with
//! `Error:` and the call that failed. The listing itself runs in the scenario suite
//! (tests/tests/scenarios/snapshot_metadata.rs).

use std::process::{Command, Output};

fn lister(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapshot-metadata-lister"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("snapshot-metadata-lister runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn usage_errors_exit_2_with_upstreams_message() {
    for (args, message) in [
        (&["-s", "snap"][..], "invalid argument: missing Namespace"),
        (
            &["-n", "ns", "-s", "snap", "--service-account=backup"][..],
            "invalid argument: SAName provided but SANamespace missing",
        ),
    ] {
        let output = lister(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(stderr(&output).contains(message), "{}", stderr(&output));
        assert!(output.stdout.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_name_the_call_and_exit_1() {
    let output = lister(&[
        "-n",
        "ns",
        "-s",
        "snap",
        "--kubeconfig=/nonexistent/kubeconfig",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("Error: cannot load kubeconfig /nonexistent/kubeconfig"),
        "{}",
        stderr(&output)
    );

    let root = tempfile::tempdir().unwrap();
    let (_sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(root.path()).await;
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let output = lister(&[
        "-n",
        "ns",
        "-s",
        "snap",
        "--service-account=backup",
        "--service-account-namespace=ns",
        &kubeconfig,
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("Error: VolumeSnapshots.Get(ns/snap): "),
        "{}",
        stderr(&output)
    );
    assert!(output.stdout.is_empty());

    // Without --service-account the caller's own ServiceAccount is asked for first
    // (SelfSubjectReview, which kube-sim does not serve).
    let output = lister(&["-n", "ns", "-s", "snap", &kubeconfig]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("Error: SelfSubjectReviews.Create(): "),
        "{}",
        stderr(&output)
    );
}
