//! Startup: a corrupt state file is refused with its name and kept; a stale socket is
//! replaced, the new one is group read-write only; the socket is removed on shutdown.

use std::path::Path;
use std::process::Command;

fn run(root: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_csi-hostpath"))
        .args(["--nodeid=n1"])
        .arg(format!(
            "--endpoint=unix://{}",
            root.join("csi.sock").display()
        ))
        .arg(format!("--statedir={}", root.join("state").display()))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn corrupt_state_file_is_refused_and_kept() {
    // The state file, and the whole-state file of an older driver it would be converted from.
    for (name, content) in [
        (
            "state.log",
            &b"{\"generation\":1}\n{\"version\": 1, \"volumes\": [\n"[..],
        ),
        ("state.json", b"{\"version\": 1, \"volumes\": ["),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        let file = dir.path().join("state").join(name);
        std::fs::write(&file, content).unwrap();
        let output = run(dir.path(), &[]);
        assert!(!output.status.success(), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains("corrupt"), "{stderr}");
        assert_eq!(std::fs::read(&file).unwrap(), content, "{name}");
    }
}

#[test]
fn bad_flags_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [
        &["--endpoint=tcp://127.0.0.1:1"][..],
        &["--capacity=lots"][..],
        &["--no-such-flag"][..],
    ] {
        let output = run(dir.path(), flags);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{flags:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test]
async fn stale_socket_is_replaced_group_writable_and_removed_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    // A stale socket file left by a killed instance.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let mut config = csi_hostpath::local::base_config(dir.path());
    config.state_dir = dir.path().join("state");
    let endpoint = csi_grpc::conn::Endpoint::from_path(&socket).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(csi_hostpath::server::run(
        config,
        endpoint.clone(),
        shutdown.clone(),
    ));
    let csi = csi_grpc::conn::connect(
        &endpoint,
        std::time::Duration::from_secs(10),
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .unwrap();
    csi.probe_until_ready(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    // Group read-write, so non-root sidecars sharing the pod's fsGroup can connect.
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660, "socket mode {mode:o}");
    shutdown.cancel();
    server.await.unwrap().unwrap();
    assert!(!socket.exists(), "socket removed on shutdown");
}
