//! Connection tests against an in-process Identity server on a real Unix socket.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi::identity_server::{Identity, IdentityServer};
use csi_proto::csi::v1 as csi;
use prometheus_client::registry::Registry;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use super::*;

/// A scripted Probe result: `ready` (None: unset) or an error code.
type ProbeAnswer = Result<Option<bool>, Code>;

/// Scripted Identity service: Probe answers come from a queue (last one repeats).
#[derive(Clone)]
struct FakeIdentity {
    name: String,
    probes: Arc<Mutex<VecDeque<ProbeAnswer>>>,
    probe_delay: Duration,
    probe_calls: Arc<Mutex<u32>>,
}

impl FakeIdentity {
    fn new(name: &str, probes: Vec<ProbeAnswer>) -> Self {
        Self {
            name: name.into(),
            probes: Arc::new(Mutex::new(probes.into())),
            probe_delay: Duration::ZERO,
            probe_calls: Arc::default(),
        }
    }
}

#[tonic::async_trait]
impl Identity for FakeIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "1.2.3".into(),
            manifest: [("commit".to_string(), "abc".to_string())].into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let service = |t: service::Type| csi::PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(service::Type::VolumeAccessibilityConstraints),
                csi::PluginCapability {
                    r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    })),
                },
                // A value from a future spec version must be ignored, not fail discovery.
                csi::PluginCapability {
                    r#type: Some(Type::Service(Service { r#type: 99 })),
                },
            ],
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        *self.probe_calls.lock().unwrap() += 1;
        tokio::time::sleep(self.probe_delay).await;
        let next = {
            let mut probes = self.probes.lock().unwrap();
            if probes.len() > 1 {
                probes.pop_front().unwrap()
            } else {
                probes.front().cloned().unwrap_or(Ok(None))
            }
        };
        match next {
            Ok(ready) => Ok(Response::new(csi::ProbeResponse { ready })),
            Err(code) => Err(Status::new(code, "scripted failure")),
        }
    }
}

/// Serves `identity` on `path` until the returned token is cancelled.
fn serve(path: &Path, identity: FakeIdentity) -> CancellationToken {
    let listener = UnixListener::bind(path).unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(identity))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped.cancelled())
            .await
            .unwrap();
    });
    stop
}

fn metrics() -> (Registry, CsiOperationMetrics) {
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    (registry, metrics)
}

fn metrics_with_migration() -> (Registry, CsiOperationMetrics) {
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register_with_migration(&mut registry);
    (registry, metrics)
}

/// A running fake driver and a connection to it.
struct Fixture {
    _dir: tempfile::TempDir,
    server: CancellationToken,
    connection: CsiConnection,
    registry: Registry,
}

async fn fixture(identity: FakeIdentity) -> Fixture {
    fixture_with(identity, metrics).await
}

async fn fixture_with(
    identity: FakeIdentity,
    metrics: fn() -> (Registry, CsiOperationMetrics),
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let server = serve(&path, identity);
    let (registry, metrics) = metrics();
    let connection = connect(
        &Endpoint::from_path(&path).unwrap(),
        Duration::from_secs(5),
        metrics,
    )
    .await
    .unwrap();
    Fixture {
        _dir: dir,
        server,
        connection,
        registry,
    }
}

#[tokio::test]
async fn waits_for_a_socket_that_appears_later() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let endpoint = Endpoint::from_path(&path).unwrap();
    let later = path.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        serve(
            &later,
            FakeIdentity::new("late.csi.test", vec![Ok(Some(true))]),
        );
    });
    let connection = connect(&endpoint, Duration::from_secs(10), metrics().1)
        .await
        .unwrap();
    connection
        .probe_until_ready(Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn unreachable_socket_names_path_and_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.sock");
    let endpoint = Endpoint::from_path(&path).unwrap();
    let error = connect(&endpoint, Duration::from_millis(250), metrics().1)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, ConnError::Unreachable { .. }), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("after waiting 250ms"), "{text}");
}

#[tokio::test]
async fn garbage_on_the_socket_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let mut stream = stream.into_std().unwrap();
            stream.set_nonblocking(false).unwrap();
            let _ = stream.write_all(b"this is not HTTP/2\r\n\r\n");
        }
    });
    let endpoint = Endpoint::from_path(&path).unwrap();
    let result = async {
        let connection = connect(&endpoint, Duration::from_secs(2), metrics().1).await?;
        connection.probe_until_ready(Duration::from_secs(1)).await
    }
    .await;
    let error = result.unwrap_err();
    assert!(
        matches!(error, ConnError::Handshake { .. } | ConnError::Probe(_)),
        "{error}"
    );
}

#[tokio::test]
async fn probe_retries_not_ready_and_timeouts_then_succeeds() {
    let identity = FakeIdentity::new(
        "probe.csi.test",
        vec![Ok(Some(false)), Err(Code::DeadlineExceeded), Ok(None)],
    );
    let calls = identity.probe_calls.clone();
    let fake = fixture(identity).await;
    let ready = fake
        .connection
        .probe_until_ready(Duration::from_secs(1))
        .await;
    ready.unwrap();
    assert_eq!(*calls.lock().unwrap(), 3, "absent `ready` means ready");
}

#[tokio::test]
async fn probe_gives_up_on_other_errors() {
    let fake = fixture(FakeIdentity::new("x", vec![Err(Code::FailedPrecondition)])).await;
    let error = fake
        .connection
        .probe_until_ready(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ConnError::Probe(status) if status.code() == Code::FailedPrecondition),
        "{error}"
    );
}

#[tokio::test]
async fn slow_calls_time_out_with_deadline_exceeded() {
    let mut identity = FakeIdentity::new("slow.csi.test", vec![Ok(Some(true))]);
    identity.probe_delay = Duration::from_secs(30);
    let fake = fixture(identity).await;
    let status = fake
        .connection
        .probe(csi::ProbeRequest {}, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(
        GoStatus(&status).to_string(),
        "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        "as grpc-go's client reports its context's deadline"
    );
    let text = crate::metrics::encode(&fake.registry);
    assert!(
        text.contains(
            r#"grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Identity/Probe""#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn discovery_reads_identity_and_capabilities_and_labels_metrics() {
    let fake = fixture(FakeIdentity::new("disco.csi.test", vec![Ok(Some(true))])).await;
    let services = Services::CONTROLLER;
    let driver = DriverInfo::discover(&fake.connection, Duration::from_secs(1), services)
        .await
        .unwrap();
    assert_eq!(driver.name, "disco.csi.test");
    assert_eq!(driver.vendor_version, "1.2.3");
    assert_eq!(
        driver.manifest.get("commit").map(String::as_str),
        Some("abc")
    );
    assert_eq!(
        driver.plugin,
        PluginCapabilities {
            volume_accessibility_constraints: true,
            online_expansion: true,
            ..PluginCapabilities::default()
        }
    );
    assert!(
        driver.controller.is_empty(),
        "no CONTROLLER_SERVICE: not asked"
    );
    let text = crate::metrics::encode(&fake.registry);
    assert!(
        text.contains(r#"csi_sidecar_operations_seconds_count{driver_name="disco.csi.test",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginCapabilities"} 1"#),
        "{text}"
    );
}

/// The driver name each start-up call's sample carries, per upstream binary's order.
#[tokio::test]
async fn start_up_calls_are_labelled_where_upstream_names_the_driver() {
    const NAME: &str = "order.csi.test";
    const UNKNOWN: &str = crate::metrics::UNKNOWN_DRIVER;
    // (order, Probe, GetPluginInfo, GetPluginCapabilities)
    let table = [
        (StartupOrder::ProbeThenName, UNKNOWN, UNKNOWN, NAME),
        (StartupOrder::NameThenProbe, NAME, UNKNOWN, NAME),
        (StartupOrder::NamedByCaller, UNKNOWN, UNKNOWN, UNKNOWN),
    ];
    for (order, probe, info, capabilities) in table {
        let fake = fixture(FakeIdentity::new(NAME, vec![Ok(Some(true))])).await;
        let driver = DriverInfo::start(
            &fake.connection,
            Duration::from_secs(1),
            Services {
                plugin: true,
                ..Services::default()
            },
            order,
        )
        .await
        .unwrap();
        assert_eq!(driver.name, NAME, "{order:?}");
        let text = crate::metrics::encode(&fake.registry);
        for (method, driver) in [
            ("Probe", probe),
            ("GetPluginInfo", info),
            ("GetPluginCapabilities", capabilities),
        ] {
            let sample = format!(
                r#"csi_sidecar_operations_seconds_count{{driver_name="{driver}",grpc_status_code="OK",method_name="/csi.v1.Identity/{method}"}} 1"#
            );
            assert!(text.contains(&sample), "{order:?}: {sample} not in {text}");
        }
    }
}

/// csi-resizer's start-up for a driver that replaces an in-tree plugin: only the second
/// connection's calls are served (a Probe and the capabilities), named and `migrated`; any
/// other driver's are all `unknown-driver` until the caller names it.
#[tokio::test]
async fn the_resizer_names_a_migrated_driver_before_its_capability_calls() {
    const UNKNOWN: &str = crate::metrics::UNKNOWN_DRIVER;
    let services = Services {
        plugin: true,
        ..Services::default()
    };
    let migrated = r#",migrated="false""#;
    // (driver, [(method, its served sample's driver label, migrated label and count)])
    let table = [
        (
            "ebs.csi.aws.com",
            [
                ("Probe", Some(("ebs.csi.aws.com", migrated, 1))),
                ("GetPluginInfo", None),
                (
                    "GetPluginCapabilities",
                    Some(("ebs.csi.aws.com", migrated, 1)),
                ),
            ],
        ),
        (
            "other.csi.test",
            [
                ("Probe", Some((UNKNOWN, "", 1))),
                ("GetPluginInfo", Some((UNKNOWN, "", 1))),
                ("GetPluginCapabilities", Some((UNKNOWN, "", 1))),
            ],
        ),
    ];
    for (name, samples) in table {
        let fake = fixture_with(
            FakeIdentity::new(name, vec![Ok(Some(true))]),
            metrics_with_migration,
        )
        .await;
        DriverInfo::start(
            &fake.connection,
            Duration::from_secs(1),
            services,
            StartupOrder::NamedByCaller,
        )
        .await
        .unwrap();
        let text = crate::metrics::encode(&fake.registry);
        for (method, served) in samples {
            match served {
                Some((driver, migrated, count)) => {
                    let sample = format!(
                        r#"csi_sidecar_operations_seconds_count{{driver_name="{driver}",grpc_status_code="OK",method_name="/csi.v1.Identity/{method}"{migrated}}} {count}"#
                    );
                    assert!(
                        text.contains(&format!("{sample}\n")),
                        "{name}: {sample} not in {text}"
                    );
                }
                None => assert!(
                    !text.contains(&format!("/csi.v1.Identity/{method}\"")),
                    "{name}: {method} served: {text}"
                ),
            }
        }
        assert_eq!(
            text.contains(UNKNOWN),
            name == "other.csi.test",
            "{name}: {text}"
        );
    }
}

/// csi-snapshotter's start-up, as upstream's: no GetPluginCapabilities, and
/// ControllerGetCapabilities asked of a driver that advertises no CONTROLLER_SERVICE (this
/// fake serves none, so the call fails and is named); the other sidecars do not ask it then.
#[tokio::test]
async fn controller_capabilities_are_asked_directly_without_plugin_capabilities() {
    let direct = Services {
        plugin: false,
        controller: true,
        node: false,
    };
    let fake = fixture(FakeIdentity::new("direct.csi.test", vec![Ok(Some(true))])).await;
    let error = DriverInfo::discover(&fake.connection, Duration::from_secs(1), direct)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ConnError::Call { method: "ControllerGetCapabilities", status } if status.code() == Code::Unimplemented),
        "{error}"
    );
    let text = crate::metrics::encode(&fake.registry);
    assert!(!text.contains("GetPluginCapabilities"), "{text}");

    let fake = fixture(FakeIdentity::new(
        "advertised.csi.test",
        vec![Ok(Some(true))],
    ))
    .await;
    let driver = DriverInfo::discover(
        &fake.connection,
        Duration::from_secs(1),
        Services::CONTROLLER,
    )
    .await
    .unwrap();
    assert!(driver.controller.is_empty());
    let text = crate::metrics::encode(&fake.registry);
    assert!(text.contains("GetPluginCapabilities"), "{text}");
    assert!(!text.contains("ControllerGetCapabilities"), "{text}");
}

#[tokio::test]
async fn empty_driver_name_is_rejected() {
    let fake = fixture(FakeIdentity::new("", vec![Ok(Some(true))])).await;
    let error = DriverInfo::discover(
        &fake.connection,
        Duration::from_secs(1),
        Services::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ConnError::EmptyDriverName), "{error}");
}

#[tokio::test]
async fn unserved_services_answer_unimplemented() {
    let fake = fixture(FakeIdentity::new("identity.only", vec![Ok(Some(true))])).await;
    let status = fake
        .connection
        .node_get_info(csi::NodeGetInfoRequest {}, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
}

#[tokio::test]
async fn loss_of_the_driver_is_observed() {
    let fake = fixture(FakeIdentity::new("mortal.csi.test", vec![Ok(Some(true))])).await;
    fake.connection
        .probe_until_ready(Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!fake.connection.is_lost());
    fake.server.cancel();
    tokio::time::timeout(Duration::from_secs(10), fake.connection.lost())
        .await
        .expect("connection loss must be noticed");
    assert!(fake.connection.is_lost());
}

#[tokio::test]
async fn log_length_is_bounded_when_asked() {
    let fake = fixture(FakeIdentity::new("clip.csi.test", vec![Ok(Some(true))])).await;
    let connection = fake.connection.clone().with_max_log_length(Some(10));
    let clipped = connection.clip(&"x".repeat(100));
    assert_eq!(clipped, format!("\"{}[truncated]", "x".repeat(9)));
}

#[test]
fn final_errors_are_those_after_which_nothing_runs_at_the_driver() {
    use tonic::Code;
    for code in [
        Code::InvalidArgument,
        Code::NotFound,
        Code::Internal,
        Code::AlreadyExists,
        Code::FailedPrecondition,
    ] {
        assert!(is_final_error(code), "{code:?}");
    }
    for code in [
        Code::DeadlineExceeded,
        Code::Unavailable,
        Code::Aborted,
        Code::Cancelled,
        Code::ResourceExhausted,
    ] {
        assert!(!is_final_error(code), "{code:?}");
    }
}

#[test]
fn errors_read_as_grpc_go_prints_them() {
    let cases = [
        (
            Status::cancelled("stop"),
            "rpc error: code = Canceled desc = stop",
        ),
        (
            Status::invalid_argument("bad size"),
            "rpc error: code = InvalidArgument desc = bad size",
        ),
        (Status::new(Code::Ok, ""), "rpc error: code = OK desc = "),
    ];
    for (status, want) in cases {
        assert_eq!(GoStatus(&status).to_string(), want);
    }
}

/// v1.13 reserved VOLUME_CONDITION (controller 11, node 4): the typed sets skip the raw values,
/// the legacy helpers find them, and the v1.13 health capabilities are typed.
#[test]
fn legacy_volume_condition_capabilities_are_recognised_by_their_raw_values() {
    use csi::controller_service_capability as ccap;
    use csi::node_service_capability as ncap;
    let controller = |values: &[i32]| csi::ControllerGetCapabilitiesResponse {
        capabilities: values
            .iter()
            .map(|value| csi::ControllerServiceCapability {
                r#type: Some(ccap::Type::Rpc(ccap::Rpc { r#type: *value })),
            })
            .collect(),
    };
    let node = |values: &[i32]| csi::NodeGetCapabilitiesResponse {
        capabilities: values
            .iter()
            .map(|value| csi::NodeServiceCapability {
                r#type: Some(ncap::Type::Rpc(ncap::Rpc { r#type: *value })),
            })
            .collect(),
    };
    let legacy = controller(&[1, LEGACY_CONTROLLER_VOLUME_CONDITION, 12]);
    assert!(controller_volume_condition(&legacy));
    assert_eq!(controller_capabilities(&legacy).len(), 2);
    let current = controller(&[16, 17]);
    assert!(!controller_volume_condition(&current));
    assert_eq!(
        controller_capabilities(&current),
        [
            ccap::rpc::Type::GetVolumeHealth,
            ccap::rpc::Type::ListVolumeHealth
        ]
        .into()
    );
    let legacy = node(&[1, LEGACY_NODE_VOLUME_CONDITION]);
    assert!(node_volume_condition(&legacy));
    assert_eq!(node_capabilities(&legacy).len(), 1);
    let current = node(&[7, 8]);
    assert!(!node_volume_condition(&current));
    assert_eq!(
        node_capabilities(&current),
        [
            ncap::rpc::Type::GetVolumeHealth,
            ncap::rpc::Type::GetStorageHealth
        ]
        .into()
    );
}
