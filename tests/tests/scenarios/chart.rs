//! The Helm chart (`charts/csi-suite`) rendered with several values sets and checked object by
//! object: every container of ours parses its args with its binary's own flag parser, a
//! disabled component leaves with its RBAC, leader election follows the replica count, custom
//! socket paths reach every container, and the RBAC is least privilege. Needs helm: `make test`
//! installs it and names it in `$HELM`; without it the tests say so and skip (CI fails).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use csi_suite_scenarios::manifests::{documents, strings};
use csi_suite_scenarios::rbac::Rule;
use serde_json::Value;

const CHART: &str = "charts/csi-suite";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// `$HELM`, else the project's `.tools/bin/helm`, else `helm` on PATH.
fn helm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HELM") {
        return Some(PathBuf::from(path));
    }
    let tools = workspace().join(".tools/bin/helm");
    if tools.exists() {
        return Some(tools);
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("helm"))
}

/// The values a vendor sets for its own driver (the chart's example, rendered in manifests/).
fn external_driver_values() -> String {
    std::fs::read_to_string(
        workspace()
            .join(CHART)
            .join("examples/external-driver.yaml"),
    )
    .expect("the chart's external-driver example")
}

/// `helm template` of the chart with `values` (YAML) over its defaults; None (after saying
/// why) when helm is missing outside CI.
fn template(values: &str) -> Option<std::process::Output> {
    template_with(values, &[])
}

/// [`template`] for a cluster of Kubernetes `version` (helm's default when `None`).
fn template_for(values: &str, version: Option<&str>) -> Option<std::process::Output> {
    template_with(values, &kube_version(version))
}

/// helm's argument for a cluster of Kubernetes `version`, if any.
fn kube_version(version: Option<&str>) -> Vec<String> {
    version
        .map(|v| format!("--kube-version={v}"))
        .into_iter()
        .collect()
}

/// [`template`] with more arguments for helm (`--kube-version`, `--api-versions`).
fn template_with(values: &str, extra: &[String]) -> Option<std::process::Output> {
    let Some(helm) = helm() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "helm is missing: run scripts/install-tools.sh (make test does)"
        );
        eprintln!("skipped: no helm (scripts/install-tools.sh installs it)");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let output = Command::new(&helm)
        .current_dir(workspace())
        .args(["template", "csi-suite", CHART, "--namespace", "storage"])
        .arg("--values")
        .arg(&file)
        .args(extra)
        .output()
        .expect("helm runs");
    Some(output)
}

/// The objects `helm template` renders, by kind and name.
struct Rendering {
    objects: Vec<Value>,
}

impl Rendering {
    /// Renders with `values` (YAML) over the chart's defaults (see [`template`]).
    fn of(values: &str) -> Option<Self> {
        Self::for_version(values, None)
    }

    /// [`Rendering::of`] for a cluster of Kubernetes `version` (helm's default when `None`).
    fn for_version(values: &str, version: Option<&str>) -> Option<Self> {
        Self::with_args(values, &kube_version(version))
    }

    /// [`Rendering::of`] with more arguments for helm.
    fn with_args(values: &str, extra: &[String]) -> Option<Self> {
        let output = template_with(values, extra)?;
        assert!(
            output.status.success(),
            "helm template failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        Some(Self {
            objects: documents(&text),
        })
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", self.names()))
    }

    fn names(&self) -> Vec<String> {
        self.objects
            .iter()
            .map(|o| format!("{} {}", str(&o["kind"]), str(&o["metadata"]["name"])))
            .collect()
    }

    fn controller(&self) -> &Value {
        &self.get("Deployment", "csi-suite-controller")["spec"]["template"]["spec"]
    }

    fn node(&self) -> &Value {
        &self.get("DaemonSet", "csi-suite-node")["spec"]["template"]["spec"]
    }

    /// The pod of the inventory CronJob's Jobs, when it is on (`inventory.cronJob`).
    fn inventory_job(&self) -> Option<&Value> {
        let cron_job = self.find("CronJob", "csi-suite-inventory")?;
        Some(&cron_job["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    }

    /// The pod of a COSI Deployment (`cosi-controller`, `cosi-driver`), when it is on.
    fn cosi(&self, component: &str) -> Option<&Value> {
        let deployment = self.find("Deployment", &format!("csi-suite-{component}"))?;
        Some(&deployment["spec"]["template"]["spec"])
    }

    /// The pods of the chart by their names here: the controller's, the node's, the
    /// inventory CronJob's and the COSI Deployments' when they are on.
    fn pods(&self) -> Vec<(&'static str, &Value)> {
        let mut pods = vec![("controller", self.controller()), ("node", self.node())];
        pods.extend(self.inventory_job().map(|pod| ("inventory", pod)));
        for component in ["cosi-controller", "cosi-driver"] {
            pods.extend(self.cosi(component).map(|pod| (component, pod)));
        }
        pods
    }

    /// Every container of every pod.
    fn containers(&self) -> Vec<&Value> {
        self.pods()
            .into_iter()
            .flat_map(|(_, pod)| pod["containers"].as_array().unwrap())
            .collect()
    }

    /// The rules of a ClusterRole or Role as (apiGroup, resource, verbs).
    fn rules(&self, kind: &str, name: &str) -> Vec<(String, String, Vec<String>)> {
        let mut rules = Vec::new();
        for rule in Rule::of_role(self.get(kind, name)) {
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    rules.push((group.clone(), resource.clone(), rule.verbs.clone()));
                }
            }
        }
        rules
    }

    fn verbs(&self, kind: &str, name: &str, group: &str, resource: &str) -> Vec<String> {
        self.rules(kind, name)
            .into_iter()
            .filter(|(g, r, _)| g == group && r == resource)
            .flat_map(|(_, _, verbs)| verbs)
            .collect()
    }
}

fn str(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
}

fn container_names(pod: &Value) -> Vec<&str> {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| str(&c["name"]))
        .collect()
}

/// The container's args with `$(VAR)` expanded from its env as the kubelet does (a fieldRef
/// to the node name becomes a node name).
fn args(container: &Value) -> Vec<String> {
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("spec.nodeName") => "node-1".to_string(),
            Some(path) => format!("<{path}>"),
            None => str(&var["value"]).to_string(),
        };
        env.insert(str(&var["name"]).to_string(), value);
    }
    strings(&container["args"])
        .into_iter()
        .map(|arg| {
            env.iter().fold(arg, |arg, (name, value)| {
                arg.replace(&format!("$({name})"), value)
            })
        })
        .collect()
}

fn has_arg(container: &Value, arg: &str) -> bool {
    args(container).iter().any(|a| a == arg)
}

/// The container's command line: its command's first word, then its expanded args.
fn argv(container: &Value) -> Vec<String> {
    std::iter::once(str(&container["command"][0]).to_string())
        .chain(args(container))
        .collect()
}

/// Parses the container's args with the flag parser of the binary its command names (ours
/// only); panics with clap's message when a flag or value is not accepted.
fn parse_with_binary(container: &Value) -> bool {
    use csi_grpc::flags::try_parse_from as parse;
    let argv = argv(container);
    let parsed = match argv[0].as_str() {
        "csi-provisioner" => {
            parse::<csi_provisioner::flags::ProvisionerArgs, _, _>(&argv).map(drop)
        }
        "csi-attacher" => parse::<csi_attacher::flags::AttacherArgs, _, _>(&argv).map(drop),
        "csi-resizer" => parse::<csi_resizer::flags::ResizerArgs, _, _>(&argv).map(drop),
        "csi-snapshotter" => {
            parse::<csi_snapshotter::flags::SnapshotterArgs, _, _>(&argv).map(drop)
        }
        "snapshot-controller" => {
            parse::<csi_snapshotter::flags::ControllerArgs, _, _>(&argv).map(drop)
        }
        "csi-health-monitor" => {
            parse::<csi_health_monitor::flags::HealthMonitorArgs, _, _>(&argv).map(drop)
        }
        "csi-snapshot-metadata" => {
            parse::<csi_snapshot_metadata::flags::SnapshotMetadataArgs, _, _>(&argv).and_then(
                |args| {
                    // Upstream's checks after parsing (the key pair is required, ...).
                    args.check().map_err(|message| {
                        clap::Error::raw(clap::error::ErrorKind::ValueValidation, message)
                    })
                },
            )
        }
        "csi-node-driver-registrar" => {
            parse::<csi_node_driver_registrar::flags::RegistrarArgs, _, _>(&argv).map(drop)
        }
        "livenessprobe" => {
            parse::<csi_node_driver_registrar::flags::ProbeArgs, _, _>(&argv).map(drop)
        }
        "podmon" => parse::<podmon::flags::PodmonArgs, _, _>(&argv).map(drop),
        "csi-inventory" => parse::<csi_inventory::flags::InventoryArgs, _, _>(&argv).map(drop),
        "csi-hostpath" => parse::<csi_hostpath::config::DriverArgs, _, _>(&argv).map(drop),
        "cosi-controller" => parse::<cosi::flags::ControllerArgs, _, _>(&argv).map(drop),
        "cosi-provisioner" => parse::<cosi::flags::ProvisionerArgs, _, _>(&argv).map(drop),
        "cosi-s3" => {
            // Its administrator's key comes from the environment (a Secret).
            let from_secret = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|var| {
                    var["name"] == "AWS_ACCESS_KEY_ID"
                        && var["valueFrom"]["secretKeyRef"].is_object()
                });
            let argv = argv
                .iter()
                .cloned()
                .chain(from_secret.then(|| "--access-key-id=from-the-secret".to_string()));
            <cosi_s3::serve::S3Args as clap::Parser>::try_parse_from(argv).map(drop)
        }
        _ => return false,
    };
    if let Err(error) = parsed {
        panic!("container {}: {argv:?}: {error}", str(&container["name"]));
    }
    true
}

fn mounts(container: &Value) -> Vec<(String, String, String)> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                str(&m["name"]).to_string(),
                str(&m["mountPath"]).to_string(),
                str(&m["mountPropagation"]).to_string(),
            )
        })
        .collect()
}

fn host_path(pod: &Value, volume: &str) -> String {
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume)
        .unwrap_or_else(|| panic!("no volume {volume}"));
    str(&volume["hostPath"]["path"]).to_string()
}

/// The paths a container of ours writes (its sockets, state and mount points), from its args
/// as its binary parses them; nothing for a binary that is not ours.
fn written_paths(container: &Value) -> Vec<PathBuf> {
    use csi_grpc::flags::try_parse_from as parse;
    let argv = argv(container);
    match argv[0].as_str() {
        "csi-hostpath" => {
            let driver: csi_hostpath::config::DriverArgs = parse(&argv).unwrap();
            let socket = driver.endpoint.trim_start_matches("unix://");
            let mut paths = vec![driver.statedir, PathBuf::from(socket)];
            if driver.mode.node() {
                paths.extend(driver.allowed_path_roots);
            }
            paths
        }
        "podmon" => {
            let podmon: podmon::flags::PodmonArgs = parse(&argv).unwrap();
            if podmon.mode == podmon::flags::Mode::Node {
                assert!(
                    !podmon.state_file.is_empty(),
                    "node-podmon names its state file"
                );
                vec![PathBuf::from(podmon.state_file), podmon.kubelet_dir]
            } else {
                Vec::new()
            }
        }
        "csi-node-driver-registrar" => {
            let registrar: csi_node_driver_registrar::flags::RegistrarArgs = parse(&argv).unwrap();
            vec![PathBuf::from(registrar.plugin_registration_path)]
        }
        _ => Vec::new(),
    }
}

/// How a container of the chart runs beyond the runtime's defaults.
#[derive(Clone, Copy, Debug)]
enum Privilege {
    /// Privileged, as root: it mounts pods' volumes with Bidirectional propagation.
    Mounts,
    /// As root, with only these capabilities added back.
    Root(&'static [&'static str]),
    /// As a user other than root, with no capability.
    NonRoot,
}

/// Every pod (the inventory CronJob's too) runs under the runtime's default seccomp profile,
/// and each container as `expected` says (pod, container, privilege; every container listed):
/// everything dropped but what it adds back, no privilege escalation unless privileged, and a
/// read-only root filesystem, every path it writes being on a writable volume.
fn assert_hardened(rendering: &Rendering, expected: &[(&str, &str, Privilege)]) {
    for (pod_name, pod) in rendering.pods() {
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{pod_name} pod"
        );
        let listed: Vec<&str> = expected
            .iter()
            .filter(|(p, _, _)| *p == pod_name)
            .map(|(_, c, _)| *c)
            .collect();
        assert_eq!(container_names(pod), listed, "{pod_name} pod");
        for (_, name, privilege) in expected.iter().filter(|(p, _, _)| *p == pod_name) {
            let container = container(pod, name).unwrap();
            let security = &container["securityContext"];
            let at = format!("{pod_name}/{name}");
            assert_eq!(security["readOnlyRootFilesystem"], true, "{at}");
            let root = security["runAsUser"] == 0 && security["runAsNonRoot"] != true;
            let (as_root, added): (bool, &[&str]) = match privilege {
                Privilege::Mounts => {
                    assert_eq!(security["privileged"], true, "{at}");
                    (true, &[])
                }
                Privilege::Root(added) => (true, added),
                Privilege::NonRoot => {
                    assert_eq!(security["runAsNonRoot"], true, "{at}");
                    (false, &[])
                }
            };
            assert_eq!(root, as_root, "{at}: runs as root");
            if !matches!(privilege, Privilege::Mounts) {
                assert!(security["privileged"] != true, "{at}");
                assert_eq!(security["allowPrivilegeEscalation"], false, "{at}");
                assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{at}");
                assert_eq!(strings(&security["capabilities"]["add"]), added, "{at}");
            }
            let writable: Vec<String> = container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["readOnly"] != true)
                .map(|m| str(&m["mountPath"]).to_string())
                .collect();
            for path in written_paths(container) {
                assert!(
                    writable.iter().any(|mount| path.starts_with(mount)),
                    "{at} writes {} outside its writable volumes {writable:?}",
                    path.display()
                );
            }
        }
    }
}

/// Whether the container's binary calls the Kubernetes API (the registrar, livenessprobe and
/// the reference driver have no API client).
fn calls_api(container: &Value) -> bool {
    matches!(
        str(&container["command"][0]),
        "csi-provisioner"
            | "csi-attacher"
            | "csi-resizer"
            | "csi-snapshotter"
            | "csi-health-monitor"
            | "csi-snapshot-metadata"
            | "snapshot-controller"
            | "podmon"
            | "csi-inventory"
            | "cosi-controller"
            | "cosi-provisioner"
    )
}

/// Both parts of the inventory on: the container in the controller pod and the CronJob.
const INVENTORY_BOTH: &str =
    "inventory:\n  serve:\n    enabled: true\n  cronJob:\n    enabled: true\n";

/// The whole COSI part with the sample driver cosi-s3.
const COSI_SAMPLE: &str = "cosi:
  installCRDs: true
  controller:
    enabled: true
  driver:
    enabled: true
  s3:
    endpoint: http://s3.example.com:9000
    credentialsSecret: s3-admin
  bucketClass:
    create: true
  bucketAccessClass:
    create: true
";

/// Values without any container that calls the API.
const NO_API_CALLERS: &str = "provisioner:\n  enabled: false\nattacher:\n  enabled: false\n\
                              resizer:\n  enabled: false\npodmon:\n  enabled: false\n";

/// Where in-cluster clients read the token, the cluster CA and the namespace.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount of podmon's controller side, and the Secret holding its token.
const PODMON_CONTROLLER_ACCOUNT: &str = "csi-suite-podmon-controller";
const PODMON_CONTROLLER_TOKEN: &str = "csi-suite-podmon-controller-token";

/// Whether the container is podmon's controller side, which calls the API with a token of
/// its own account (a Secret), not the pod's.
fn own_token(pod_name: &str, container: &Value) -> bool {
    pod_name == "controller" && container["name"] == "podmon"
}

/// The API token reaches only the containers that call the API. `projected`: no pod automounts
/// a token, and each of those containers (only they) mounts a projected one, with the CA and
/// the namespace, at the in-cluster path; otherwise a pod automounts it when one of its
/// containers calls the API, and none mounts a projected one. podmon's controller side mounts
/// its own account's token Secret there either way (an automounted token skips a container
/// that mounts the path).
fn assert_tokens(rendering: &Rendering, projected: bool) {
    for (pod_name, pod) in rendering.pods() {
        let containers = pod["containers"].as_array().unwrap();
        let pod_calls = containers
            .iter()
            .any(|c| calls_api(c) && !own_token(pod_name, c));
        let automount = pod["automountServiceAccountToken"].as_bool();
        assert_eq!(
            automount,
            Some(!projected && pod_calls),
            "{:?}",
            container_names(pod)
        );
        let volume = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "kube-api-access");
        assert_eq!(volume.is_some(), projected && pod_calls);
        for container in containers {
            let mounts = mounts(container);
            let token = mounts.iter().find(|(_, path, _)| path == TOKEN_DIR);
            if own_token(pod_name, container) {
                let (name, _, _) = token.expect("podmon's controller side mounts its token");
                let volume = pod["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| &v["name"] == name)
                    .unwrap();
                assert_eq!(volume["secret"]["secretName"], PODMON_CONTROLLER_TOKEN);
                continue;
            }
            assert_eq!(
                token.is_some(),
                projected && calls_api(container),
                "{}",
                str(&container["name"])
            );
            if let Some((name, _, _)) = token {
                assert_eq!(name, "kube-api-access");
            }
        }
        if let Some(volume) = volume {
            let sources = &volume["projected"]["sources"];
            assert_eq!(sources[0]["serviceAccountToken"]["path"], "token");
            assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
            assert_eq!(sources[1]["configMap"]["items"][0]["path"], "ca.crt");
            let namespace = &sources[2]["downwardAPI"]["items"][0];
            assert_eq!(namespace["path"], "namespace");
            assert_eq!(namespace["fieldRef"]["fieldPath"], "metadata.namespace");
        }
    }
}

/// The inventory's ClusterRole (and its binding), for the serving container and the CronJob.
const INVENTORY_RBAC: &str = "csi-suite-inventory-runner";

/// cosi-provisioner's ClusterRole: the one that may write Secrets.
const COSI_PROVISIONER_RBAC: &str = "csi-suite-cosi-driver-provisioner-runner";

/// csi-snapshot-metadata's ClusterRole, and the one for backup applications to bind.
const SNAPSHOT_METADATA_RBAC: &str = "csi-suite-external-snapshot-metadata-runner";
const SNAPSHOT_METADATA_CLIENT_RBAC: &str = "csi-suite-external-snapshot-metadata-client-runner";

const CONTROLLER_RBAC: [&str; 4] = [
    "csi-suite-external-provisioner-runner",
    "csi-suite-external-attacher-runner",
    "csi-suite-external-resizer-runner",
    "csi-suite-podmon-controller",
];

/// No wildcard anywhere; Secrets only ever `get`; each ClusterRole has its binding to the
/// right ServiceAccount.
fn assert_least_privilege(rendering: &Rendering) {
    for role in rendering
        .objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let kind = str(&role["kind"]);
        let name = str(&role["metadata"]["name"]);
        for (group, resource, verbs) in rendering.rules(kind, name) {
            assert!(
                group != "*" && resource != "*" && !verbs.iter().any(|v| v == "*"),
                "{kind} {name}: wildcard in {group}/{resource} {verbs:?}"
            );
            if resource == "secrets" && name == COSI_PROVISIONER_RBAC {
                // It writes the credentials Secrets of the BucketAccesses.
                assert_eq!(
                    verbs,
                    ["get", "create", "patch", "delete"],
                    "{kind} {name}: secrets"
                );
            } else if resource == "secrets" {
                assert_eq!(verbs, ["get"], "{kind} {name}: secrets");
            }
        }
        if name == SNAPSHOT_METADATA_CLIENT_RBAC {
            // For backup applications to bind: the chart binds it to nobody.
            assert!(rendering.find("ClusterRoleBinding", name).is_none());
            continue;
        }
        let binding = rendering.get(&format!("{kind}Binding"), name);
        assert_eq!(binding["roleRef"]["name"], name);
        let controller = rendering.controller();
        let accounts = if name.ends_with("-podmon-node") {
            vec!["csi-suite-node"]
        } else if name.ends_with("-podmon-controller") {
            vec![PODMON_CONTROLLER_ACCOUNT]
        } else if name == "csi-suite-leader-election" {
            // The controller pod's account for the sidecars that elect (and for the
            // provisioner's in-flight record, elected or not), podmon's own when it elects.
            let electing = controller["containers"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| c["args"].as_array().into_iter().flatten())
                .any(|arg| {
                    matches!(
                        arg.as_str(),
                        Some("--leader-election=true" | "--leaderelection=true")
                    )
                });
            let sidecars = [
                "csi-provisioner",
                "csi-attacher",
                "csi-resizer",
                "csi-snapshotter",
            ]
            .iter()
            .any(|c| container(controller, c).is_some());
            let podmon = electing && container(controller, "podmon").is_some();
            [
                (sidecars, "csi-suite-controller"),
                (podmon, PODMON_CONTROLLER_ACCOUNT),
            ]
            .into_iter()
            .filter_map(|(elects, account)| elects.then_some(account))
            .collect()
        } else if name.starts_with("csi-suite-snapshot-controller") {
            vec!["csi-suite-snapshot-controller"]
        } else if name.starts_with("csi-suite-cosi-controller") {
            vec!["csi-suite-cosi-controller"]
        } else if name.starts_with("csi-suite-cosi-driver") {
            vec!["csi-suite-cosi-driver"]
        } else if name == INVENTORY_RBAC {
            // The account of each pod that runs csi-inventory, and no other.
            let serving = container(controller, "csi-inventory").is_some();
            let cron = rendering.inventory_job().is_some();
            assert!(serving || cron, "{name} without a csi-inventory");
            [
                (serving, "csi-suite-controller"),
                (cron, "csi-suite-inventory"),
            ]
            .into_iter()
            .filter_map(|(runs, account)| runs.then_some(account))
            .collect()
        } else {
            vec!["csi-suite-controller"]
        };
        let subjects = binding["subjects"].as_array().unwrap();
        let names: Vec<&str> = subjects.iter().map(|s| str(&s["name"])).collect();
        assert_eq!(names, accounts, "{name}");
        for subject in subjects {
            assert_eq!(subject["kind"], "ServiceAccount", "{name}");
            assert_eq!(subject["namespace"], "storage", "{name}");
        }
    }
    for (pod_name, pod) in rendering.pods() {
        let account = str(&pod["serviceAccountName"]);
        assert!(
            rendering.find("ServiceAccount", account).is_some(),
            "{pod_name} pod: no ServiceAccount {account}"
        );
    }
}

#[test]
fn default_values_run_the_reference_driver_with_every_component() {
    let Some(rendering) = Rendering::of("{}") else {
        return;
    };
    let controller = rendering.controller();
    let node = rendering.node();
    assert_eq!(
        container_names(controller),
        [
            "driver",
            "csi-provisioner",
            "csi-attacher",
            "csi-resizer",
            "podmon",
            "liveness-probe"
        ]
    );
    assert_eq!(
        container_names(node),
        [
            "driver",
            "node-driver-registrar",
            "podmon",
            "liveness-probe"
        ]
    );
    for container in rendering.containers() {
        assert!(parse_with_binary(container), "{container:#}");
    }
    // The reference driver fences other pods' writers: it must see their processes.
    assert_eq!(node["hostPID"], true);

    // One replica: no leader election, and no overlap during a rollout.
    let deployment = rendering.get("Deployment", "csi-suite-controller");
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    for name in ["csi-provisioner", "csi-attacher", "csi-resizer"] {
        assert!(has_arg(
            container(controller, name).unwrap(),
            "--leader-election=false"
        ));
    }
    assert!(has_arg(
        container(controller, "podmon").unwrap(),
        "--leaderelection=false"
    ));
    // Still the Leases' Role: the provisioner's record of provisionings in flight is one.
    assert!(
        rendering
            .find("Role", "csi-suite-leader-election")
            .is_some()
    );

    // Sidecars of the controller pod run as non-root and reach the socket via the fsGroup.
    assert_eq!(controller["securityContext"]["fsGroup"], 65532);
    for name in [
        "csi-provisioner",
        "csi-attacher",
        "csi-resizer",
        "podmon",
        "liveness-probe",
    ] {
        let security = &container(controller, name).unwrap()["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{name}");
        assert_eq!(security["runAsUser"], 65532, "{name}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
    }
    assert_eq!(controller["volumes"][0]["emptyDir"], serde_json::json!({}));

    // The controller driver's exports of ext4 volumes reach the host, and from there the node
    // driver, which stages them.
    let exporter = container(controller, "driver").unwrap();
    assert_eq!(exporter["securityContext"]["privileged"], true);
    assert!(mounts(exporter).contains(&(
        "csi-data-dir".into(),
        "/csi-data-dir".into(),
        "Bidirectional".into()
    )));
    // The node driver: privileged, its mounts propagate back to the host's kubelet dir.
    let driver = container(node, "driver").unwrap();
    assert_eq!(driver["securityContext"]["privileged"], true);
    assert!(mounts(driver).contains(&(
        "csi-data-dir".into(),
        "/csi-data-dir".into(),
        "HostToContainer".into()
    )));
    assert!(mounts(driver).contains(&(
        "kubelet-dir".into(),
        "/var/lib/kubelet".into(),
        "Bidirectional".into()
    )));
    assert_eq!(host_path(node, "kubelet-dir"), "/var/lib/kubelet");
    assert_eq!(
        host_path(node, "plugin-dir"),
        "/var/lib/kubelet/plugins/hostpath.csi-suite.io"
    );
    assert_eq!(
        host_path(node, "registration-dir"),
        "/var/lib/kubelet/plugins_registry"
    );
    // Liveness: the driver containers probe through livenessprobe, the registrar itself.
    for pod in [controller, node] {
        assert_eq!(
            container(pod, "driver").unwrap()["livenessProbe"]["httpGet"]["port"],
            "healthz"
        );
        assert!(has_arg(
            container(pod, "liveness-probe").unwrap(),
            "--http-endpoint=:9808"
        ));
    }
    let registrar = container(node, "node-driver-registrar").unwrap();
    assert_eq!(registrar["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(has_arg(registrar, "--http-endpoint=:9809"));
    // No two containers of the controller pod share a port; the resizer's probe names its own.
    let mut ports = Vec::new();
    for sidecar in controller["containers"].as_array().unwrap() {
        for port in sidecar["ports"].as_array().into_iter().flatten() {
            let number = port["containerPort"].as_u64().unwrap();
            assert!(!ports.contains(&number), "port {number} twice");
            ports.push(number);
        }
    }
    let resizer = container(controller, "csi-resizer").unwrap();
    assert!(has_arg(resizer, "--http-endpoint=:8083"));
    assert_eq!(resizer["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(resizer["livenessProbe"]["httpGet"]["port"], "resizer");
    assert_eq!(resizer["ports"][0]["name"], "resizer");

    // Driver node pods survive podmon's own taints, and carry the label podmon finds them by.
    let tolerated: Vec<&str> = node["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| str(&t["key"]))
        .collect();
    assert_eq!(
        tolerated,
        [
            "hostpath.podmon.storage/fenced",
            "hostpath.podmon.storage/driver-offline"
        ]
    );
    let labels =
        &rendering.get("DaemonSet", "csi-suite-node")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["csi-suite.io/driver-node"], "csi-suite");
    let podmon_controller = container(controller, "podmon").unwrap();
    assert!(has_arg(
        podmon_controller,
        "--driverPodLabelKey=csi-suite.io/driver-node"
    ));
    assert!(has_arg(
        podmon_controller,
        "--driverPodLabelValue=csi-suite"
    ));

    // The ConfigMap podmon re-reads holds settings podmon accepts.
    let config = rendering.get("ConfigMap", "csi-suite-podmon-config");
    let text = str(&config["data"]["driver-config-params.yaml"]);
    let base = podmon::config::Tunables {
        poll_rate: Duration::from_secs(1),
        loss_threshold: 1,
        skip_validation: true,
        maintenance: true,
        max_evacuated_fraction: 1.0,
    };
    let tunables = podmon::config::apply(&base, text).expect("podmon accepts the ConfigMap");
    assert_eq!(
        tunables,
        podmon::config::Tunables {
            poll_rate: Duration::from_secs(15),
            loss_threshold: 3,
            skip_validation: false,
            maintenance: false,
            max_evacuated_fraction: 0.3333,
        }
    );

    let csi_driver = rendering.get("CSIDriver", "hostpath.csi-suite.io");
    assert_eq!(csi_driver["spec"]["attachRequired"], true);
    assert_eq!(csi_driver["spec"]["podInfoOnMount"], true);
    assert_eq!(csi_driver["spec"]["fsGroupPolicy"], "File");
    assert!(
        rendering
            .objects
            .iter()
            .all(|o| o["kind"] != "StorageClass")
    );

    // Secrets are not granted unless asked for; everything else as the components call it.
    for role in CONTROLLER_RBAC {
        assert!(
            rendering
                .verbs("ClusterRole", role, "", "secrets")
                .is_empty(),
            "{role}"
        );
    }
    assert_eq!(
        rendering.verbs(
            "ClusterRole",
            "csi-suite-external-attacher-runner",
            "storage.k8s.io",
            "volumeattachments/status"
        ),
        ["patch"]
    );
    assert_eq!(
        rendering.verbs(
            "ClusterRole",
            "csi-suite-external-resizer-runner",
            "",
            "persistentvolumeclaims/status"
        ),
        ["patch"]
    );
    assert_eq!(
        rendering.verbs("ClusterRole", "csi-suite-podmon-node", "", "nodes"),
        ["get", "patch"]
    );
    assert_least_privilege(&rendering);
}

/// Least privilege per container, for the reference driver and a vendor's: only the
/// containers that mount are privileged (the node's, and the reference driver's controller,
/// which exports ext4 volumes to nodes and cuts those exports to fence); the registrar and the node livenessprobe use the
/// driver's and kubelet's root-owned sockets on hostPath volumes (no fsGroup there) as root,
/// without capabilities; every other container runs as non-root with none. With the inventory
/// CronJob the controller's socket is on a hostPath too: the controller sidecars and the
/// CronJob's csi-inventory reach it as root, without capabilities.
#[test]
fn every_container_runs_with_least_privilege() {
    use Privilege::{Mounts, NonRoot, Root};
    let node = [
        ("node", "driver", Mounts),
        ("node", "node-driver-registrar", Root(&[])),
        ("node", "podmon", Mounts),
        ("node", "liveness-probe", Root(&[])),
    ];
    let sidecars = [
        ("controller", "csi-provisioner", NonRoot),
        ("controller", "csi-attacher", NonRoot),
        ("controller", "csi-resizer", NonRoot),
        ("controller", "csi-snapshotter", NonRoot),
        ("controller", "csi-health-monitor", NonRoot),
        ("controller", "csi-snapshot-metadata", NonRoot),
        ("controller", "podmon", NonRoot),
        ("controller", "csi-inventory", NonRoot),
        ("controller", "liveness-probe", NonRoot),
    ];
    let cosi = [
        ("cosi-controller", "cosi-controller", NonRoot),
        ("cosi-driver", "driver", NonRoot),
        ("cosi-driver", "cosi-provisioner", NonRoot),
    ];
    let external = external_driver_values();
    // The snapshotter, the health monitor and csi-snapshot-metadata are off by default and on in
    // the example, the inventory's container and the COSI part too; csi-snapshot-metadata with
    // every sidecar that serves metrics as well.
    for (values, controller_driver, example_sidecars, cbt, serving, inventory_cron, with_cosi) in [
        ("{}", Mounts, false, false, false, false, false),
        (external.as_str(), NonRoot, true, true, true, false, true),
        (INVENTORY_BOTH, Mounts, false, false, true, true, false),
        (COSI_SAMPLE, Mounts, false, false, false, false, true),
        (ALL_METRICS, Mounts, true, true, true, false, false),
    ] {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        let expected: Vec<_> = std::iter::once(("controller", "driver", controller_driver))
            .chain(sidecars.into_iter().filter(|(_, name, _)| match *name {
                "csi-snapshotter" | "csi-health-monitor" => example_sidecars,
                "csi-snapshot-metadata" => cbt,
                "csi-inventory" => serving,
                _ => true,
            }))
            .map(|(pod, name, privilege)| match privilege {
                NonRoot if inventory_cron => (pod, name, Root(&[])),
                _ => (pod, name, privilege),
            })
            .chain(node)
            .chain(inventory_cron.then_some(("inventory", "csi-inventory", Root(&[]))))
            .chain(cosi.into_iter().filter(|_| with_cosi))
            .collect();
        assert_hardened(&rendering, &expected);
    }
}

/// No pod automounts the API token; the containers that call the API (the sidecars, podmon,
/// the inventory, COSI's) and only they mount a projected one, for the reference driver and a
/// vendor's, and a pod without any of them gets none.
#[test]
fn api_tokens_reach_only_the_containers_that_call_the_api() {
    let external = external_driver_values();
    let only_the_cron_job = format!("{NO_API_CALLERS}inventory:\n  cronJob:\n    enabled: true\n");
    for values in [
        "{}",
        external.as_str(),
        "podmon:\n  enabled: false\n",
        NO_API_CALLERS,
        INVENTORY_BOTH,
        only_the_cron_job.as_str(),
        COSI_SAMPLE,
    ] {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        assert_tokens(&rendering, true);
    }
}

/// Before 1.20 the kube-root-ca.crt ConfigMap a projected token's CA comes from is not
/// published (v1.19, where make test-node runs): with `projectedToken: auto` the pods that call
/// the API automount the token and the others do not; `true` and `false` choose either way on
/// any version.
#[test]
fn before_1_20_only_pods_that_call_the_api_automount_a_token() {
    let cases = [
        ("{}", "1.19.16", false),
        ("podmon:\n  enabled: false\n", "1.19.16", false),
        (NO_API_CALLERS, "1.19.16", false),
        (INVENTORY_BOTH, "1.19.16", false),
        ("{}", "1.20.0", true),
        (INVENTORY_BOTH, "1.20.0", true),
        (COSI_SAMPLE, "1.19.16", false),
        ("serviceAccount:\n  projectedToken: true\n", "1.19.16", true),
        (
            "serviceAccount:\n  projectedToken: false\n",
            "1.33.0",
            false,
        ),
    ];
    for (values, version, projected) in cases {
        let Some(rendering) = Rendering::for_version(values, Some(version)) else {
            return;
        };
        assert_tokens(&rendering, projected);
    }
}

#[test]
fn a_disabled_component_is_gone_with_its_rbac() {
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "provisioner",
            "Deployment",
            "csi-provisioner",
            &["csi-suite-external-provisioner-runner"],
        ),
        (
            "attacher",
            "Deployment",
            "csi-attacher",
            &["csi-suite-external-attacher-runner"],
        ),
        (
            "resizer",
            "Deployment",
            "csi-resizer",
            &["csi-suite-external-resizer-runner"],
        ),
        (
            "podmon",
            "Both",
            "podmon",
            &["csi-suite-podmon-controller", "csi-suite-podmon-node"],
        ),
        ("registrar", "DaemonSet", "node-driver-registrar", &[]),
        ("livenessProbe", "Both", "liveness-probe", &[]),
    ];
    for (component, workload, container_name, roles) in cases {
        let Some(rendering) = Rendering::of(&format!("{component}:\n  enabled: false\n")) else {
            return;
        };
        for pod in [rendering.controller(), rendering.node()] {
            assert!(
                container(pod, container_name).is_none(),
                "{component} disabled but {container_name} is in {workload}"
            );
            for container in pod["containers"].as_array().unwrap() {
                parse_with_binary(container);
            }
        }
        for role in roles {
            assert!(rendering.find("ClusterRole", role).is_none(), "{role}");
            assert!(
                rendering.find("ClusterRoleBinding", role).is_none(),
                "{role}"
            );
        }
        assert_least_privilege(&rendering);
        match component {
            "podmon" => {
                assert!(
                    rendering
                        .find("ConfigMap", "csi-suite-podmon-config")
                        .is_none()
                );
                assert!(rendering.node()["tolerations"].is_null());
            }
            "livenessProbe" => {
                for pod in [rendering.controller(), rendering.node()] {
                    assert!(container(pod, "driver").unwrap()["livenessProbe"].is_null());
                }
            }
            "registrar" => {
                let volumes = &rendering.node()["volumes"];
                assert!(
                    volumes
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|v| v["name"] != "registration-dir")
                );
            }
            _ => {}
        }
    }
}

/// What `helm install` finds on a cluster that serves ValidatingAdmissionPolicy v1 (1.30+).
const VAP_V1: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// Values whose node-podmon also lifts the out-of-service taint.
const VAP_SERVED: &str = "podmon:\n  outOfServiceTaint: true\n";

fn api_versions(version: &str) -> Vec<String> {
    vec!["--api-versions".to_string(), version.to_string()]
}

/// The roles bound to the ServiceAccount `account` of the release's namespace.
fn bound_roles(rendering: &Rendering, account: &str) -> Vec<(String, String)> {
    rendering
        .objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
        .filter(|b| {
            b["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account)
        })
        .map(|b| {
            (
                str(&b["roleRef"]["kind"]).to_string(),
                str(&b["roleRef"]["name"]).to_string(),
            )
        })
        .collect()
}

/// node-podmon's account reads, and writes nothing but `patch` on nodes (to lift podmon's
/// taints from its own Node), which RBAC cannot narrow to the pod's own Node. Where the
/// cluster serves ValidatingAdmissionPolicy v1 the chart adds a policy that does: only the
/// Node of the token's `authentication.kubernetes.io/node-name` (refused without one), only
/// podmon's taints removed, nothing else changed, anyone else's requests untouched. Without it
/// (helm template's defaults, v1.28, v1.19) or when turned off, no policy is rendered.
#[test]
fn node_podmon_may_patch_only_its_own_node_where_the_cluster_serves_a_policy() {
    let Some(plain) = Rendering::of("{}") else {
        return;
    };
    assert_eq!(
        bound_roles(&plain, "csi-suite-node"),
        [(
            "ClusterRole".to_string(),
            "csi-suite-podmon-node".to_string()
        )]
    );
    for (group, resource, verbs) in plain.rules("ClusterRole", "csi-suite-podmon-node") {
        if (group.as_str(), resource.as_str()) == ("", "nodes") {
            assert_eq!(
                verbs,
                ["get", "patch"],
                "the one write: its own Node's taints"
            );
        } else {
            assert!(
                verbs
                    .iter()
                    .all(|v| ["get", "list", "watch"].contains(&v.as_str())),
                "{group}/{resource}: {verbs:?}"
            );
        }
    }
    let policy_of = |rendering: &Rendering| {
        (
            rendering
                .find("ValidatingAdmissionPolicy", "csi-suite-podmon-node")
                .cloned(),
            rendering
                .find("ValidatingAdmissionPolicyBinding", "csi-suite-podmon-node")
                .cloned(),
        )
    };
    assert_eq!(policy_of(&plain), (None, None), "no policy API: no policy");
    for version in ["1.28.0", "1.19.16"] {
        let old = Rendering::for_version("{}", Some(version)).unwrap();
        assert_eq!(policy_of(&old), (None, None), "{version}");
    }
    for values in [
        "podmon:\n  node:\n    admissionPolicy: false\n",
        "podmon:\n  enabled: false\n",
    ] {
        let off = Rendering::with_args(values, &api_versions(VAP_V1)).unwrap();
        assert_eq!(policy_of(&off), (None, None), "{values}");
    }

    for (values, removable) in [
        ("{}", "['hostpath.podmon.storage/fenced']"),
        (
            VAP_SERVED,
            "['hostpath.podmon.storage/fenced', 'node.kubernetes.io/out-of-service']",
        ),
    ] {
        let served = Rendering::with_args(values, &api_versions(VAP_V1)).unwrap();
        let (Some(policy), Some(binding)) = policy_of(&served) else {
            panic!("{values}: no policy where the cluster serves it");
        };
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(
            spec["matchConstraints"]["resourceRules"],
            serde_json::json!([{"apiGroups": [""], "apiVersions": ["*"],
                                "operations": ["UPDATE"], "resources": ["nodes"]}])
        );
        assert_eq!(
            spec["matchConditions"][0]["expression"],
            "request.userInfo.username == 'system:serviceaccount:storage:csi-suite-node'",
            "node-podmon's requests only"
        );
        let variable = |name: &str| {
            spec["variables"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .map(|v| str(&v["expression"]).to_string())
                .unwrap_or_else(|| panic!("no variable {name}"))
        };
        assert_eq!(
            variable("nodeName"),
            "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in \
             request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/node-name'] : []",
            "no node-name in the token: no node"
        );
        assert_eq!(variable("removable"), removable);
        let validations: Vec<&str> = spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| str(&v["expression"]))
            .collect();
        assert_eq!(
            validations[0],
            "size(variables.nodeName) == 1 && variables.nodeName[0] == object.metadata.name",
            "its own Node, and a request without a node name refused"
        );
        assert!(
            validations[1].contains("variables.newTaints.all(t, t in variables.oldTaints)"),
            "no taint added or changed"
        );
        assert!(
            validations[1].contains("t.key in variables.removable"),
            "only podmon's taints removed"
        );
        for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
            assert!(validations[2].contains(&format!("'{field}'")), "{field}");
        }
        assert!(
            validations[2].contains("f == 'taints' ||"),
            "the spec beside the taints"
        );
        assert_eq!(binding["spec"]["policyName"], "csi-suite-podmon-node");
        assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
        assert!(binding["spec"]["matchResources"].is_null(), "every Node");
        // node-podmon lifts what the policy lets it lift.
        assert!(has_arg(
            container(served.node(), "podmon").unwrap(),
            &format!("--out-of-service-taint={}", values == VAP_SERVED)
        ));
    }
}

/// podmon's controller side runs in the controller pod under a ServiceAccount of its own: its
/// container mounts that account's token (a Secret kube-controller-manager fills), its
/// ClusterRole is bound to that account alone, and the pod's account, which the other
/// sidecars use, may neither patch Nodes nor delete pods.
#[test]
fn the_podmon_controller_has_its_own_service_account() {
    let external = external_driver_values();
    for values in ["{}", "controller:\n  replicas: 2\n", external.as_str()] {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        rendering.get("ServiceAccount", PODMON_CONTROLLER_ACCOUNT);
        let secret = rendering.get("Secret", PODMON_CONTROLLER_TOKEN);
        assert_eq!(secret["type"], "kubernetes.io/service-account-token");
        assert_eq!(
            secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
            PODMON_CONTROLLER_ACCOUNT
        );
        let podmon = container(rendering.controller(), "podmon").unwrap();
        assert!(
            mounts(podmon).contains(&("podmon-token".into(), TOKEN_DIR.into(), String::new())),
            "{values}"
        );
        let podmon_roles = bound_roles(&rendering, PODMON_CONTROLLER_ACCOUNT);
        assert!(
            podmon_roles.contains(&("ClusterRole".into(), "csi-suite-podmon-controller".into())),
            "{values}"
        );
        for (kind, role) in bound_roles(&rendering, "csi-suite-controller") {
            for (group, resource, verbs) in rendering.rules(&kind, &role) {
                let has = |verb: &str| verbs.iter().any(|v| v == verb);
                match (group.as_str(), resource.as_str()) {
                    ("", "nodes") => assert!(!has("patch"), "{role} patches Nodes"),
                    ("", "pods") => assert!(!has("delete"), "{role} deletes pods"),
                    _ => {}
                }
            }
        }
        assert_least_privilege(&rendering);
    }
    let off = Rendering::of("podmon:\n  enabled: false\n").unwrap();
    assert!(
        off.find("ServiceAccount", PODMON_CONTROLLER_ACCOUNT)
            .is_none()
    );
    assert!(off.find("Secret", PODMON_CONTROLLER_TOKEN).is_none());
}

/// csi-resizer watches pods only with --handle-volume-inuse-error (on by default), and the
/// chart grants it `list`/`watch` on pods exactly when its own parser says it watches them.
#[test]
fn the_resizer_may_watch_pods_only_when_it_does() {
    let cases = [
        ("{}", true),
        (
            "resizer:\n  extraArgs: [--handle-volume-inuse-error=false]\n",
            false,
        ),
        (
            "resizer:\n  extraArgs: [-handle-volume-inuse-error=F]\n",
            false,
        ),
        (
            "resizer:\n  extraArgs: [--handle-volume-inuse-error=0]\n",
            false,
        ),
        (
            "resizer:\n  extraArgs: [--handle-volume-inuse-error]\n",
            true,
        ),
    ];
    for (values, watches) in cases {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        let resizer = container(rendering.controller(), "csi-resizer").unwrap();
        let parsed: csi_resizer::flags::ResizerArgs =
            csi_grpc::flags::try_parse_from(argv(resizer)).unwrap();
        assert_eq!(parsed.handle_volume_inuse_error, watches, "{values}");
        let verbs = rendering.verbs(
            "ClusterRole",
            "csi-suite-external-resizer-runner",
            "",
            "pods",
        );
        let expected: &[&str] = if watches { &["list", "watch"] } else { &[] };
        assert_eq!(verbs, expected, "{values}");
        assert_least_privilege(&rendering);
    }
}

#[test]
fn two_replicas_turn_leader_election_on() {
    for values in [
        "controller:\n  replicas: 2\n",
        "leaderElection:\n  enabled: true\n  leaseDuration: 30s\n",
    ] {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        let controller = rendering.controller();
        let lease_duration = if values.contains("30s") { "30s" } else { "15s" };
        for name in ["csi-provisioner", "csi-attacher", "csi-resizer", "podmon"] {
            let sidecar = container(controller, name).unwrap();
            let on = if name == "podmon" {
                "--leaderelection=true"
            } else {
                "--leader-election=true"
            };
            assert!(has_arg(sidecar, on), "{name}: {:?}", args(sidecar));
            assert!(has_arg(
                sidecar,
                &format!("--leader-election-lease-duration={lease_duration}")
            ));
            assert!(parse_with_binary(sidecar));
        }
        let deployment = rendering.get("Deployment", "csi-suite-controller");
        assert!(deployment["spec"]["strategy"].is_null(), "rolling update");
        assert_eq!(
            rendering.rules("Role", "csi-suite-leader-election"),
            [
                (
                    "coordination.k8s.io".to_string(),
                    "leases".to_string(),
                    vec![
                        "get".to_string(),
                        "create".to_string(),
                        "update".to_string()
                    ]
                ),
                (
                    String::new(),
                    "events".to_string(),
                    vec!["create".to_string(), "patch".to_string()]
                )
            ]
        );
        assert_eq!(
            rendering.get("Role", "csi-suite-leader-election")["metadata"]["namespace"],
            "storage"
        );
        assert_least_privilege(&rendering);
    }
}

#[test]
fn custom_socket_paths_reach_every_container() {
    let values = "
driver:
  name: fast.storage.example.org
  socketDir: /plugin/sock
  socketName: driver.sock
node:
  kubeletDir: /data/kubelet
";
    let Some(rendering) = Rendering::of(values) else {
        return;
    };
    let socket = "/plugin/sock/driver.sock";
    for pod in [rendering.controller(), rendering.node()] {
        for container in pod["containers"].as_array().unwrap() {
            let name = str(&container["name"]);
            assert!(parse_with_binary(container), "{name}");
            let args = args(container);
            let address = args
                .iter()
                .find_map(|a| {
                    ["--csi-address=", "--csisock=", "--endpoint="]
                        .iter()
                        .find_map(|flag| a.strip_prefix(flag))
                })
                .unwrap_or_else(|| panic!("{name} names no socket: {args:?}"));
            assert!(
                address == socket || address == format!("unix://{socket}"),
                "{name}: {address}"
            );
            assert!(
                mounts(container)
                    .iter()
                    .any(|(_, path, _)| path == "/plugin/sock"),
                "{name} mounts the socket directory"
            );
        }
    }
    let node = rendering.node();
    let plugin_dir = "/data/kubelet/plugins/fast.storage.example.org";
    assert!(has_arg(
        container(node, "node-driver-registrar").unwrap(),
        &format!("--kubelet-registration-path={plugin_dir}/driver.sock")
    ));
    assert_eq!(host_path(node, "plugin-dir"), plugin_dir);
    assert_eq!(host_path(node, "kubelet-dir"), "/data/kubelet");
    assert_eq!(
        host_path(node, "registration-dir"),
        "/data/kubelet/plugins_registry"
    );
    let podmon = container(node, "podmon").unwrap();
    assert!(has_arg(podmon, "--kubelet-dir=/data/kubelet"));
    assert!(has_arg(podmon, "--labelvalue=fast.storage.example.org"));
    assert!(mounts(podmon).contains(&(
        "kubelet-dir".into(),
        "/data/kubelet".into(),
        "Bidirectional".into()
    )));
    assert_eq!(node["tolerations"][0]["key"], "fast.podmon.storage/fenced");
    rendering.get("CSIDriver", "fast.storage.example.org");
}

#[test]
fn secrets_are_get_only_and_only_for_the_components_that_read_them() {
    let Some(rendering) = Rendering::of("rbac:\n  secrets: true\n") else {
        return;
    };
    for role in CONTROLLER_RBAC {
        assert_eq!(
            rendering.verbs("ClusterRole", role, "", "secrets"),
            ["get"],
            "{role}"
        );
    }
    assert!(
        rendering
            .verbs("ClusterRole", "csi-suite-podmon-node", "", "secrets")
            .is_empty()
    );
    assert_least_privilege(&rendering);
}

#[test]
fn the_external_driver_example_keeps_the_vendor_driver_and_our_sidecars() {
    let values = external_driver_values();
    let Some(rendering) = Rendering::of(&values) else {
        return;
    };
    for pod in [rendering.controller(), rendering.node()] {
        assert_eq!(pod["imagePullSecrets"][0]["name"], "registry-example-com");
        for container in pod["containers"].as_array().unwrap() {
            let ours = parse_with_binary(container);
            let image = str(&container["image"]);
            if str(&container["name"]) == "driver" {
                assert!(!ours);
                assert_eq!(
                    image,
                    "registry.example.com/storage/csi-block-driver:v2.4.0"
                );
                assert_eq!(container["command"][0], "/csi-block-driver");
            } else {
                assert!(ours, "{container:#}");
                assert_eq!(image, "registry.example.com/storage/csi-suite:0.1.0");
            }
        }
    }
    assert!(
        rendering.node().get("hostPID").is_none(),
        "not for a driver that fences at its array"
    );
    let controller = rendering.controller();
    let provisioner = container(controller, "csi-provisioner").unwrap();
    assert!(has_arg(provisioner, "--leader-election=true"));
    assert!(has_arg(provisioner, "--enable-capacity"));
    assert!(has_arg(provisioner, "--worker-threads=50"));
    assert_eq!(
        rendering.verbs(
            "Role",
            "csi-suite-external-provisioner-cfg",
            "storage.k8s.io",
            "csistoragecapacities"
        ),
        ["list", "watch", "create", "update", "delete"]
    );
    assert_eq!(
        rendering.verbs(
            "Role",
            "csi-suite-external-provisioner-cfg",
            "apps",
            "replicasets"
        ),
        ["get"]
    );
    let class = rendering.get("StorageClass", "example-block");
    assert_eq!(class["provisioner"], "block.csi.example.com");
    assert_eq!(class["parameters"]["pool"], "gold");
    let tolerated: Vec<&str> = rendering.node()["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| str(&t["key"]))
        .collect();
    assert!(tolerated.contains(&"node.kubernetes.io/out-of-service"));
    assert!(tolerated.contains(&"block.podmon.storage/fenced"));
    assert_least_privilege(&rendering);
}

/// The COSI part: off by default; with the sample driver, cosi-s3 on the S3 endpoint with the
/// administrator's key from the Secret, its socket shared with cosi-provisioner in an emptyDir,
/// the classes of its driver and the CRDs kept at uninstall; with a vendor's driver (the
/// example), their image and command beside our sidecar.
#[test]
fn the_cosi_part_runs_the_controller_and_a_driver_with_its_sidecar() {
    let Some(default) = Rendering::of("{}") else {
        return;
    };
    assert!(
        default
            .names()
            .iter()
            .all(|name| !name.contains("cosi") && !name.contains("Bucket")),
        "{:?}",
        default.names()
    );
    let Some(sample) = Rendering::of(COSI_SAMPLE) else {
        return;
    };
    let crds: Vec<&Value> = sample
        .objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let mut kinds: Vec<&str> = crds
        .iter()
        .map(|crd| str(&crd["spec"]["names"]["kind"]))
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "Bucket",
            "BucketAccess",
            "BucketAccessClass",
            "BucketClaim",
            "BucketClass"
        ]
    );
    for crd in crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
    let driver_pod = sample.cosi("cosi-driver").unwrap();
    let driver = container(driver_pod, "driver").unwrap();
    assert!(parse_with_binary(driver));
    assert_eq!(
        args(driver),
        [
            "--driver-name=s3.cosi.csi-suite.io",
            "--s3-endpoint=http://s3.example.com:9000",
            "--region=us-east-1"
        ]
    );
    let env = driver["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "COSI_ENDPOINT");
    assert_eq!(env[0]["value"], "unix:///var/lib/cosi/cosi.sock");
    for (variable, key) in env[1..]
        .iter()
        .zip(["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    {
        assert_eq!(variable["name"], key);
        assert_eq!(variable["valueFrom"]["secretKeyRef"]["name"], "s3-admin");
        assert_eq!(variable["valueFrom"]["secretKeyRef"]["key"], key);
    }
    let sidecar = container(driver_pod, "cosi-provisioner").unwrap();
    assert!(parse_with_binary(sidecar));
    assert!(has_arg(
        sidecar,
        "--driver-addr=unix:///var/lib/cosi/cosi.sock"
    ));
    assert!(has_arg(sidecar, "--leader-election=true"));
    for container in [driver, sidecar] {
        assert!(
            mounts(container).contains(&(
                "cosi-socket".to_string(),
                "/var/lib/cosi".to_string(),
                String::new()
            )),
            "{container:#}"
        );
    }
    assert!(driver_pod["volumes"][0]["emptyDir"].is_object());
    let controller = container(sample.cosi("cosi-controller").unwrap(), "cosi-controller").unwrap();
    assert!(parse_with_binary(controller));
    assert!(has_arg(controller, "--leader-election=false"));
    let class = sample.get("BucketClass", "csi-suite-buckets");
    assert_eq!(class["driverName"], "s3.cosi.csi-suite.io");
    assert_eq!(class["deletionPolicy"], "Delete");
    let access_class = sample.get("BucketAccessClass", "csi-suite-keys");
    assert_eq!(access_class["driverName"], "s3.cosi.csi-suite.io");
    assert_eq!(access_class["authenticationType"], "Key");
    assert_least_privilege(&sample);

    let external = external_driver_values();
    let Some(vendor) = Rendering::of(&external) else {
        return;
    };
    let driver_pod = vendor.cosi("cosi-driver").unwrap();
    let driver = container(driver_pod, "driver").unwrap();
    assert!(!parse_with_binary(driver));
    assert_eq!(
        str(&driver["image"]),
        "registry.example.com/storage/cosi-objects-driver:v1.3.0"
    );
    assert_eq!(
        args(driver),
        [
            "--endpoint=unix:///var/lib/cosi/cosi.sock",
            "--config=/etc/cosi-objects/store.yaml"
        ]
    );
    assert_eq!(driver["env"].as_array().unwrap().len(), 1);
    let sidecar = container(driver_pod, "cosi-provisioner").unwrap();
    assert!(parse_with_binary(sidecar));
    assert_eq!(
        str(&sidecar["image"]),
        "registry.example.com/storage/csi-suite:0.1.0"
    );
    let controller = container(vendor.cosi("cosi-controller").unwrap(), "cosi-controller").unwrap();
    assert!(has_arg(controller, "--leader-election=true"));
    assert_eq!(
        vendor.get("BucketClass", "example-objects")["driverName"],
        "objects.example.com"
    );
}

/// Every container of every workload (the snapshot-controller's too) has a CPU and a memory
/// request and a memory limit, and no CPU limit (values.yaml says why); a component's values
/// change them or, with `null`, drop them.
#[test]
fn every_container_has_requests_and_a_memory_limit() {
    let external = external_driver_values();
    let snapshots = "snapshotter:\n  enabled: true\nsnapshotController:\n  enabled: true\n";
    for values in [
        "{}",
        external.as_str(),
        INVENTORY_BOTH,
        COSI_SAMPLE,
        snapshots,
    ] {
        let Some(rendering) = Rendering::of(values) else {
            return;
        };
        let snapshot_controller = rendering
            .find("Deployment", "csi-suite-snapshot-controller")
            .map(|d| ("snapshot-controller", &d["spec"]["template"]["spec"]));
        for (pod_name, pod) in rendering.pods().into_iter().chain(snapshot_controller) {
            for container in pod["containers"].as_array().unwrap() {
                let at = format!("{values}: {pod_name}/{}", str(&container["name"]));
                let resources = &container["resources"];
                assert!(resources["requests"]["cpu"].is_string(), "{at}");
                assert!(resources["requests"]["memory"].is_string(), "{at}");
                assert!(resources["limits"]["memory"].is_string(), "{at}");
                assert!(resources["limits"]["cpu"].is_null(), "{at}: no CPU limit");
            }
        }
    }
    let provisioner = |values: &str| {
        let rendering = Rendering::of(values).unwrap();
        container(rendering.controller(), "csi-provisioner").unwrap()["resources"].clone()
    };
    assert_eq!(
        provisioner("provisioner:\n  resources:\n    limits:\n      memory: 1Gi\n"),
        serde_json::json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}})
    );
    assert!(provisioner("provisioner:\n  resources: null\n").is_null());
}

/// Images layer field by field: a workload's image over the suite's (the nodes move to a new
/// version while the controller is held back), and a sidecar's own image over its workload's.
#[test]
fn images_layer_suite_then_workload_then_component() {
    let values = "
image:
  tag: \"0.2.0\"
driver:
  image:
    repository: registry.example.com/driver
    tag: v2
  controller:
    image:
      tag: v1
controller:
  image:
    tag: \"0.1.0\"
attacher:
  image:
    repository: mirror.example.com/csi-suite
";
    let Some(rendering) = Rendering::of(values) else {
        return;
    };
    let image = |pod: &Value, name: &str| str(&container(pod, name).unwrap()["image"]).to_string();
    let controller = rendering.controller();
    let node = rendering.node();
    assert_eq!(
        image(controller, "driver"),
        "registry.example.com/driver:v1"
    );
    assert_eq!(image(controller, "csi-provisioner"), "csi-suite:0.1.0");
    assert_eq!(image(controller, "csi-resizer"), "csi-suite:0.1.0");
    assert_eq!(
        image(controller, "csi-attacher"),
        "mirror.example.com/csi-suite:0.1.0"
    );
    assert_eq!(image(node, "driver"), "registry.example.com/driver:v2");
    assert_eq!(image(node, "node-driver-registrar"), "csi-suite:0.2.0");
    assert_eq!(image(node, "podmon"), "csi-suite:0.2.0");
}

/// Bad values are refused before anything reaches a cluster, with the field named
/// (values.schema.json).
#[test]
fn bad_values_are_refused_with_the_field_named() {
    let cases = [
        ("driver:\n  name: Not_A_DNS_Name\n", "/driver/name"),
        ("driver:\n  socketDir: relative/dir\n", "/driver/socketDir"),
        ("node:\n  kubeletDir: var/lib/kubelet\n", "/node/kubeletDir"),
        (
            "csiDriver:\n  fsGroupPolicy: Sometimes\n",
            "/csiDriver/fsGroupPolicy",
        ),
        (
            "csiDriver:\n  volumeLifecycleModes: [Forever]\n",
            "/csiDriver/volumeLifecycleModes",
        ),
        ("controller:\n  replicas: -1\n", "/controller/replicas"),
        (
            "podmon:\n  maxEvacuatedFraction: 1.5\n",
            "/podmon/maxEvacuatedFraction",
        ),
        (
            "podmon:\n  arrayConnectivityPollRate: 0\n",
            "/podmon/arrayConnectivityPollRate",
        ),
        (
            "leaderElection:\n  leaseDuration: 15\n",
            "/leaderElection/leaseDuration",
        ),
        (
            "provisioner:\n  extraArgs: --one-flag\n",
            "/provisioner/extraArgs",
        ),
        (
            "attacher:\n  image:\n    pullPolicy: Sometimes\n",
            "/attacher/image/pullPolicy",
        ),
        ("resizer:\n  httpPort: 0\n", "/resizer/httpPort"),
        (
            "storageClass:\n  parameters:\n    replicas: 3\n",
            "/storageClass/parameters/replicas",
        ),
        (
            "serviceAccount:\n  projectedToken: maybe\n",
            "/serviceAccount/projectedToken",
        ),
        (
            "driver:\n  controller:\n    node: -node-1\n",
            "/driver/controller/node",
        ),
        (
            "inventory:\n  cronJob:\n    schedule: hourly\n",
            "/inventory/cronJob/schedule",
        ),
        (
            "inventory:\n  cronJob:\n    socketHostDir: var/lib/csi\n",
            "/inventory/cronJob/socketHostDir",
        ),
        (
            "inventory:\n  scanInterval: 10\n",
            "/inventory/scanInterval",
        ),
        (
            "inventory:\n  serve:\n    port: 0\n",
            "/inventory/serve/port",
        ),
        (
            "inventory:\n  cronJob:\n    failedJobsHistoryLimit: -1\n",
            "/inventory/cronJob/failedJobsHistoryLimit",
        ),
        (
            "cosi:\n  s3:\n    endpoint: s3.example.com\n",
            "/cosi/s3/endpoint",
        ),
        (
            "cosi:\n  bucketClass:\n    deletionPolicy: Keep\n",
            "/cosi/bucketClass/deletionPolicy",
        ),
        ("cosi:\n  driverName: Objects\n", "/cosi/driverName"),
        (
            "csiDriver:\n  tokenRequests: [{audience: vault, expirationSeconds: 60}]\n",
            "/csiDriver/tokenRequests/0/expirationSeconds",
        ),
        (
            "csiDriver:\n  tokenRequests: [{expirationSeconds: 3600}]\n",
            "/csiDriver/tokenRequests/0",
        ),
        (
            "csiDriver:\n  nodeAllocatableUpdatePeriodSeconds: 5\n",
            "/csiDriver/nodeAllocatableUpdatePeriodSeconds",
        ),
        (
            "csiDriver:\n  serviceAccountTokenInSecrets: \"yes\"\n",
            "/csiDriver/serviceAccountTokenInSecrets",
        ),
        (
            "csiDriver:\n  preventPodSchedulingIfMissing: 1\n",
            "/csiDriver/preventPodSchedulingIfMissing",
        ),
        ("csiDriver:\n  seLinuxMounts: true\n", "seLinuxMounts"),
        (
            "controller:\n  podDisruptionBudget:\n    minAvailable: half\n",
            "/controller/podDisruptionBudget/minAvailable",
        ),
        (
            "controller:\n  podDisruptionBudget:\n    enabled: sometimes\n",
            "/controller/podDisruptionBudget/enabled",
        ),
        (
            "metrics:\n  serviceMonitor:\n    interval: 30\n",
            "/metrics/serviceMonitor/interval",
        ),
        (
            "metrics:\n  serviceMonitor:\n    scrapeTimeout: soon\n",
            "/metrics/serviceMonitor/scrapeTimeout",
        ),
        (
            "metrics:\n  service:\n    labels: {tier: 1}\n",
            "/metrics/service/labels/tier",
        ),
        (
            "provisioner:\n  livenessProbe:\n    path: healthz\n",
            "/provisioner/livenessProbe/path",
        ),
        (
            "attacher:\n  livenessProbe:\n    pth: /healthz\n",
            "/attacher/livenessProbe",
        ),
        (
            "snapshotController:\n  livenessProbe:\n    periodSeconds: 0\n",
            "/snapshotController/livenessProbe/periodSeconds",
        ),
        ("registrar:\n  command: registrar\n", "/registrar/command"),
        (
            "livenessProbe:\n  command: [\"\"]\n",
            "/livenessProbe/command/0",
        ),
        (
            "snapshotMetadata:\n  tls:\n    caCert: not a certificate\n",
            "/snapshotMetadata/tls/caCert",
        ),
        (
            "snapshotMetadata:\n  tls:\n    validityDays: 0\n",
            "/snapshotMetadata/tls/validityDays",
        ),
        (
            "snapshotMetadata:\n  service:\n    name: Backup_CBT\n",
            "/snapshotMetadata/service/name",
        ),
        (
            "snapshotMetadata:\n  readinessProbe:\n    path: health\n",
            "/snapshotMetadata/readinessProbe/path",
        ),
        (
            "snapshotMetadata:\n  enabled: true\n  tls:\n    existingSecret: backup-tls\n",
            "snapshotMetadata.tls.caCert is required with snapshotMetadata.tls.existingSecret",
        ),
        ("cosi:\n  driver:\n    enabled: true\n", "cosi.s3.endpoint"),
        (
            "cosi:\n  driver:\n    enabled: true\n  s3:\n    endpoint: http://s3:9000\n",
            "cosi.s3.credentialsSecret",
        ),
    ];
    for (values, field) in cases {
        let Some(output) = template(values) else {
            return;
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{values} was accepted");
        assert!(stderr.contains(field), "{values}: {stderr}");
    }
}

/// The chart installs on the oldest Kubernetes the suite is tested on (v1.19), but refuses
/// capacity tracking there, whose API (CSIStorageCapacity v1) arrived in 1.24.
#[test]
fn capacity_tracking_is_refused_on_a_cluster_without_its_api() {
    let Some(plain) = template_for("{}", Some("1.19.16")) else {
        return;
    };
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let capacity = "provisioner:\n  capacity:\n    enabled: true\n";
    let refused = template_for(capacity, Some("1.19.16")).unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "capacity tracking on v1.19 was accepted"
    );
    assert!(stderr.contains("CSIStorageCapacity"), "{stderr}");
    let accepted = template_for(capacity, Some("1.24.0")).unwrap();
    assert!(accepted.status.success());
}

/// CSIDriver fields newer than the cluster are left out (v1.19 refuses requiresRepublish and
/// seLinuxMount), and asking for one there is refused with the field named.
#[test]
fn csidriver_fields_follow_the_cluster_version() {
    let Some(old) = template_for("{}", Some("1.19.16")) else {
        return;
    };
    let text = String::from_utf8_lossy(&old.stdout);
    assert!(old.status.success());
    assert!(text.contains("kind: CSIDriver"));
    assert!(!text.contains("requiresRepublish") && !text.contains("seLinuxMount"));
    let new = template_for("{}", Some("1.25.0")).unwrap();
    let text = String::from_utf8_lossy(&new.stdout);
    assert!(text.contains("requiresRepublish: false") && text.contains("seLinuxMount: false"));
    for (values, field) in [
        (
            "csiDriver:\n  requiresRepublish: true\n",
            "requiresRepublish",
        ),
        ("csiDriver:\n  seLinuxMount: true\n", "seLinuxMount"),
    ] {
        let refused = template_for(values, Some("1.19.16")).unwrap();
        assert!(!refused.status.success(), "{values} accepted on v1.19");
        assert!(String::from_utf8_lossy(&refused.stderr).contains(field));
    }
}

/// Values with the controller's PodDisruptionBudget, the metrics Services and every CSIDriver
/// field of the API version the tests' types know (1.33).
const PDB_AND_METRICS: &str = "controller:
  replicas: 2
metrics:
  service:
    enabled: true
    annotations: {prometheus.io/scrape: \"false\"}
csiDriver:
  volumeLifecycleModes: [Persistent, Ephemeral]
  tokenRequests: [{audience: vault, expirationSeconds: 3600}]
  requiresRepublish: true
  seLinuxMount: true
  nodeAllocatableUpdatePeriodSeconds: 60
";

/// Every rendered object is a valid object of its kind: it survives a round trip through the
/// Kubernetes API types unchanged, so no field is misspelled, misplaced or of the wrong type
/// (what `kubeconform -strict` checks), in each values set the other tests use.
#[test]
fn every_rendered_object_is_a_valid_kubernetes_object() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::batch::v1::CronJob;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    fn round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(object: &Value) -> Value {
        let typed: K =
            serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("{e}: {object:#}"));
        serde_json::to_value(typed).unwrap()
    }
    let external = external_driver_values();
    for values in [
        "{}",
        external.as_str(),
        "controller:\n  replicas: 3\nprovisioner:\n  capacity:\n    enabled: true\nrbac:\n  secrets: true\nstorageClass:\n  create: true\n  isDefault: true\n  mountOptions: [noatime]\n",
        "podmon:\n  enabled: false\nlivenessProbe:\n  enabled: false\nnode:\n  tolerations: [{operator: Exists}]\n",
        "inventory:\n  serve:\n    enabled: true\n  cronJob:\n    enabled: true\ncontroller:\n  tolerations: [{operator: Exists}]\n",
        COSI_SAMPLE,
        VAP_SERVED,
        PDB_AND_METRICS,
        SNAPSHOT_METADATA,
        SNAPSHOT_METADATA_CRDS,
        USERS_CERTIFICATE,
    ] {
        let extra = if values == VAP_SERVED {
            api_versions(VAP_V1)
        } else {
            Vec::new()
        };
        let Some(rendering) = Rendering::with_args(values, &extra) else {
            return;
        };
        for object in &rendering.objects {
            let typed = match str(&object["kind"]) {
                "ServiceAccount" => round_trip::<ServiceAccount>(object),
                "Secret" => round_trip::<Secret>(object),
                "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>(object),
                "ValidatingAdmissionPolicyBinding" => {
                    round_trip::<ValidatingAdmissionPolicyBinding>(object)
                }
                "ConfigMap" => round_trip::<ConfigMap>(object),
                "ClusterRole" => round_trip::<ClusterRole>(object),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(object),
                "Role" => round_trip::<Role>(object),
                "RoleBinding" => round_trip::<RoleBinding>(object),
                "Deployment" => round_trip::<Deployment>(object),
                "DaemonSet" => round_trip::<DaemonSet>(object),
                "CSIDriver" => round_trip::<CSIDriver>(object),
                "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(object),
                "Service" => round_trip::<Service>(object),
                "StorageClass" => round_trip::<StorageClass>(object),
                "CustomResourceDefinition" => round_trip::<CustomResourceDefinition>(object),
                "CronJob" => round_trip::<CronJob>(object),
                "BucketClass" => round_trip::<csi_kinds::objectstorage::BucketClass>(object),
                "BucketAccessClass" => {
                    round_trip::<csi_kinds::objectstorage::BucketAccessClass>(object)
                }
                "SnapshotMetadataService" => {
                    round_trip::<csi_kinds::cbt::SnapshotMetadataService>(object)
                }
                other => panic!("the chart renders a kind this test does not know: {other}"),
            };
            assert_eq!(
                &typed,
                object,
                "{} {} changed in a round trip through its API type",
                str(&object["kind"]),
                str(&object["metadata"]["name"])
            );
        }
    }
}

/// The NOTES of `helm install --dry-run=client` (with a StorageClass) and `extra` arguments;
/// None when helm is missing.
fn notes(extra: &[&str]) -> Option<String> {
    let output = Command::new(helm()?)
        .current_dir(workspace())
        .args(["install", "csi-suite", CHART, "--namespace", "storage"])
        .args(["--dry-run=client", "--set", "storageClass.create=true"])
        .args(extra)
        .output()
        .expect("helm runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    Some(text[text.find("NOTES:").expect("helm prints the notes")..].to_string())
}

/// The reference driver's controller keeps its state in a hostPath directory: with
/// driver.controller.node it is pinned to that node (on top of controller.nodeSelector);
/// without, it goes anywhere and the notes warn. A vendor's driver (no hostPath) is neither
/// pinned nor warned about.
#[test]
fn the_reference_driver_controller_stays_on_the_node_holding_its_state() {
    let pinned =
        "driver:\n  controller:\n    node: node-1\ncontroller:\n  nodeSelector:\n    disk: ssd\n";
    let Some(rendering) = Rendering::of(pinned) else {
        return;
    };
    assert_eq!(
        rendering.controller()["nodeSelector"],
        serde_json::json!({"disk": "ssd", "kubernetes.io/hostname": "node-1"})
    );
    let unpinned = Rendering::of("{}").unwrap();
    assert!(unpinned.controller()["nodeSelector"].is_null());
    let external = Rendering::of(&external_driver_values()).unwrap();
    assert!(
        external.controller()["nodeSelector"]
            .get("kubernetes.io/hostname")
            .is_none()
    );

    let warning = "WARNING: the driver's controller keeps its state on its node \
                   (/var/lib/csi-hostpath-data, a hostPath)";
    let warned = notes(&[]).unwrap();
    assert!(warned.contains(warning), "{warned}");
    assert!(warned.contains("--set driver.controller.node=<node>"));
    let examples = format!("{CHART}/examples/external-driver.yaml");
    for extra in [
        &["--set", "driver.controller.node=node-1"][..],
        &["--values", &examples][..],
    ] {
        let text = notes(extra).unwrap();
        assert!(!text.contains("WARNING"), "{extra:?}: {text}");
    }
}

/// NOTES.txt tells the user what was installed and how to check it, following the values.
#[test]
fn the_notes_say_what_was_installed_and_how_to_check_it() {
    let Some(default) = notes(&[]) else {
        return;
    };
    assert_mentions(
        &default,
        &[
            "Deployment csi-suite-controller (1 replica(s), leader election false)",
            "csi-provisioner, csi-attacher, csi-resizer, podmon (controller), livenessprobe",
            "DaemonSet csi-suite-node",
            "CSIDriver hostpath.csi-suite.io",
            "StorageClass csi-suite",
            "kubectl -n storage rollout status daemonset/csi-suite-node",
            "podmon.dellemc.com/driver=hostpath.csi-suite.io",
            "--set controller.replicas=0",
        ],
    );
    let trimmed = notes(&[
        "--set",
        "attacher.enabled=false,resizer.enabled=false,podmon.enabled=false,controller.replicas=2",
    ])
    .unwrap();
    assert!(
        trimmed.contains("(2 replica(s), leader election true)"),
        "{trimmed}"
    );
    assert!(!trimmed.contains("csi-attacher"), "{trimmed}");
    assert!(!trimmed.contains("csi-resizer"), "{trimmed}");
    assert!(!trimmed.contains("podmon"), "{trimmed}");
}

/// The driver socket's volume of a pod.
fn socket_volume(pod: &Value) -> &Value {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "socket-dir")
        .expect("a socket-dir volume")
}

/// A csi-inventory container's `report` as the binary parses it.
fn inventory_report(container: &Value) -> csi_inventory::flags::ReportArgs {
    let parsed: csi_inventory::flags::InventoryArgs =
        csi_grpc::flags::try_parse_from(argv(container)).unwrap();
    match parsed.command {
        csi_inventory::flags::Command::Report(report) => report,
        other => panic!("not a report: {other:?}"),
    }
}

/// The inventory's ClusterRole: `list` on PVs, pods (their CSI inline volumes) and
/// VolumeSnapshotContents, nothing else.
fn assert_inventory_rules(rendering: &Rendering) {
    let rule = |group: &str, resource: &str| {
        (
            group.to_string(),
            resource.to_string(),
            vec!["list".to_string()],
        )
    };
    assert_eq!(
        rendering.rules("ClusterRole", INVENTORY_RBAC),
        [
            rule("", "persistentvolumes"),
            rule("", "pods"),
            rule("snapshot.storage.k8s.io", "volumesnapshotcontents")
        ]
    );
}

/// The inventory is off by default: no container, no CronJob, no RBAC, no ServiceAccount, and
/// the controller's socket stays in its emptyDir.
#[test]
fn the_inventory_is_off_by_default() {
    let Some(rendering) = Rendering::of("{}") else {
        return;
    };
    assert!(container(rendering.controller(), "csi-inventory").is_none());
    assert!(rendering.inventory_job().is_none());
    assert!(rendering.find("ClusterRole", INVENTORY_RBAC).is_none());
    assert!(
        rendering
            .find("ClusterRoleBinding", INVENTORY_RBAC)
            .is_none()
    );
    assert!(
        rendering
            .find("ServiceAccount", "csi-suite-inventory")
            .is_none()
    );
    assert_eq!(
        socket_volume(rendering.controller())["emptyDir"],
        serde_json::json!({})
    );
}

/// inventory.serve: `csi-inventory report --serve` in the controller pod on the driver's socket,
/// its gauges and /healthz on a port of its own, as the other sidecars run; the controller's
/// ServiceAccount is bound to a ClusterRole of two lists. The socket stays in the emptyDir.
#[test]
fn the_inventory_serves_its_findings_from_the_controller_pod() {
    let values = "inventory:\n  serve:\n    enabled: true\n    port: 9900\n  scanInterval: 5m\n";
    let Some(rendering) = Rendering::of(values) else {
        return;
    };
    let controller = rendering.controller();
    let inventory = container(controller, "csi-inventory").expect("the serving container");
    assert!(parse_with_binary(inventory));
    let report = inventory_report(inventory);
    assert!(report.serve);
    assert_eq!(report.scan_interval, Duration::from_secs(300));
    assert_eq!(report.http.http_endpoint, ":9900");
    assert_eq!(report.target.csi.csi_address, "/csi/csi.sock");
    assert_eq!(report.target.csi.timeout, Duration::from_secs(60));
    assert_eq!(inventory["ports"][0]["name"], "inventory");
    assert_eq!(inventory["ports"][0]["containerPort"], 9900);
    assert_eq!(
        inventory["livenessProbe"]["httpGet"],
        serde_json::json!({"path": "/healthz", "port": "inventory"})
    );
    assert!(mounts(inventory).contains(&("socket-dir".into(), "/csi".into(), String::new())));
    assert_eq!(
        inventory["securityContext"],
        container(controller, "csi-resizer").unwrap()["securityContext"],
        "as the other sidecars"
    );
    assert_eq!(inventory["securityContext"]["runAsUser"], 65532);
    assert_eq!(socket_volume(controller)["emptyDir"], serde_json::json!({}));
    let mut ports = Vec::new();
    for sidecar in controller["containers"].as_array().unwrap() {
        for port in sidecar["ports"].as_array().into_iter().flatten() {
            let number = port["containerPort"].as_u64().unwrap();
            assert!(!ports.contains(&number), "port {number} twice");
            ports.push(number);
        }
    }
    assert_inventory_rules(&rendering);
    assert!(rendering.inventory_job().is_none());
    assert!(
        rendering
            .find("ServiceAccount", "csi-suite-inventory")
            .is_none()
    );
    assert_least_privilege(&rendering);
    assert_tokens(&rendering, true);
}

/// inventory.cronJob: `csi-inventory report` once an hour in a pod next to the controller pod
/// (required podAffinity to its selector, its tolerations), on the same hostPath socket
/// directory the controller pod then uses, with its own ServiceAccount bound to the
/// inventory's ClusterRole; findings fail the Job at once, runs never overlap, and the
/// controller never has two pods on that directory.
#[test]
fn the_inventory_cron_job_runs_next_to_the_controller_on_its_socket() {
    let values = "
inventory:
  cronJob:
    enabled: true
controller:
  tolerations:
    - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}
";
    let Some(rendering) = Rendering::of(values) else {
        return;
    };
    let cron_job = rendering.get("CronJob", "csi-suite-inventory");
    assert_eq!(cron_job["apiVersion"], "batch/v1");
    let spec = &cron_job["spec"];
    assert_eq!(spec["schedule"], "17 * * * *");
    assert_eq!(spec["concurrencyPolicy"], "Forbid");
    assert_eq!(spec["successfulJobsHistoryLimit"], 1);
    assert_eq!(spec["failedJobsHistoryLimit"], 3);
    assert_eq!(spec["jobTemplate"]["spec"]["backoffLimit"], 0);
    assert_eq!(
        spec["jobTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"], "inventory",
        "kubectl get jobs -l app.kubernetes.io/component=inventory (NOTES) finds them"
    );
    let pod = rendering.inventory_job().unwrap();
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["serviceAccountName"], "csi-suite-inventory");
    assert_eq!(container_names(pod), ["csi-inventory"]);
    let inventory = container(pod, "csi-inventory").unwrap();
    assert!(parse_with_binary(inventory));
    let report = inventory_report(inventory);
    assert!(!report.serve, "one report, then exit 0 or 3");
    assert_eq!(report.target.csi.csi_address, "/csi/csi.sock");

    let deployment = rendering.get("Deployment", "csi-suite-controller");
    let terms = &pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(terms.as_array().unwrap().len(), 1, "{terms:#}");
    assert_eq!(terms[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        terms[0]["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pod["tolerations"], rendering.controller()["tolerations"]);
    assert!(pod["tolerations"].is_array());
    let dir = "/var/lib/csi-suite/hostpath.csi-suite.io/controller";
    assert_eq!(
        socket_volume(rendering.controller())["hostPath"],
        serde_json::json!({"path": dir, "type": "DirectoryOrCreate"})
    );
    assert_eq!(
        socket_volume(pod)["hostPath"],
        serde_json::json!({"path": dir, "type": "Directory"})
    );
    let socket_mount = inventory["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "socket-dir")
        .unwrap();
    assert_eq!(socket_mount["mountPath"], "/csi");
    assert_eq!(socket_mount["readOnly"], true);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");

    rendering.get("ServiceAccount", "csi-suite-inventory");
    assert_inventory_rules(&rendering);
    assert!(container(rendering.controller(), "csi-inventory").is_none());
    assert_least_privilege(&rendering);
    assert_tokens(&rendering, true);
}

/// The CronJob reaches the driver wherever its socket is, speaks the cluster's CronJob API
/// (batch/v1beta1 before 1.21, with the same fields), keeps the controller to one pod at a
/// time even with leader election, and is refused with more than one controller replica.
#[test]
fn the_inventory_cron_job_follows_the_socket_the_cluster_and_the_replicas() {
    let values = "
driver:
  name: fast.storage.example.org
  socketDir: /plugin/sock
  socketName: driver.sock
inventory:
  cronJob:
    enabled: true
    schedule: '@daily'
    socketHostDir: /srv/csi/fast
";
    let Some(rendering) = Rendering::of(values) else {
        return;
    };
    let pod = rendering.inventory_job().unwrap();
    let inventory = container(pod, "csi-inventory").unwrap();
    assert_eq!(
        inventory_report(inventory).target.csi.csi_address,
        "/plugin/sock/driver.sock"
    );
    assert!(
        mounts(inventory)
            .iter()
            .any(|(name, path, _)| name == "socket-dir" && path == "/plugin/sock")
    );
    assert_eq!(host_path(pod, "socket-dir"), "/srv/csi/fast");
    assert_eq!(
        host_path(rendering.controller(), "socket-dir"),
        "/srv/csi/fast"
    );
    assert_eq!(
        rendering.get("CronJob", "csi-suite-inventory")["spec"]["schedule"],
        "@daily"
    );
    let named = Rendering::of(
        "driver:\n  name: fast.storage.example.org\ninventory:\n  cronJob:\n    enabled: true\n",
    )
    .unwrap();
    assert_eq!(
        host_path(named.controller(), "socket-dir"),
        "/var/lib/csi-suite/fast.storage.example.org/controller"
    );

    for (version, api_version) in [
        ("1.19.16", "batch/v1beta1"),
        ("1.20.15", "batch/v1beta1"),
        ("1.21.0", "batch/v1"),
    ] {
        let rendering = Rendering::for_version(INVENTORY_BOTH, Some(version)).unwrap();
        let cron_job = rendering.get("CronJob", "csi-suite-inventory");
        assert_eq!(cron_job["apiVersion"], api_version, "{version}");
        // batch/v1beta1's CronJob has the fields of batch/v1's that the chart sets.
        let mut as_v1 = cron_job.clone();
        as_v1["apiVersion"] = "batch/v1".into();
        let typed: k8s_openapi::api::batch::v1::CronJob =
            serde_json::from_value(as_v1.clone()).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), as_v1, "{version}");
    }

    let electing = "leaderElection:\n  enabled: true\ninventory:\n  cronJob:\n    enabled: true\n";
    let rendering = Rendering::of(electing).unwrap();
    assert!(has_arg(
        container(rendering.controller(), "csi-provisioner").unwrap(),
        "--leader-election=true"
    ));
    assert_eq!(
        rendering.get("Deployment", "csi-suite-controller")["spec"]["strategy"]["type"],
        "Recreate"
    );
    let stopped = "controller:\n  replicas: 0\ninventory:\n  cronJob:\n    enabled: true\n";
    assert!(Rendering::of(stopped).is_some(), "the upgrade's first step");
    let two = "controller:\n  replicas: 2\ninventory:\n  cronJob:\n    enabled: true\n";
    let refused = template(two).unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "two replicas on one socket directory"
    );
    assert!(stderr.contains("controller.replicas is 2"), "{stderr}");
    assert!(stderr.contains("inventory.serve"), "{stderr}");
}

/// Asserts that `text` (the notes) contains each of `expected`.
fn assert_mentions(text: &str, expected: &[&str]) {
    for expected in expected {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

/// The notes name the inventory's parts and where their findings are.
#[test]
fn the_notes_tell_where_the_inventory_reports() {
    let Some(text) = notes(&[
        "--set",
        "inventory.serve.enabled=true,inventory.cronJob.enabled=true",
    ]) else {
        return;
    };
    assert_mentions(
        &text,
        &[
            "podmon (controller), csi-inventory, livenessprobe",
            "CronJob csi-suite-inventory (\"17 * * * *\"): csi-inventory report",
            "(every 10m) as gauges on :9811/metrics",
            "csi_inventory_findings > 0",
            "found something (exit 3)",
            "kubectl -n storage get jobs -l app.kubernetes.io/component=inventory",
        ],
    );
    let default = notes(&[]).unwrap();
    assert!(!default.contains("inventory"), "{default}");
}

/// Every CSIDriver field of storage.k8s.io/v1 up to Kubernetes 1.36 renders from its value in
/// `csiDriver`, in the API's types, and a null one is left out (the API's default applies).
#[test]
fn every_csidriver_field_renders_from_its_value() {
    let values = "csiDriver:
  attachRequired: false
  podInfoOnMount: false
  fsGroupPolicy: None
  volumeLifecycleModes: [Persistent, Ephemeral]
  storageCapacity: true
  tokenRequests:
    - audience: vault
      expirationSeconds: 3600
    - audience: \"\"
  requiresRepublish: true
  seLinuxMount: true
  nodeAllocatableUpdatePeriodSeconds: 60
  serviceAccountTokenInSecrets: true
  preventPodSchedulingIfMissing: true
";
    let Some(rendering) = Rendering::for_version(values, Some("1.36.0")) else {
        return;
    };
    assert_eq!(
        rendering.get("CSIDriver", "hostpath.csi-suite.io")["spec"],
        serde_json::json!({
            "attachRequired": false,
            "podInfoOnMount": false,
            "fsGroupPolicy": "None",
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "storageCapacity": true,
            "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}, {"audience": ""}],
            "requiresRepublish": true,
            "seLinuxMount": true,
            "nodeAllocatableUpdatePeriodSeconds": 60,
            "serviceAccountTokenInSecrets": true,
            "preventPodSchedulingIfMissing": true,
        })
    );
    let unset = "csiDriver:
  attachRequired: null
  podInfoOnMount: null
  fsGroupPolicy: null
  volumeLifecycleModes: null
  storageCapacity: null
  requiresRepublish: null
  seLinuxMount: null
";
    let rendering = Rendering::for_version(unset, Some("1.36.0")).unwrap();
    let spec = &rendering.get("CSIDriver", "hostpath.csi-suite.io")["spec"];
    assert!(
        spec.is_null() || spec == &serde_json::json!({}),
        "unset fields rendered: {spec:#}"
    );
}

/// Each CSIDriver field newer than the cluster is refused with the field and the Kubernetes
/// version it needs (the first storage.k8s.io/v1 with it), and accepted from that version on;
/// a false one is left out instead, as a cluster without the field behaves. The fields of 1.19
/// and older are in every cluster the chart installs on (kubeVersion >=1.19).
#[test]
fn each_csidriver_field_is_refused_before_its_kubernetes_version() {
    let tokens = "  tokenRequests: [{audience: vault}]\n";
    let cases = [
        ("tokenRequests", tokens.to_string(), "1.19.16", "1.20.0"),
        (
            "requiresRepublish",
            "  requiresRepublish: true\n".to_string(),
            "1.19.16",
            "1.20.0",
        ),
        (
            "seLinuxMount",
            "  seLinuxMount: true\n".to_string(),
            "1.24.17",
            "1.25.0",
        ),
        (
            "nodeAllocatableUpdatePeriodSeconds",
            "  nodeAllocatableUpdatePeriodSeconds: 30\n".to_string(),
            "1.32.9",
            "1.33.0",
        ),
        (
            "serviceAccountTokenInSecrets",
            format!("{tokens}  serviceAccountTokenInSecrets: true\n"),
            "1.34.3",
            "1.35.0",
        ),
        (
            "preventPodSchedulingIfMissing",
            "  preventPodSchedulingIfMissing: true\n".to_string(),
            "1.35.2",
            "1.36.0",
        ),
    ];
    for (field, set, older, since) in cases {
        let values = format!("csiDriver:\n{set}");
        let Some(refused) = template_for(&values, Some(older)) else {
            return;
        };
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{field} accepted on {older}");
        let minor = since.trim_end_matches(".0");
        assert!(
            stderr.contains(&format!(
                "csiDriver.{field} needs Kubernetes {minor} (the first storage.k8s.io/v1 CSIDriver with {field}); this cluster is v{older}"
            )),
            "{field}: {stderr}"
        );
        let rendering = Rendering::for_version(&values, Some(since)).unwrap();
        let spec = &rendering.get("CSIDriver", "hostpath.csi-suite.io")["spec"];
        assert!(
            !spec[field].is_null(),
            "{field} missing on {since}: {spec:#}"
        );

        if set.contains("true") && !set.contains("tokenRequests") {
            let off = format!("csiDriver:\n  {field}: false\n");
            let rendering = Rendering::for_version(&off, Some(older)).unwrap();
            let spec = &rendering.get("CSIDriver", "hostpath.csi-suite.io")["spec"];
            assert!(spec[field].is_null(), "false {field} rendered on {older}");
            let rendering = Rendering::for_version(&off, Some(since)).unwrap();
            let spec = &rendering.get("CSIDriver", "hostpath.csi-suite.io")["spec"];
            assert_eq!(spec[field], false, "{field} on {since}");
        }
    }

    // The API server refuses serviceAccountTokenInSecrets without tokenRequests, false too.
    let alone = template_for(
        "csiDriver:\n  serviceAccountTokenInSecrets: false\n",
        Some("1.36.0"),
    )
    .unwrap();
    assert!(!alone.status.success());
    assert!(
        String::from_utf8_lossy(&alone.stderr)
            .contains("csiDriver.serviceAccountTokenInSecrets needs csiDriver.tokenRequests"),
        "{}",
        String::from_utf8_lossy(&alone.stderr)
    );
}

/// Whether a label selector (matchLabels and matchExpressions) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let matches_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(key, value)| &labels[key] == value);
    let matches_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|expression| {
            let label = labels[str(&expression["key"])].as_str();
            let values = strings(&expression["values"]);
            match str(&expression["operator"]) {
                "In" => label.is_some_and(|l| values.iter().any(|v| v == l)),
                "NotIn" => label.is_none_or(|l| values.iter().all(|v| v != l)),
                "Exists" => label.is_some(),
                "DoesNotExist" => label.is_none(),
                other => panic!("unknown selector operator {other}"),
            }
        });
    matches_labels && matches_expressions
}

/// The labels of the pods of a workload (Deployment or DaemonSet).
fn pod_labels<'a>(rendering: &'a Rendering, kind: &str, name: &str) -> &'a Value {
    &rendering.get(kind, name)["spec"]["template"]["metadata"]["labels"]
}

/// The controller's PodDisruptionBudget: on by itself with more than one replica (one kept
/// replica would block every drain of its node), policy/v1 from Kubernetes 1.21 and
/// policy/v1beta1 before, selecting the controller pods and no others, minAvailable 1 unless
/// the values say otherwise.
#[test]
fn the_controller_pdb_follows_the_replicas_and_the_cluster_version() {
    let Some(single) = Rendering::of("{}") else {
        return;
    };
    assert!(
        single
            .find("PodDisruptionBudget", "csi-suite-controller")
            .is_none()
    );
    let two = "controller:\n  replicas: 2\n";
    for (version, api) in [
        (None, "policy/v1"),
        (Some("1.21.0"), "policy/v1"),
        (Some("1.20.15"), "policy/v1beta1"),
        (Some("1.19.16"), "policy/v1beta1"),
    ] {
        let rendering = Rendering::for_version(two, version).unwrap();
        let pdb = rendering.get("PodDisruptionBudget", "csi-suite-controller");
        assert_eq!(pdb["apiVersion"], api, "{version:?}");
        assert_eq!(pdb["metadata"]["namespace"], "storage");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        assert!(pdb["spec"]["maxUnavailable"].is_null());
        let selector = &pdb["spec"]["selector"];
        assert!(selects(
            selector,
            pod_labels(&rendering, "Deployment", "csi-suite-controller")
        ));
        assert!(!selects(
            selector,
            pod_labels(&rendering, "DaemonSet", "csi-suite-node")
        ));
    }

    let custom = "controller:
  replicas: 3
  podDisruptionBudget:
    maxUnavailable: 50%
    labels: {team: storage}
";
    let rendering = Rendering::of(custom).unwrap();
    let pdb = rendering.get("PodDisruptionBudget", "csi-suite-controller");
    assert_eq!(pdb["spec"]["maxUnavailable"], "50%");
    assert!(pdb["spec"]["minAvailable"].is_null());
    assert_eq!(pdb["metadata"]["labels"]["team"], "storage");

    let off = "controller:\n  replicas: 2\n  podDisruptionBudget:\n    enabled: false\n";
    let rendering = Rendering::of(off).unwrap();
    assert!(
        rendering
            .find("PodDisruptionBudget", "csi-suite-controller")
            .is_none()
    );
    let forced = "controller:\n  podDisruptionBudget:\n    enabled: true\n    minAvailable: 0\n";
    let rendering = Rendering::of(forced).unwrap();
    let pdb = rendering.get("PodDisruptionBudget", "csi-suite-controller");
    assert_eq!(pdb["spec"]["minAvailable"], 0);

    let both = "controller:
  replicas: 2
  podDisruptionBudget:
    minAvailable: 1
    maxUnavailable: 1
";
    let refused = template(both).unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(
            "controller.podDisruptionBudget: set minAvailable or maxUnavailable, not both"
        ),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// The ports of a pod's containers by name.
fn named_ports(pod: &Value) -> BTreeMap<String, i64> {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .map(|p| {
            (
                str(&p["name"]).to_string(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The ports on which a pod's containers serve /metrics: every `--http-endpoint` of ours but
/// the registrar's (it serves /healthz only).
fn metrics_endpoints(pod: &Value) -> Vec<i64> {
    let mut ports: Vec<i64> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] != "node-driver-registrar")
        .flat_map(args)
        .filter_map(|arg| {
            arg.strip_prefix("--http-endpoint=:")
                .map(|port| port.parse().unwrap())
        })
        .collect();
    ports.sort_unstable();
    ports
}

/// A metrics Service's ports (its `spec`) are the pod's /metrics endpoints, each named as
/// the container port it targets and of its number.
fn assert_metrics_ports(spec: &Value, pod: &Value, service: &str) {
    let named = named_ports(pod);
    let mut numbers = Vec::new();
    for port in spec["ports"].as_array().unwrap() {
        let target = str(&port["targetPort"]);
        assert_eq!(port["name"], target, "{service}");
        assert_eq!(port["protocol"], "TCP", "{service}");
        assert_eq!(
            Some(&port["port"].as_i64().unwrap()),
            named.get(target),
            "{service}: {target} is no port of the pod: {named:?}"
        );
        numbers.push(port["port"].as_i64().unwrap());
    }
    numbers.sort_unstable();
    assert_eq!(numbers, metrics_endpoints(pod), "{service}");
}

/// Values with every controller sidecar that serves metrics.
const ALL_METRICS: &str = "snapshotter:
  enabled: true
healthMonitor:
  enabled: true
snapshotMetadata:
  enabled: true
inventory:
  serve:
    enabled: true
";

/// The metrics Services select their workload's pods only, and have one port per /metrics
/// endpoint of those pods, named as the container port it targets and of its number; the
/// registrar's /healthz-only port is not one. Off by default.
#[test]
fn metrics_services_select_the_pods_and_their_metrics_ports() {
    let Some(default) = Rendering::of("{}") else {
        return;
    };
    assert!(
        default.objects.iter().all(|o| o["kind"] != "Service"),
        "{:?}",
        default.names()
    );
    for values in [
        format!("{ALL_METRICS}metrics:\n  service:\n    enabled: true\n"),
        "metrics:\n  service:\n    enabled: true\n".to_string(),
    ] {
        let rendering = Rendering::of(&values).unwrap();
        for (service, kind, workload, other) in [
            (
                "csi-suite-controller-metrics",
                "Deployment",
                "csi-suite-controller",
                ("DaemonSet", "csi-suite-node"),
            ),
            (
                "csi-suite-node-metrics",
                "DaemonSet",
                "csi-suite-node",
                ("Deployment", "csi-suite-controller"),
            ),
        ] {
            let spec = &rendering.get("Service", service)["spec"];
            assert_eq!(spec["clusterIP"], "None", "{service}");
            let selector = serde_json::json!({"matchLabels": spec["selector"]});
            assert!(selects(&selector, pod_labels(&rendering, kind, workload)));
            assert!(!selects(
                &selector,
                pod_labels(&rendering, other.0, other.1)
            ));
            let pod = &rendering.get(kind, workload)["spec"]["template"]["spec"];
            assert_metrics_ports(spec, pod, &format!("{service} in {values}"));
        }
    }
    let with_all = Rendering::of(&format!(
        "{ALL_METRICS}metrics:\n  service:\n    enabled: true\n"
    ))
    .unwrap();
    let names: Vec<String> =
        with_all.get("Service", "csi-suite-controller-metrics")["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| str(&p["name"]).to_string())
            .collect();
    for name in [
        "provisioner",
        "attacher",
        "resizer",
        "snapshotter",
        "health-monitor",
        "snapshot-meta",
        "podmon",
        "inventory",
        "healthz",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
    }

    // Without livenessprobe the node pods serve no metrics: no node Service.
    let bare = Rendering::of(
        "metrics:\n  service:\n    enabled: true\nlivenessProbe:\n  enabled: false\n",
    )
    .unwrap();
    assert!(bare.find("Service", "csi-suite-node-metrics").is_none());
    assert!(
        bare.find("Service", "csi-suite-controller-metrics")
            .is_some()
    );
}

const SERVICE_MONITOR_V1: &str = "monitoring.coreos.com/v1/ServiceMonitor";

/// The ServiceMonitor (Prometheus Operator) is refused where the cluster does not serve its
/// CRD, and otherwise scrapes /metrics on every port of both metrics Services (which it
/// brings along), in the release's namespace, with the values' interval, timeout and labels.
#[test]
fn the_service_monitor_scrapes_every_metrics_port_and_needs_its_crd() {
    let values = format!(
        "{ALL_METRICS}metrics:
  serviceMonitor:
    enabled: true
    namespace: monitoring
    labels: {{release: kube-prometheus-stack}}
    interval: 1m
    scrapeTimeout: 20s
    metricRelabelings:
      - action: drop
        sourceLabels: [__name__]
        regex: go_.*
"
    );
    let Some(refused) = template(&values) else {
        return;
    };
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("metrics.serviceMonitor.enabled needs the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1)"),
        "{stderr}"
    );
    assert!(stderr.contains("--api-versions monitoring.coreos.com/v1/ServiceMonitor"));

    let rendering = Rendering::with_args(&values, &api_versions(SERVICE_MONITOR_V1)).unwrap();
    let monitor = rendering.get("ServiceMonitor", "csi-suite");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], "monitoring");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let spec = &monitor["spec"];
    assert_eq!(
        spec["namespaceSelector"],
        serde_json::json!({"matchNames": ["storage"]})
    );
    let mut scraped = Vec::new();
    for service in ["csi-suite-controller-metrics", "csi-suite-node-metrics"] {
        let service = rendering.get("Service", service);
        assert!(selects(&spec["selector"], &service["metadata"]["labels"]));
        for port in service["spec"]["ports"].as_array().unwrap() {
            scraped.push(str(&port["name"]).to_string());
        }
    }
    scraped.sort();
    scraped.dedup();
    let mut endpoints = Vec::new();
    for endpoint in spec["endpoints"].as_array().unwrap() {
        assert_eq!(endpoint["path"], "/metrics");
        assert_eq!(endpoint["interval"], "1m");
        assert_eq!(endpoint["scrapeTimeout"], "20s");
        assert_eq!(endpoint["metricRelabelings"][0]["regex"], "go_.*");
        endpoints.push(str(&endpoint["port"]).to_string());
    }
    endpoints.sort();
    assert_eq!(endpoints, scraped);
    // It selects these two Services and no other (a ServiceMonitor selects Services only).
    let selected: Vec<&str> = rendering
        .objects
        .iter()
        .filter(|o| o["kind"] == "Service" && selects(&spec["selector"], &o["metadata"]["labels"]))
        .map(|o| str(&o["metadata"]["name"]))
        .collect();
    assert_eq!(
        selected,
        ["csi-suite-controller-metrics", "csi-suite-node-metrics"]
    );

    let defaults = Rendering::with_args(
        "metrics:\n  serviceMonitor:\n    enabled: true\n",
        &api_versions(SERVICE_MONITOR_V1),
    )
    .unwrap();
    let monitor = defaults.get("ServiceMonitor", "csi-suite");
    assert_eq!(monitor["metadata"]["namespace"], "storage");
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "30s");
    assert_eq!(monitor["spec"]["endpoints"][0]["scrapeTimeout"], "10s");
}

/// The notes list the budget and the metrics Services, and warn when a budget keeps the only
/// controller replica (no drain of its node could evict it).
#[test]
fn the_notes_list_the_budget_and_the_metrics_services() {
    let Some(text) = notes(&[
        "--set",
        "controller.replicas=2,metrics.service.enabled=true,healthMonitor.enabled=true,\
         snapshotController.enabled=true",
    ]) else {
        return;
    };
    assert_mentions(
        &text,
        &[
            "csi-provisioner, csi-attacher, csi-resizer, csi-health-monitor, podmon (controller)",
            "PodDisruptionBudget csi-suite-controller (policy/v1)",
            "Service csi-suite-controller-metrics: /metrics on ports attacher, health-monitor, provisioner, resizer, podmon, healthz",
            "Service csi-suite-node-metrics: /metrics on ports healthz",
            "Service csi-suite-snapshot-controller-metrics: /metrics on ports http",
        ],
    );
    assert!(!text.contains("keeps its only replica"), "{text}");
    let single = notes(&["--set", "controller.podDisruptionBudget.enabled=true"]).unwrap();
    assert!(
        single.contains("the controller's PodDisruptionBudget keeps its only replica"),
        "{single}"
    );
    let default = notes(&[]).unwrap();
    assert!(!default.contains("PodDisruptionBudget"), "{default}");
    assert!(!default.contains("-metrics"), "{default}");
}

/// The sidecars with an image of kubernetes-csi to swap in, whose command and liveness probe
/// the values set: (values key, Deployment, container, port name, binary).
const PROBED: [(&str, &str, &str, &str, &str); 6] = [
    (
        "provisioner",
        "csi-suite-controller",
        "csi-provisioner",
        "provisioner",
        "csi-provisioner",
    ),
    (
        "attacher",
        "csi-suite-controller",
        "csi-attacher",
        "attacher",
        "csi-attacher",
    ),
    (
        "resizer",
        "csi-suite-controller",
        "csi-resizer",
        "resizer",
        "csi-resizer",
    ),
    (
        "snapshotter",
        "csi-suite-controller",
        "csi-snapshotter",
        "snapshotter",
        "csi-snapshotter",
    ),
    (
        "healthMonitor",
        "csi-suite-controller",
        "csi-health-monitor",
        "health-monitor",
        "csi-health-monitor",
    ),
    (
        "snapshotController",
        "csi-suite-snapshot-controller",
        "snapshot-controller",
        "http",
        "snapshot-controller",
    ),
];

/// Values turning on every sidecar of [`PROBED`].
const ALL_PROBED: &str = "snapshotter:
  enabled: true
healthMonitor:
  enabled: true
snapshotController:
  enabled: true
";

/// A container of a Deployment's pods.
fn deployment_container<'a>(rendering: &'a Rendering, deployment: &str, name: &str) -> &'a Value {
    let pod = &rendering.get("Deployment", deployment)["spec"]["template"]["spec"];
    container(pod, name).unwrap_or_else(|| panic!("no {name} in {:?}", container_names(pod)))
}

/// The number of the container port its liveness probe names, which must be the port of its
/// `--http-endpoint`.
fn probed_port(container: &Value) -> i64 {
    let name = &container["livenessProbe"]["httpGet"]["port"];
    let number =
        container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| &p["name"] == name)
            .unwrap_or_else(|| panic!("the probe's port {name} is none of {}", container["ports"]))
            ["containerPort"]
            .as_i64()
            .unwrap();
    assert!(
        has_arg(container, &format!("--http-endpoint=:{number}")),
        "{}",
        container["args"]
    );
    number
}

/// Our images keep what the chart always rendered: the binary by name, and a probe of
/// /healthz (every check of ours) on the sidecar's --http-endpoint, failing at once.
#[test]
fn our_sidecars_are_probed_on_healthz_of_their_http_endpoint() {
    let Some(rendering) = Rendering::of(ALL_PROBED) else {
        return;
    };
    for (_, deployment, name, port, binary) in PROBED {
        let sidecar = deployment_container(&rendering, deployment, name);
        assert_eq!(sidecar["command"], serde_json::json!([binary]), "{name}");
        assert_eq!(
            sidecar["livenessProbe"],
            serde_json::json!({
                "httpGet": {"path": "/healthz", "port": port},
                "failureThreshold": 1,
                "periodSeconds": 20,
                "timeoutSeconds": 10,
            }),
            "{name}"
        );
        probed_port(sidecar);
    }
    let node = rendering.node();
    for (name, binary) in [
        ("node-driver-registrar", "csi-node-driver-registrar"),
        ("liveness-probe", "livenessprobe"),
    ] {
        assert_eq!(
            container(node, name).unwrap()["command"],
            serde_json::json!([binary])
        );
    }
}

/// The YAML blocks of docs/chart.md's section on upstream's images, in order.
fn documented_upstream_values() -> Vec<String> {
    let doc = std::fs::read_to_string(workspace().join("docs/chart.md")).unwrap();
    let start = doc
        .find("\n## Upstream's image for a sidecar\n")
        .expect("docs/chart.md has the section");
    let section = &doc[start + 1..];
    let section = &section[..section[1..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 1)];
    section
        .split("```yaml\n")
        .skip(1)
        .map(|block| block[..block.find("```").unwrap()].to_string())
        .collect()
}

/// Upstream's images serve only /healthz/leader-election, and only with leader election on,
/// and keep their binary outside PATH: the values docs/chart.md gives render upstream's
/// image with no command (its entrypoint) and that probe with leader election on, or no
/// probe; every probed sidecar takes them, and the chart refuses the path without leader
/// election (nothing would answer it: a restart every 20 s).
#[test]
fn upstream_images_run_with_the_values_docs_chart_md_gives() {
    let documented = documented_upstream_values();
    assert_eq!(documented.len(), 2, "{documented:?}");
    let Some(electing) = Rendering::of(&documented[0]) else {
        return;
    };
    let provisioner = deployment_container(&electing, "csi-suite-controller", "csi-provisioner");
    assert_eq!(
        provisioner["image"],
        "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0"
    );
    assert!(
        provisioner["command"].is_null(),
        "{}",
        provisioner["command"]
    );
    assert_eq!(
        provisioner["livenessProbe"],
        serde_json::json!({
            "httpGet": {"path": "/healthz/leader-election", "port": "provisioner"},
            "failureThreshold": 1,
            "initialDelaySeconds": 10,
            "periodSeconds": 20,
            "timeoutSeconds": 10,
        })
    );
    assert_eq!(probed_port(provisioner), 8080);
    assert!(has_arg(provisioner, "--leader-election=true"));
    // The other sidecars stay ours.
    let attacher = deployment_container(&electing, "csi-suite-controller", "csi-attacher");
    assert_eq!(attacher["command"], serde_json::json!(["csi-attacher"]));
    assert_eq!(attacher["livenessProbe"]["httpGet"]["path"], "/healthz");

    let unprobed = Rendering::of(&documented[1]).unwrap();
    let provisioner = deployment_container(&unprobed, "csi-suite-controller", "csi-provisioner");
    assert!(provisioner.get("livenessProbe").is_none(), "{provisioner}");
    assert!(provisioner.get("command").is_none(), "{provisioner}");
    assert!(has_arg(provisioner, "--leader-election=false"));
    // Its metrics port stays, for the metrics Service.
    assert_eq!(named_ports(unprobed.controller())["provisioner"], 8080);

    let mut upstream = String::from("leaderElection:\n  enabled: true\n");
    for (key, _, _, _, binary) in PROBED {
        upstream.push_str(&format!(
            "{key}:
  enabled: true
  image: {{repository: registry.k8s.io/sig-storage/{binary}, tag: v1.0.0}}
  command: null
  livenessProbe: {{path: /healthz/leader-election}}
"
        ));
    }
    upstream.push_str("registrar:\n  command: null\nlivenessProbe:\n  command: null\n");
    let rendering = Rendering::of(&upstream).unwrap();
    for (_, deployment, name, port, binary) in PROBED {
        let sidecar = deployment_container(&rendering, deployment, name);
        assert_eq!(
            sidecar["image"],
            format!("registry.k8s.io/sig-storage/{binary}:v1.0.0")
        );
        assert!(sidecar.get("command").is_none(), "{sidecar}");
        assert_eq!(
            sidecar["livenessProbe"]["httpGet"],
            serde_json::json!({"path": "/healthz/leader-election", "port": port}),
            "{name}"
        );
        probed_port(sidecar);
        assert!(has_arg(sidecar, "--leader-election=true"), "{name}");
    }
    for (pod, name) in [
        (rendering.node(), "node-driver-registrar"),
        (rendering.node(), "liveness-probe"),
        (rendering.controller(), "liveness-probe"),
    ] {
        assert!(container(pod, name).unwrap().get("command").is_none());
    }

    for (key, ..) in PROBED {
        let mut values = serde_json::json!({
            "snapshotter": {"enabled": true},
            "healthMonitor": {"enabled": true},
            "snapshotController": {"enabled": true},
        });
        values[key]["livenessProbe"] = serde_json::json!({"path": "/healthz/leader-election"});
        let values = values.to_string();
        let refused = template(&values).unwrap();
        assert!(!refused.status.success(), "{values} was accepted");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains(&format!(
                "{key}.livenessProbe.path /healthz/leader-election is served only with leader election on"
            )),
            "{stderr}"
        );
    }
    // More than one replica elects a leader without leaderElection.enabled.
    for values in [
        "controller:\n  replicas: 2\nprovisioner:\n  livenessProbe:\n    path: /healthz/leader-election\n",
        "snapshotController:\n  enabled: true\n  replicas: 2\n  livenessProbe:\n    path: /healthz/leader-election\n",
    ] {
        Rendering::of(values).unwrap();
    }
}

/// The COSI values that run cosi-controller and the sample driver, with every metrics Service.
fn own_deployments_with_metrics() -> String {
    format!(
        "{COSI_SAMPLE}snapshotController:\n  enabled: true\nmetrics:\n  service:\n    enabled: true\n"
    )
}

/// The Deployments of their own (the snapshot-controller, cosi-controller, the COSI driver
/// with cosi-provisioner) get a metrics Service each when they are on: it selects that
/// Deployment's pods and no other workload's, and has their one /metrics port, `http`.
#[test]
fn the_snapshot_controller_and_cosi_metrics_services_select_their_pods() {
    let Some(rendering) = Rendering::of(&own_deployments_with_metrics()) else {
        return;
    };
    let workloads = [
        ("Deployment", "csi-suite-controller"),
        ("DaemonSet", "csi-suite-node"),
        ("Deployment", "csi-suite-snapshot-controller"),
        ("Deployment", "csi-suite-cosi-controller"),
        ("Deployment", "csi-suite-cosi-driver"),
    ];
    for (workload, (kind, name)) in workloads.iter().enumerate() {
        let service = format!("{name}-metrics");
        let spec = &rendering.get("Service", &service)["spec"];
        assert_eq!(spec["clusterIP"], "None", "{service}");
        let selector = serde_json::json!({"matchLabels": spec["selector"]});
        for (other, (other_kind, other_name)) in workloads.iter().enumerate() {
            assert_eq!(
                selects(&selector, pod_labels(&rendering, other_kind, other_name)),
                other == workload,
                "{service} and {other_name}"
            );
        }
        let pod = &rendering.get(kind, name)["spec"]["template"]["spec"];
        assert_metrics_ports(spec, pod, &service);
        if workload >= 2 {
            let names: Vec<&str> = spec["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| str(&p["name"]))
                .collect();
            assert_eq!(names, ["http"], "{service}");
        }
    }
    assert_eq!(
        rendering.get("Service", "csi-suite-snapshot-controller-metrics")["spec"]["ports"][0]["port"],
        8085
    );
    assert_eq!(
        rendering.get("Service", "csi-suite-cosi-controller-metrics")["spec"]["ports"][0]["port"],
        8086
    );
    assert_eq!(
        rendering.get("Service", "csi-suite-cosi-driver-metrics")["spec"]["ports"][0]["port"],
        8087
    );

    // Off with their Deployments.
    let without = Rendering::of("metrics:\n  service:\n    enabled: true\n").unwrap();
    for name in ["snapshot-controller", "cosi-controller", "cosi-driver"] {
        assert!(
            without
                .find("Service", &format!("csi-suite-{name}-metrics"))
                .is_none()
        );
    }

    // The ServiceMonitor scrapes every port of all five Services, and selects nothing else.
    let monitored = Rendering::with_args(
        &format!(
            "{}  serviceMonitor:\n    enabled: true\n",
            own_deployments_with_metrics()
        ),
        &api_versions(SERVICE_MONITOR_V1),
    )
    .unwrap();
    let spec = &monitored.get("ServiceMonitor", "csi-suite")["spec"];
    let endpoints: Vec<&str> = spec["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| str(&e["port"]))
        .collect();
    let mut selected = Vec::new();
    for service in monitored.objects.iter().filter(|o| o["kind"] == "Service") {
        if selects(&spec["selector"], &service["metadata"]["labels"]) {
            selected.push(str(&service["metadata"]["name"]));
            for port in service["spec"]["ports"].as_array().unwrap() {
                assert!(
                    endpoints.contains(&str(&port["name"])),
                    "{} not in {endpoints:?}",
                    port["name"]
                );
            }
        }
    }
    selected.sort_unstable();
    let mut expected: Vec<String> = workloads
        .iter()
        .map(|(_, name)| format!("{name}-metrics"))
        .collect();
    expected.sort();
    assert_eq!(selected, expected);
}

/// csi-snapshot-metadata with the snapshots it serves the metadata of.
const SNAPSHOT_METADATA: &str =
    "snapshotter:\n  enabled: true\nsnapshotMetadata:\n  enabled: true\n";

/// csi-snapshot-metadata in the release that installs the SnapshotMetadataService CRD.
const SNAPSHOT_METADATA_CRDS: &str = "snapshotMetadata:\n  enabled: true\n  installCRDs: true\n";

/// Base64 of a Secret's data or of a `format: byte` field, decoded.
fn decoded(value: &Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(str(value))
        .unwrap_or_else(|e| panic!("{e}: {value}"))
}

/// A TLS handshake, in memory, of a client that trusts only `ca` and dials `name` with a
/// server holding `cert` and `key` (PEM): it succeeds when the key is the certificate's, the
/// certificate names `name` and `ca` signed it.
fn handshake(ca: &[u8], cert: &[u8], key: &[u8], name: &str) -> anyhow::Result<()> {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca) {
        roots.add(ca?)?;
    }
    let client = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let chain = CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>()?;
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, PrivateKeyDer::from_pem_slice(key)?)?;
    let mut client =
        rustls::ClientConnection::new(Arc::new(client), ServerName::try_from(name.to_string())?)?;
    let mut server = rustls::ServerConnection::new(Arc::new(server))?;
    // A TLS 1.3 handshake takes two flights each way; a few more rounds cost nothing.
    for _ in 0..8 {
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
        let mut flight = Vec::new();
        client.write_tls(&mut flight)?;
        server.read_tls(&mut flight.as_slice())?;
        server.process_new_packets()?;
        flight.clear();
        server.write_tls(&mut flight)?;
        client.read_tls(&mut flight.as_slice())?;
        client.process_new_packets()?;
    }
    anyhow::bail!("the handshake did not finish")
}

/// The chart's TLS Secret of csi-snapshot-metadata and the SnapshotMetadataService agree: the
/// Secret's ca.crt is the CR's caCert, and a client that trusts only that CA and dials the
/// CR's address (and the Service's other names) completes a handshake with the Secret's
/// certificate and key; nothing else it dials does.
fn assert_tls_matches(rendering: &Rendering, secret: &str, driver: &str, names: &[&str]) {
    let secret = rendering.get("Secret", secret);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let data = &secret["data"];
    let service = rendering.get("SnapshotMetadataService", driver);
    assert_eq!(service["spec"]["caCert"], data["ca.crt"]);
    let ca = decoded(&service["spec"]["caCert"]);
    let (cert, key) = (decoded(&data["tls.crt"]), decoded(&data["tls.key"]));
    let address = str(&service["spec"]["address"]);
    let host = address.rsplit_once(':').expect("host:port").0;
    assert!(names.contains(&host), "{address} is none of {names:?}");
    for name in names {
        handshake(&ca, &cert, &key, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(handshake(&ca, &cert, &key, "elsewhere.storage").is_err());
    assert_eq!(
        secret["metadata"]["annotations"]["csi-suite.io/dns-names"],
        names.join(",")
    );
}

/// csi-snapshot-metadata is off by default and leaves nothing behind then; on, it runs in
/// the controller pod on the driver's socket with upstream's flags, its TLS Secret mounted,
/// probed on /health, behind a Service (6443 to its gRPC port, as upstream's example) that
/// selects the controller pods, which the SnapshotMetadataService of the driver names with the
/// CA of the Secret's certificate; its RBAC is upstream's reads, and backup applications get
/// a ClusterRole of their own to bind.
#[test]
fn csi_snapshot_metadata_serves_the_driver_behind_its_service() {
    let Some(default) = Rendering::of("{}") else {
        return;
    };
    for (kind, name) in [
        ("SnapshotMetadataService", "hostpath.csi-suite.io"),
        ("Secret", "csi-suite-snapshot-metadata-tls"),
        ("Service", "csi-suite-snapshot-metadata"),
        ("ClusterRole", SNAPSHOT_METADATA_RBAC),
        ("ClusterRole", SNAPSHOT_METADATA_CLIENT_RBAC),
    ] {
        assert!(default.find(kind, name).is_none(), "{kind} {name}");
    }

    let rendering = Rendering::of(SNAPSHOT_METADATA).unwrap();
    let controller = rendering.controller();
    // In the controller pod (every_container_runs_with_least_privilege checks where).
    let sidecar = container(controller, "csi-snapshot-metadata").unwrap();
    assert_eq!(
        sidecar["command"],
        serde_json::json!(["csi-snapshot-metadata"])
    );
    assert_eq!(
        args(sidecar),
        [
            "--csi-address=/csi/csi.sock",
            "--port=50051",
            "--http-endpoint=:8089",
            "--tls-cert=/tls/tls.crt",
            "--tls-key=/tls/tls.key",
            "--v=2"
        ]
    );
    // The driver's socket, in the directory both mount.
    let driver = container(controller, "driver").unwrap();
    assert!(
        driver["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|var| var["name"] == "CSI_ENDPOINT" && var["value"] == "unix:///csi/csi.sock")
    );
    for container in [driver, sidecar] {
        assert!(mounts(container).contains(&("socket-dir".into(), "/csi".into(), String::new())));
    }
    // The Secret's files where the flags look, read-only.
    let tls = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/tls")
        .expect("the TLS mount");
    assert_eq!(tls["readOnly"], true);
    let volume = controller["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == tls["name"])
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"],
        "csi-suite-snapshot-metadata-tls"
    );
    // A missing Secret stops the sidecar alone, not the pod.
    assert_eq!(volume["secret"]["optional"], true);
    // Alive and ready on /health of its --http-endpoint.
    assert_eq!(probed_port(sidecar), 8089);
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(sidecar[probe]["httpGet"]["path"], "/health", "{probe}");
        assert_eq!(
            sidecar[probe]["httpGet"]["port"], "snapshot-meta",
            "{probe}"
        );
    }

    // The Service reaches the gRPC port of the controller pods, no other pods'.
    let service = rendering.get("Service", "csi-suite-snapshot-metadata");
    let spec = &service["spec"];
    assert!(spec["clusterIP"].is_null() && spec["type"].is_null());
    let selector = serde_json::json!({"matchLabels": spec["selector"]});
    assert!(selects(
        &selector,
        pod_labels(&rendering, "Deployment", "csi-suite-controller")
    ));
    assert!(!selects(
        &selector,
        pod_labels(&rendering, "DaemonSet", "csi-suite-node")
    ));
    assert_eq!(
        spec["ports"],
        serde_json::json!([{"name": "snapshot-metadata", "port": 6443,
                            "targetPort": "metadata-grpc", "protocol": "TCP"}])
    );
    assert_eq!(named_ports(controller)["metadata-grpc"], 50051);

    // The CR: cluster-scoped, named after the driver, at the Service, with the Secret's CA.
    let cr = rendering.get("SnapshotMetadataService", "hostpath.csi-suite.io");
    assert_eq!(cr["apiVersion"], "cbt.storage.k8s.io/v1beta1");
    assert!(cr["metadata"]["namespace"].is_null());
    assert!(cr["metadata"]["annotations"].is_null(), "a plain object");
    assert_eq!(
        cr["spec"]["address"],
        "csi-suite-snapshot-metadata.storage:6443"
    );
    assert_eq!(
        cr["spec"]["audience"],
        "snapshot-metadata.hostpath.csi-suite.io"
    );
    assert_tls_matches(
        &rendering,
        "csi-suite-snapshot-metadata-tls",
        "hostpath.csi-suite.io",
        &[
            "csi-suite-snapshot-metadata",
            "csi-suite-snapshot-metadata.storage",
            "csi-suite-snapshot-metadata.storage.svc",
        ],
    );

    // Upstream's external-snapshot-metadata-runner, reads only, and the classes its snapshotter
    // secrets come from.
    let own = |group: &str, resource: &str, verbs: &[&str]| {
        (
            group.to_string(),
            resource.to_string(),
            strings(&serde_json::json!(verbs)),
        )
    };
    assert_eq!(
        rendering.rules("ClusterRole", SNAPSHOT_METADATA_RBAC),
        [
            own("authentication.k8s.io", "tokenreviews", &["create", "get"]),
            own(
                "authorization.k8s.io",
                "subjectaccessreviews",
                &["create", "get"]
            ),
            own(
                "cbt.storage.k8s.io",
                "snapshotmetadataservices",
                &["get", "list", "watch"]
            ),
            own(
                "snapshot.storage.k8s.io",
                "volumesnapshots",
                &["get", "list"]
            ),
            own(
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents",
                &["get", "list"]
            ),
            own(
                "snapshot.storage.k8s.io",
                "volumesnapshotclasses",
                &["get", "list"]
            ),
        ]
    );
    assert_eq!(
        bound_roles(&rendering, "csi-suite-controller")
            .iter()
            .filter(|(_, role)| role.contains("snapshot-metadata"))
            .collect::<Vec<_>>(),
        [&(
            "ClusterRole".to_string(),
            SNAPSHOT_METADATA_RBAC.to_string()
        )]
    );
    assert_eq!(
        rendering.rules("ClusterRole", SNAPSHOT_METADATA_CLIENT_RBAC),
        [
            own(
                "snapshot.storage.k8s.io",
                "volumesnapshots",
                &["get", "list", "watch"]
            ),
            own(
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents",
                &["get", "list", "watch"]
            ),
            own(
                "cbt.storage.k8s.io",
                "snapshotmetadataservices",
                &["get", "list"]
            ),
            own("", "serviceaccounts/token", &["create", "get"]),
        ]
    );
    let with_secrets =
        Rendering::of(&format!("{SNAPSHOT_METADATA}rbac:\n  secrets: true\n")).unwrap();
    assert_eq!(
        with_secrets.verbs("ClusterRole", SNAPSHOT_METADATA_RBAC, "", "secrets"),
        ["get"]
    );
    assert_least_privilege(&rendering);
    assert_least_privilege(&with_secrets);
    assert_tokens(&rendering, true);
}

/// csi-snapshot-metadata with a certificate of the user's (a cert-manager Secret) and its CA.
const USERS_CERTIFICATE: &str = "snapshotMetadata:
  enabled: true
  tls:
    existingSecret: backup-tls
    caCert: |
      -----BEGIN CERTIFICATE-----
      MIIBxDCCAWmgAwIBAgIUKKeOGoSSpKFolgbZB3MEt5aOCa8wCgYIKoZIzj0EAwIw
      NzEYMBYGA1UECgwPRXhhbXBsZSBTdG9yYWdlMRswGQYDVQQDDBJFeGFtcGxlIFN0
      b3JhZ2UgQ0EwHhcNMjYxMjA2MjIyNTQyWhcNMzYxMjAzMjIyNTQyWjA3MRgwFgYD
      VQQKDA9FeGFtcGxlIFN0b3JhZ2UxGzAZBgNVBAMMEkV4YW1wbGUgU3RvcmFnZSBD
      QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABEUJTWKHmSKIPBGDas7k+Bg2OG5e
      hyDPMfEQG3JrMF0tZlTjHNZPUtXNi0I8TtHb0SCtYbzJ488WpO8YXLBDurCjUzBR
      MB0GA1UdDgQWBBTOXLCIw8NNJ1O7lZLlLe781zpF5DAfBgNVHSMEGDAWgBTOXLCI
      w8NNJ1O7lZLlLe781zpF5DAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kA
      MEYCIQDqzHNKOd1KvAezK7QXeKLvp0tH1AJgdNSglMMKwtTv9wIhAJ0pyjFxk/KP
      T6TS+g8IYn75Yzvi1TB4PPJ0jMoGddX7
      -----END CERTIFICATE-----
";

/// The Service's name and port, the audience and the certificate are the user's to choose: a
/// renamed Service gets a certificate for its names and the CR its address; with a Secret of
/// the user's (cert-manager's), the chart makes none, mounts that one, and the CR carries the
/// CA the values give, as in the external-driver example.
#[test]
fn csi_snapshot_metadata_takes_the_users_names_and_certificate() {
    let renamed = "snapshotMetadata:
  enabled: true
  audience: backup.example.com
  service:
    name: cbt
    port: 443
";
    let Some(rendering) = Rendering::of(renamed) else {
        return;
    };
    let cr = rendering.get("SnapshotMetadataService", "hostpath.csi-suite.io");
    assert_eq!(cr["spec"]["address"], "cbt.storage:443");
    assert_eq!(cr["spec"]["audience"], "backup.example.com");
    assert_eq!(
        rendering.get("Service", "cbt")["spec"]["ports"][0]["port"],
        443
    );
    assert_tls_matches(
        &rendering,
        "csi-suite-snapshot-metadata-tls",
        "hostpath.csi-suite.io",
        &["cbt", "cbt.storage", "cbt.storage.svc"],
    );

    let users = Rendering::of(USERS_CERTIFICATE).unwrap();
    let cr = users.get("SnapshotMetadataService", "hostpath.csi-suite.io");
    let values: Value = serde_norway::from_str(USERS_CERTIFICATE).unwrap();
    let ca = str(&values["snapshotMetadata"]["tls"]["caCert"]);
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(decoded(&cr["spec"]["caCert"]), ca.as_bytes());
    assert!(
        users
            .objects
            .iter()
            .all(|o| o["type"] != "kubernetes.io/tls"),
        "the chart makes no certificate of its own: {:?}",
        users.names()
    );
    let volume = users.controller()["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "snapshot-metadata-tls")
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "backup-tls");

    // The external-driver example: cert-manager's Secret and its CA, for the vendor's driver.
    let external = Rendering::of(&external_driver_values()).unwrap();
    let values: Value = serde_norway::from_str(&external_driver_values()).unwrap();
    let ca = str(&values["snapshotMetadata"]["tls"]["caCert"]);
    let cr = external.get("SnapshotMetadataService", "block.csi.example.com");
    assert_eq!(decoded(&cr["spec"]["caCert"]), ca.as_bytes());
    assert_eq!(
        cr["spec"]["audience"],
        "snapshot-metadata.block.csi.example.com"
    );
    let sidecar = container(external.controller(), "csi-snapshot-metadata").unwrap();
    assert!(has_arg(
        sidecar,
        "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock"
    ));
}

/// The notes tell where backup applications find the service and which ClusterRole they need,
/// and how the certificate is kept.
#[test]
fn the_notes_tell_backup_applications_where_csi_snapshot_metadata_is() {
    let Some(text) = notes(&["--set", "snapshotMetadata.enabled=true"]) else {
        return;
    };
    assert_mentions(
        &text,
        &[
            "csi-snapshot-metadata, podmon (controller)",
            "Service csi-suite-snapshot-metadata (port 6443), SnapshotMetadataService hostpath.csi-suite.io\n",
            "csi-suite-snapshot-metadata.storage:6443",
            "snapshot-metadata.hostpath.csi-suite.io",
            "--clusterrole=csi-suite-external-snapshot-metadata-client-runner",
            "Secret csi-suite-snapshot-metadata-tls",
            "snapshotter.enabled is off",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        format!("{USERS_CERTIFICATE}snapshotter:\n  enabled: true\n"),
    )
    .unwrap();
    let users = notes(&["--values", values.to_str().unwrap()]).unwrap();
    assert_mentions(&users, &["Secret backup-tls's"]);
    assert!(!users.contains("snapshotter.enabled is off"), "{users}");
}

/// With installCRDs the release brings the SnapshotMetadataService CRD, csi-kinds' (the chart's
/// copy is current), kept at uninstall, on old clusters too; the SnapshotMetadataService is then
/// a post-install/post-upgrade hook, since helm could not map a plain object of a kind the
/// release itself installs. Without csi-snapshot-metadata, no CRD.
#[test]
fn the_snapshot_metadata_crd_comes_with_install_crds_and_its_object_then_waits_for_it() {
    let stale = csi_kinds::crd::stale_crds(
        &workspace(),
        &[&format!("{CHART}/files/cbt-crds")],
        &csi_kinds::cbt::crds(),
        csi_kinds::cbt::CRDS_COMMAND,
    );
    assert!(stale.is_empty(), "stale: {stale:?}: run `make crds`");
    for version in [None, Some("1.19.16")] {
        let Some(rendering) = Rendering::for_version(SNAPSHOT_METADATA_CRDS, version) else {
            return;
        };
        let crd = rendering.get(
            "CustomResourceDefinition",
            "snapshotmetadataservices.cbt.storage.k8s.io",
        );
        let mut expected =
            serde_json::to_value(csi_kinds::cbt::SnapshotMetadataService::crd()).unwrap();
        expected["metadata"]["annotations"]["helm.sh/resource-policy"] = "keep".into();
        assert_eq!(crd, &expected, "{version:?}");
        let service = rendering.get("SnapshotMetadataService", "hostpath.csi-suite.io");
        assert_eq!(
            service["metadata"]["annotations"],
            serde_json::json!({
                "helm.sh/hook": "post-install,post-upgrade",
                "helm.sh/hook-delete-policy": "before-hook-creation",
            })
        );
    }
    for values in [
        "snapshotMetadata:\n  installCRDs: true\n",
        SNAPSHOT_METADATA,
    ] {
        let rendering = Rendering::of(values).unwrap();
        assert!(
            rendering
                .objects
                .iter()
                .all(|o| o["kind"] != "CustomResourceDefinition"),
            "{values}"
        );
    }
}
