//! The sidecar in process, started from its flags, between kube-sim (TokenReview,
//! SubjectAccessReview under RBAC, the snapshot kinds) and a fake CSI driver on a Unix socket,
//! reached over TLS as a backup application reaches it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_kinds::cbt::SnapshotMetadataService;
use csi_proto::csi::v1 as csi;
use csi_proto::snapshotmetadata as api;
use csi_snapshot_metadata::run::Listening;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use kube_sim_harness::{eventually, http_get};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

const DRIVER: &str = "fake.csi.k8s.io";
const NAMESPACE: &str = "team";
const AUDIENCE: &str = "cbt-audience";

fn tls_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../csi-grpc/tests/fixtures/tls")
        .join(name)
}

/// What the fake driver saw and does.
#[derive(Default)]
struct DriverState {
    allocated: Mutex<Vec<csi::GetMetadataAllocatedRequest>>,
    delta: Mutex<Vec<csi::GetMetadataDeltaRequest>>,
    /// Set when an endless stream's reader went away.
    endless_cancelled: AtomicBool,
}

#[derive(Clone)]
struct FakeDriver(Arc<DriverState>);

fn ranges(start: i64, count: i64) -> Vec<csi::BlockMetadata> {
    (start..start + count)
        .map(|i| csi::BlockMetadata {
            byte_offset: i * 4096,
            size_bytes: 4096,
        })
        .collect()
}

#[tonic::async_trait]
impl csi::identity_server::Identity for FakeDriver {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER.into(),
            vendor_version: "1".into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, service};
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::SnapshotMetadataService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl csi::snapshot_metadata_server::SnapshotMetadata for FakeDriver {
    type GetMetadataAllocatedStream =
        ReceiverStream<Result<csi::GetMetadataAllocatedResponse, Status>>;
    type GetMetadataDeltaStream = ReceiverStream<Result<csi::GetMetadataDeltaResponse, Status>>;

    async fn get_metadata_allocated(
        &self,
        request: Request<csi::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let request = request.into_inner();
        self.0.allocated.lock().unwrap().push(request.clone());
        let (sender, receiver) = mpsc::channel(1);
        let state = Arc::clone(&self.0);
        tokio::spawn(async move {
            let endless = request.snapshot_id == "endless-handle";
            let mut next = 0;
            while endless || next < 3 {
                let message = csi::GetMetadataAllocatedResponse {
                    block_metadata_type: csi::BlockMetadataType::FixedLength as i32,
                    volume_capacity_bytes: 1 << 20,
                    block_metadata: ranges(next * 2, 2),
                };
                if sender.send(Ok(message)).await.is_err() {
                    state.endless_cancelled.store(true, Ordering::SeqCst);
                    return;
                }
                next += 1;
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<csi::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let request = request.into_inner();
        self.0.delta.lock().unwrap().push(request.clone());
        let (sender, receiver) = mpsc::channel(2);
        sender
            .send(Ok(csi::GetMetadataDeltaResponse {
                block_metadata_type: csi::BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: 1 << 20,
                block_metadata: ranges(1, 1),
            }))
            .await
            .unwrap();
        // The driver refuses the rest: snapshots of different volumes, say.
        sender
            .send(Err(Status::out_of_range("base and target differ")))
            .await
            .unwrap();
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

async fn start_driver(socket: &Path) -> Arc<DriverState> {
    let state = Arc::new(DriverState::default());
    let driver = FakeDriver(Arc::clone(&state));
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(csi::identity_server::IdentityServer::new(driver.clone()))
            .add_service(csi::snapshot_metadata_server::SnapshotMetadataServer::new(
                driver,
            ))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    state
}

async fn create<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap()
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// An object of a CRD-served kind, created once its CRD serves, with `status` if given.
async fn create_custom(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: serde_json::Value,
    status: Option<serde_json::Value>,
) {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let name = object.metadata.name.clone().unwrap();
    eventually("the CRD serves", || async {
        api.create(&PostParams::default(), &object).await.ok()
    })
    .await;
    if let Some(status) = status {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
    }
}

/// The cluster side: CRDs, RBAC, a ServiceAccount allowed to get VolumeSnapshots and one that
/// is not, the SnapshotMetadataService, a default class with a snapshotter secret, snapshots.
async fn cluster(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [csi_kinds::snapshot::crds(), csi_kinds::cbt::crds()].concat() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    create(&namespaces, json!({"metadata": {"name": NAMESPACE}})).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    for name in ["backup", "stranger"] {
        create(&accounts, json!({"metadata": {"name": name}})).await;
    }
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(client.clone(), NAMESPACE);
    create(
        &roles,
        json!({"metadata": {"name": "snapshot-reader"},
               "rules": [{"apiGroups": ["snapshot.storage.k8s.io"],
                          "resources": ["volumesnapshots"], "verbs": ["get"]}]}),
    )
    .await;
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(client.clone(), NAMESPACE);
    create(
        &bindings,
        json!({"metadata": {"name": "backup"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "snapshot-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "backup", "namespace": NAMESPACE}]}),
    )
    .await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    for snapshot in ["snap-1", "endless"] {
        create(
            &secrets,
            json!({"metadata": {"name": format!("{snapshot}-creds")}, "stringData": {"password": "s3cr3t"}}),
        )
        .await;
    }

    let sms = ApiResource::erase::<SnapshotMetadataService>(&());
    create_custom(
        client,
        &sms,
        None,
        json!({"apiVersion": "cbt.storage.k8s.io/v1beta1", "kind": "SnapshotMetadataService",
               "metadata": {"name": DRIVER},
               "spec": {"address": "localhost:1", "audience": AUDIENCE, "caCert": "Y2E="}}),
        None,
    )
    .await;
    let group = "snapshot.storage.k8s.io";
    create_custom(
        client,
        &resource(group, "VolumeSnapshotClass", "volumesnapshotclasses"),
        None,
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
               "metadata": {"name": "default",
                            "annotations": {"snapshot.storage.kubernetes.io/is-default-class": "true"}},
               "driver": DRIVER, "deletionPolicy": "Delete",
               "parameters": {"csi.storage.k8s.io/snapshotter-secret-name": "${volumesnapshot.name}-creds",
                              "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}"}}),
        None,
    )
    .await;
    for (snapshot, handle) in [("snap-1", "handle-1"), ("endless", "endless-handle")] {
        let content = format!("content-{snapshot}");
        create_custom(
            client,
            &resource(group, "VolumeSnapshotContent", "volumesnapshotcontents"),
            None,
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                   "metadata": {"name": content},
                   "spec": {"driver": DRIVER, "deletionPolicy": "Delete",
                            "source": {"snapshotHandle": handle},
                            "volumeSnapshotRef": {"name": snapshot, "namespace": NAMESPACE}}}),
            Some(json!({"readyToUse": true, "snapshotHandle": handle})),
        )
        .await;
        create_custom(
            client,
            &resource(group, "VolumeSnapshot", "volumesnapshots"),
            Some(NAMESPACE),
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                   "metadata": {"name": snapshot},
                   "spec": {"source": {"volumeSnapshotContentName": content}}}),
            Some(json!({"readyToUse": true, "boundVolumeSnapshotContentName": content})),
        )
        .await;
    }
}

async fn token(client: &Client, account: &str, audience: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let request: TokenRequest = accounts
        .create_token_request(
            account,
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"audiences": [audience]}})).unwrap(),
        )
        .await
        .unwrap();
    request.status.unwrap().token
}

struct Sidecar {
    listening: Listening,
    driver: Arc<DriverState>,
    client: Client,
    stop: CancellationToken,
    _sim: kube_sim::ApiServer,
    _dir: tempfile::TempDir,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Sidecar {
    async fn api(
        &self,
    ) -> api::snapshot_metadata_client::SnapshotMetadataClient<tonic::transport::Channel> {
        let ca = std::fs::read(tls_fixture("ca.pem")).unwrap();
        let channel =
            csi_grpc::tls::connect(&format!("localhost:{}", self.listening.grpc.port()), &ca)
                .await
                .unwrap();
        api::snapshot_metadata_client::SnapshotMetadataClient::new(channel)
    }
}

async fn sidecar(extra: &[&str]) -> Sidecar {
    let dir = tempfile::Builder::new()
        .prefix("sms-")
        .tempdir_in("/tmp")
        .unwrap();
    let (sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(dir.path()).await;
    let client = sim.client();
    cluster(&client).await;
    let socket = dir.path().join("csi.sock");
    let driver = start_driver(&socket).await;
    let port = kube_sim_harness::free_address().port();
    let mut args = vec![
        "csi-snapshot-metadata".to_owned(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-address=unix://{}", socket.display()),
        format!("--port={port}"),
        "--http-endpoint=127.0.0.1:0".to_owned(),
        format!("--tls-cert={}", tls_fixture("server-1.pem").display()),
        format!("--tls-key={}", tls_fixture("server-1-key.pem").display()),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let parsed = csi_grpc::flags::try_parse_from(args).unwrap();
    let stop = CancellationToken::new();
    let (started, listening) = tokio::sync::oneshot::channel();
    tokio::spawn(csi_snapshot_metadata::run::run(
        parsed,
        stop.clone(),
        Some(started),
    ));
    let listening = tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .expect("the sidecar starts")
        .expect("the sidecar starts");
    Sidecar {
        listening,
        driver,
        client,
        stop,
        _sim: sim,
        _dir: dir,
    }
}

fn allocated(token: &str, snapshot: &str) -> api::GetMetadataAllocatedRequest {
    api::GetMetadataAllocatedRequest {
        security_token: token.to_owned(),
        namespace: NAMESPACE.to_owned(),
        snapshot_name: snapshot.to_owned(),
        starting_offset: 0,
        max_results: 2,
    }
}

#[tokio::test]
async fn an_authorized_backup_client_streams_allocated_ranges() {
    let sidecar = sidecar(&[]).await;
    let token = token(&sidecar.client, "backup", AUDIENCE).await;
    let mut stream = sidecar
        .api()
        .await
        .get_metadata_allocated(allocated(&token, "snap-1"))
        .await
        .unwrap()
        .into_inner();
    let mut offsets = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        assert_eq!(
            message.block_metadata_type,
            api::BlockMetadataType::FixedLength as i32
        );
        assert_eq!(message.volume_capacity_bytes, 1 << 20);
        offsets.extend(message.block_metadata.iter().map(|b| b.byte_offset / 4096));
    }
    assert_eq!(offsets, [0, 1, 2, 3, 4, 5]);

    let seen = sidecar.driver.allocated.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].snapshot_id, "handle-1");
    assert_eq!(seen[0].max_results, 2);
    assert_eq!(
        seen[0].secrets,
        HashMap::from([("password".to_owned(), "s3cr3t".to_owned())]),
        "the snapshotter secret of the default class"
    );

    let ca = std::fs::read(tls_fixture("ca.pem")).unwrap();
    let channel =
        csi_grpc::tls::connect(&format!("127.0.0.1:{}", sidecar.listening.grpc.port()), &ca)
            .await
            .unwrap();
    let health = csi_proto::grpc::health::v1::health_client::HealthClient::new(channel)
        .check(csi_proto::grpc::health::v1::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        health.status,
        csi_proto::grpc::health::v1::health_check_response::ServingStatus::Serving as i32
    );

    let (code, body) = http_get(sidecar.listening.http, "/health").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (_, metrics) = http_get(sidecar.listening.http, "/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"snapshot_metadata_controller_operations_seconds_count{base_snapshot="",driver_name="fake.csi.k8s.io",grpc_status_code="OK",method_name="MetadataAllocated",target_snapshot="team/snap-1"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("csi_sidecar_operations_seconds"),
        "{metrics}"
    );
}

#[tokio::test]
async fn callers_are_authenticated_for_the_audience_and_authorized_by_rbac() {
    let sidecar = sidecar(&[]).await;
    let mut api = sidecar.api().await;
    let refused = |result: Result<_, Status>| {
        let status = result.map(drop).unwrap_err();
        (status.code(), status.message().to_owned())
    };

    let other_audience = token(&sidecar.client, "backup", "someone-else").await;
    assert_eq!(
        refused(
            api.get_metadata_allocated(allocated(&other_audience, "snap-1"))
                .await
        ),
        (Code::Unauthenticated, "unauthenticated user".to_owned())
    );

    let stranger = token(&sidecar.client, "stranger", AUDIENCE).await;
    let (code, message) = refused(
        api.get_metadata_allocated(allocated(&stranger, "snap-1"))
            .await,
    );
    assert_eq!(code, Code::PermissionDenied);
    assert!(
        message.starts_with("user does not have permissions to perform the operation: "),
        "{message}"
    );

    assert_eq!(
        refused(api.get_metadata_allocated(allocated("", "snap-1")).await),
        (Code::InvalidArgument, "securityToken is missing".to_owned())
    );

    let backup = token(&sidecar.client, "backup", AUDIENCE).await;
    let (code, message) = refused(api.get_metadata_allocated(allocated(&backup, "nope")).await);
    assert_eq!(code, Code::Unavailable);
    assert_eq!(
        message,
        r#"failed to get VolumeSnapshot 'team/nope': volumesnapshots.snapshot.storage.k8s.io "nope" not found"#
    );
    assert!(sidecar.driver.allocated.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_audience_flag_replaces_the_snapshot_metadata_service() {
    let sidecar = sidecar(&["--audience=flag-audience"]).await;
    let mut api = sidecar.api().await;
    let cr_audience = token(&sidecar.client, "backup", AUDIENCE).await;
    let status = api
        .get_metadata_allocated(allocated(&cr_audience, "snap-1"))
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let flag_audience = token(&sidecar.client, "backup", "flag-audience").await;
    assert!(
        api.get_metadata_allocated(allocated(&flag_audience, "snap-1"))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_delta_passes_the_base_handle_and_the_drivers_error_through() {
    let sidecar = sidecar(&[]).await;
    let token = token(&sidecar.client, "backup", AUDIENCE).await;
    let mut stream = sidecar
        .api()
        .await
        .get_metadata_delta(api::GetMetadataDeltaRequest {
            security_token: token,
            namespace: NAMESPACE.into(),
            base_snapshot_id: "base-handle".into(),
            target_snapshot_name: "snap-1".into(),
            starting_offset: 8192,
            max_results: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.block_metadata.len(), 1);
    let status = stream.message().await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::OutOfRange, "base and target differ")
    );

    let seen = sidecar.driver.delta.lock().unwrap().clone();
    assert_eq!(seen[0].base_snapshot_id, "base-handle");
    assert_eq!(seen[0].target_snapshot_id, "handle-1");
    assert_eq!(seen[0].starting_offset, 8192);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_drivers_stream() {
    let sidecar = sidecar(&[]).await;
    let token = token(&sidecar.client, "backup", AUDIENCE).await;
    let mut stream = sidecar
        .api()
        .await
        .get_metadata_allocated(allocated(&token, "endless"))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert!(!sidecar.driver.endless_cancelled.load(Ordering::SeqCst));
    drop(stream);
    let driver = Arc::clone(&sidecar.driver);
    eventually("the driver's stream is cancelled", || {
        let driver = Arc::clone(&driver);
        async move {
            driver
                .endless_cancelled
                .load(Ordering::SeqCst)
                .then_some(())
        }
    })
    .await;
}
