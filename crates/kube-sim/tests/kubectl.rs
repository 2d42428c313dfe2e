//! kubectl against kube-sim: create a namespace, apply a ConfigMap from YAML (with kubectl's
//! default field validation, which asks the server's OpenAPI v3 documents whether it validates
//! fields itself), get it as JSON, patch it, delete it; create a token, a Role and a RoleBinding. Runs only when `kubectl` is on PATH; with
//! `KUBE_SIM_COMPARE_KUBECONFIG=/path` it runs against that cluster instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kube_sim::ApiServer;
use serde_json::Value;

fn kubectl_on_path() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("kubectl").is_file()))
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write as _;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl starts");
    let mut input = child.stdin.take().expect("piped stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("kubectl reads its input");
    drop(input);
    child.wait_with_output().expect("kubectl runs")
}

/// Runs kubectl and returns its standard output, failing the test on a non-zero exit.
fn ok(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let output = kubectl(kubeconfig, args, stdin);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl {args:?} failed: {stderr}");
    // kubectl prints validation and patch-computation problems as warnings and goes on.
    assert!(
        !stderr.contains("error"),
        "kubectl {args:?} reported: {stderr}"
    );
    String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
}

fn kubeconfig_for(sim: &ApiServer, dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: http://{}\ncontexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\ncurrent-context: kube-sim\nusers:\n- name: kube-sim\n  user: {{}}\n",
        sim.addr
    );
    std::fs::write(&path, config).expect("writing the kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_smoke() {
    if !kubectl_on_path() {
        eprintln!("skipping kubectl_smoke: kubectl is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sim;
    let kubeconfig = match std::env::var("KUBE_SIM_COMPARE_KUBECONFIG") {
        Ok(path) => PathBuf::from(path),
        Err(_) => {
            sim = ApiServer::start().await.unwrap();
            kubeconfig_for(&sim, dir.path())
        }
    };
    let namespace = format!(
        "kubectl-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    // kubectl blocks; the server runs on this runtime's other worker.
    let run = move || {
        ok(&kubeconfig, &["create", "namespace", &namespace], None);
        let manifest = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: smoke\n  namespace: {namespace}\n  labels:\n    app: smoke\ndata:\n  key: value\n"
        );
        let applied = ok(&kubeconfig, &["apply", "-f", "-"], Some(&manifest));
        assert!(applied.contains("configmap/smoke created"), "{applied}");
        // Applying again changes nothing; applying a change patches.
        let again = ok(&kubeconfig, &["apply", "-f", "-"], Some(&manifest));
        assert!(again.contains("configmap/smoke unchanged"), "{again}");
        let changed = manifest.replace("key: value", "key: changed");
        let reapplied = ok(&kubeconfig, &["apply", "-f", "-"], Some(&changed));
        assert!(
            reapplied.contains("configmap/smoke configured"),
            "{reapplied}"
        );

        let get = ["get", "configmap", "smoke", "-n", &namespace, "-o", "json"];
        let object: Value = serde_json::from_str(&ok(&kubeconfig, &get, None)).unwrap();
        assert_eq!(object["data"]["key"], "changed");
        assert_eq!(object["metadata"]["labels"]["app"], "smoke");
        assert!(
            object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
                .is_string()
        );

        ok(
            &kubeconfig,
            &[
                "patch",
                "configmap",
                "smoke",
                "-n",
                &namespace,
                "--type",
                "merge",
                "-p",
                r#"{"data":{"patched":"yes"}}"#,
            ],
            None,
        );
        let object: Value = serde_json::from_str(&ok(&kubeconfig, &get, None)).unwrap();
        assert_eq!(object["data"]["patched"], "yes");

        ok(
            &kubeconfig,
            &["delete", "configmap", "smoke", "-n", &namespace],
            None,
        );
        let missing = kubectl(&kubeconfig, &get, None);
        assert!(!missing.status.success());
        assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"));
        // kubectl writes these kinds as protobuf: a token, a Role and its RoleBinding.
        ok(
            &kubeconfig,
            &["create", "serviceaccount", "backup", "-n", &namespace],
            None,
        );
        let token = ok(
            &kubeconfig,
            &[
                "create",
                "token",
                "backup",
                "-n",
                &namespace,
                "--duration=20m",
            ],
            None,
        );
        assert!(!token.trim().is_empty());
        ok(
            &kubeconfig,
            &[
                "create",
                "role",
                "reader",
                "-n",
                &namespace,
                "--verb=get",
                "--resource=pods",
            ],
            None,
        );
        let account = format!("{namespace}:backup");
        ok(
            &kubeconfig,
            &[
                "create",
                "rolebinding",
                "reader",
                "-n",
                &namespace,
                "--role=reader",
            ]
            .into_iter()
            .chain(["--serviceaccount", &account])
            .collect::<Vec<_>>(),
            None,
        );
        let get = [
            "get",
            "rolebinding",
            "reader",
            "-n",
            &namespace,
            "-o",
            "json",
        ];
        let binding: Value = serde_json::from_str(&ok(&kubeconfig, &get, None)).unwrap();
        assert_eq!(
            binding["roleRef"],
            serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"})
        );
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": "backup", "namespace": namespace}])
        );
        ok(
            &kubeconfig,
            &["delete", "namespace", &namespace, "--wait=false"],
            None,
        );
    };
    tokio::task::spawn_blocking(run).await.unwrap();
}
