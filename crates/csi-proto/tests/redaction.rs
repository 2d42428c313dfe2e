//! Secrets must never show up in `Debug` output, and every secret-bearing message must be
//! covered by a test here.

use std::collections::{BTreeSet, HashMap};

use csi_proto::cosi::v1alpha1 as cosi_v1alpha1;
use csi_proto::csi::v1 as csi;
use csi_proto::snapshotmetadata;
use csi_proto::{SECRET_BEARING_MESSAGES, SECRET_FIELDS};
use prost::Message;

const SECRET_KEY: &str = "password";
const SECRET_VALUE: &str = "s3cr3t";

fn secrets() -> HashMap<String, String> {
    HashMap::from([(SECRET_KEY.to_owned(), SECRET_VALUE.to_owned())])
}

const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.token";

/// One test case: the message's full protobuf name, a non-secret marker its `Debug` must still
/// show, the redaction marker it must show instead of the secret, and the two `Debug`
/// renderings.
struct Case {
    name: &'static str,
    marker: &'static str,
    redaction: &'static str,
    compact: String,
    pretty: String,
}

/// `case!(Type { non_secret_field: value, ... }, "marker")` builds `Type` with
/// `secrets = {"password": "s3cr3t"}` plus the given fields.
macro_rules! case {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }, $marker:expr) => {{
        // Some messages have no fields besides the given ones and `secrets`.
        #[allow(clippy::needless_update)]
        let message = csi::$ty {
            $($field: $value,)*
            secrets: secrets(),
            ..Default::default()
        };
        Case {
            name: concat!("csi.v1.", stringify!($ty)),
            marker: $marker,
            redaction: "secrets: <redacted 1 key>",
            compact: format!("{message:?}"),
            pretty: format!("{message:#?}"),
        }
    }};
}

/// COSI's one secret-bearing message: the credentials a grant mints.
fn cosi_credentials() -> cosi_v1alpha1::CredentialDetails {
    cosi_v1alpha1::CredentialDetails { secrets: secrets() }
}

fn cases() -> Vec<Case> {
    let credentials = cosi_credentials();
    let cosi_case = Case {
        name: "cosi.v1alpha1.CredentialDetails",
        marker: "CredentialDetails",
        redaction: "secrets: <redacted 1 key>",
        compact: format!("{credentials:?}"),
        pretty: format!("{credentials:#?}"),
    };
    let vol = || "vol-1".to_owned();
    let snap = || "snap-1".to_owned();
    let group = || "group-1".to_owned();
    let mut cases = vec![
        case!(CreateVolumeRequest { name: vol() }, "vol-1"),
        case!(DeleteVolumeRequest { volume_id: vol() }, "vol-1"),
        case!(
            ControllerPublishVolumeRequest {
                volume_id: vol(),
                node_id: "node-1".to_owned(),
            },
            "vol-1"
        ),
        case!(
            ControllerUnpublishVolumeRequest { volume_id: vol() },
            "vol-1"
        ),
        case!(
            ValidateVolumeCapabilitiesRequest { volume_id: vol() },
            "vol-1"
        ),
        case!(
            CreateSnapshotRequest {
                source_volume_id: vol(),
                name: snap(),
            },
            "vol-1"
        ),
        case!(
            DeleteSnapshotRequest {
                snapshot_id: snap()
            },
            "snap-1"
        ),
        case!(
            ListSnapshotsRequest {
                source_volume_id: vol()
            },
            "vol-1"
        ),
        case!(
            GetSnapshotRequest {
                snapshot_id: snap()
            },
            "snap-1"
        ),
        case!(ControllerExpandVolumeRequest { volume_id: vol() }, "vol-1"),
        case!(ControllerModifyVolumeRequest { volume_id: vol() }, "vol-1"),
        case!(
            ControllerListVolumeHealthRequest {
                starting_token: "vol-0".to_owned(),
            },
            "vol-0"
        ),
        case!(
            ControllerGetVolumeHealthRequest { volume_id: vol() },
            "vol-1"
        ),
        case!(
            NodeGetStorageHealthRequest {},
            "NodeGetStorageHealthRequest"
        ),
        case!(
            NodeStageVolumeRequest {
                volume_id: vol(),
                staging_target_path: "/staging".to_owned(),
            },
            "vol-1"
        ),
        case!(
            NodePublishVolumeRequest {
                volume_id: vol(),
                target_path: "/target".to_owned(),
            },
            "vol-1"
        ),
        case!(NodeExpandVolumeRequest { volume_id: vol() }, "vol-1"),
        case!(
            CreateVolumeGroupSnapshotRequest {
                name: group(),
                source_volume_ids: vec![vol()],
            },
            "vol-1"
        ),
        case!(
            DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: group(),
            },
            "group-1"
        ),
        case!(
            GetVolumeGroupSnapshotRequest {
                group_snapshot_id: group(),
            },
            "group-1"
        ),
        case!(
            GetMetadataAllocatedRequest {
                snapshot_id: snap()
            },
            "snap-1"
        ),
        case!(
            GetMetadataDeltaRequest {
                base_snapshot_id: snap(),
                target_snapshot_id: "snap-2".to_owned(),
            },
            "snap-1"
        ),
    ];
    cases.push(cosi_case);
    let allocated = snapshotmetadata::GetMetadataAllocatedRequest {
        security_token: TOKEN.to_owned(),
        namespace: "ns-1".to_owned(),
        snapshot_name: snap(),
        ..Default::default()
    };
    let delta = snapshotmetadata::GetMetadataDeltaRequest {
        security_token: TOKEN.to_owned(),
        namespace: "ns-1".to_owned(),
        base_snapshot_id: "handle-1".to_owned(),
        target_snapshot_name: snap(),
        ..Default::default()
    };
    cases.push(Case {
        name: "snapshotmetadata.GetMetadataAllocatedRequest",
        marker: "snap-1",
        redaction: "security_token: <redacted>",
        compact: format!("{allocated:?}"),
        pretty: format!("{allocated:#?}"),
    });
    cases.push(Case {
        name: "snapshotmetadata.GetMetadataDeltaRequest",
        marker: "handle-1",
        redaction: "security_token: <redacted>",
        compact: format!("{delta:?}"),
        pretty: format!("{delta:#?}"),
    });
    cases
}

#[test]
fn secrets_are_redacted_in_debug() {
    for case in cases() {
        for rendered in [&case.compact, &case.pretty] {
            assert!(
                !rendered.contains(SECRET_VALUE),
                "{}: secret value leaked: {rendered}",
                case.name
            );
            assert!(
                !rendered.contains(SECRET_KEY),
                "{}: secret key leaked: {rendered}",
                case.name
            );
            assert!(
                !rendered.contains(TOKEN),
                "{}: token leaked: {rendered}",
                case.name
            );
            assert!(
                rendered.contains(case.marker),
                "{}: non-secret field {:?} missing: {rendered}",
                case.name,
                case.marker
            );
            assert!(
                rendered.contains(case.redaction),
                "{}: no redaction marker: {rendered}",
                case.name
            );
        }
    }
}

#[test]
fn every_secret_bearing_message_has_a_case() {
    let covered: BTreeSet<&str> = cases().iter().map(|case| case.name).collect();
    let declared: BTreeSet<&str> = SECRET_BEARING_MESSAGES.iter().copied().collect();
    assert_eq!(
        covered, declared,
        "update cases() when a message gains or loses a secret field"
    );
    assert_eq!(covered.len(), cases().len(), "duplicate case");
}

/// Cross-check the build script's reading of the `csi_secret` option: in CSI every secret is a
/// `secrets` map, and every `secrets` field is a secret. In the SnapshotMetadata API the secret
/// is each request's `security_token`.
#[test]
fn secret_bearing_messages_match_the_descriptor() {
    let fds = prost_types::FileDescriptorSet::decode(csi_proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes");
    let file = |name: &str| {
        fds.file
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{name} in FILE_DESCRIPTOR_SET"))
    };
    let csi_file = file("csi/v1/csi.proto");
    let cosi_file = file("cosi/v1alpha1/cosi.proto");
    let snapshot_metadata_file = file("snapshotmetadata/schema.proto");

    /// Full names of the fields called `secret_field` in `messages`, at any depth.
    fn walk(
        prefix: &str,
        messages: &[prost_types::DescriptorProto],
        secret_field: &str,
        out: &mut BTreeSet<String>,
    ) {
        for message in messages {
            let name = format!("{prefix}.{}", message.name());
            if message.field.iter().any(|f| f.name() == secret_field) {
                out.insert(format!("{name}.{secret_field}"));
            }
            walk(&name, &message.nested_type, secret_field, out);
        }
    }
    let mut expected_fields = BTreeSet::new();
    walk(
        "csi.v1",
        &csi_file.message_type,
        "secrets",
        &mut expected_fields,
    );
    walk(
        "cosi.v1alpha1",
        &cosi_file.message_type,
        "secrets",
        &mut expected_fields,
    );
    walk(
        "snapshotmetadata",
        &snapshot_metadata_file.message_type,
        "security_token",
        &mut expected_fields,
    );

    let fields: BTreeSet<String> = SECRET_FIELDS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(fields, expected_fields);
    let declared: BTreeSet<String> = SECRET_BEARING_MESSAGES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let expected_messages: BTreeSet<String> = expected_fields
        .iter()
        .map(|f| f.rsplit_once('.').expect("message.field").0.to_owned())
        .collect();
    assert_eq!(declared, expected_messages);

    // The option itself: FieldOptions extension 1059.
    let option = csi_file
        .extension
        .iter()
        .find(|e| e.name() == "csi_secret")
        .expect("csi_secret extension");
    assert_eq!(option.number(), 1059);
    assert_eq!(option.extendee(), ".google.protobuf.FieldOptions");
    let option = cosi_file
        .extension
        .iter()
        .find(|e| e.name() == "cosi_secret")
        .expect("cosi_secret extension");
    assert_eq!(option.number(), 1115);
    assert_eq!(option.extendee(), ".google.protobuf.FieldOptions");
}

/// A grant's response names the account and the protocol its credentials are for, and never
/// the keys themselves.
#[test]
fn cosi_grant_response_prints_without_its_keys() {
    let response = cosi_v1alpha1::DriverGrantBucketAccessResponse {
        account_id: "account-7".to_owned(),
        credentials: HashMap::from([("s3".to_owned(), cosi_credentials())]),
    };
    for rendered in [format!("{response:?}"), format!("{response:#?}")] {
        assert!(rendered.contains("account-7"), "{rendered}");
        assert!(rendered.contains("\"s3\""), "{rendered}");
        assert!(rendered.contains("<redacted 1 key>"), "{rendered}");
        assert!(!rendered.contains(SECRET_KEY), "{rendered}");
        assert!(!rendered.contains(SECRET_VALUE), "{rendered}");
    }
}

#[test]
fn non_secret_maps_still_print() {
    let request = csi::CreateVolumeRequest {
        name: "vol-1".to_owned(),
        parameters: HashMap::from([("fsType".to_owned(), "ext4".to_owned())]),
        secrets: HashMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]),
        ..Default::default()
    };
    let rendered = format!("{request:?}");
    assert!(
        rendered.contains(r#"parameters: {"fsType": "ext4"}"#),
        "{rendered}"
    );
    assert!(
        rendered.contains("secrets: <redacted 2 keys>"),
        "{rendered}"
    );

    let empty = csi::DeleteVolumeRequest::default();
    assert_eq!(
        format!("{empty:?}"),
        r#"DeleteVolumeRequest { volume_id: "", secrets: <redacted 0 keys> }"#
    );
}

#[test]
fn create_volume_request_round_trips() {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    let request = csi::CreateVolumeRequest {
        name: "pvc-1234".to_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 2 << 30,
        }),
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "xfs".to_owned(),
                mount_flags: vec!["noatime".to_owned()],
                volume_mount_group: "1000".to_owned(),
            })),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeMultiWriter as i32,
            }),
        }],
        parameters: HashMap::from([("type".to_owned(), "fast".to_owned())]),
        secrets: secrets(),
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: "snap-1".to_owned(),
                },
            )),
        }),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: HashMap::from([("zone".to_owned(), "a".to_owned())]),
            }],
            preferred: vec![],
        }),
        mutable_parameters: HashMap::from([("iops".to_owned(), "3000".to_owned())]),
    };
    let bytes = request.encode_to_vec();
    let decoded = csi::CreateVolumeRequest::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(decoded, request);
    assert_eq!(
        decoded.secrets[SECRET_KEY], SECRET_VALUE,
        "encoding keeps secrets"
    );
}

/// Pins a few field numbers and enum values on the wire. Changing any of these breaks
/// compatibility with real COs, drivers and kubelets.
#[test]
fn wire_facts() {
    // CreateVolumeRequest.secrets = 5 (length-delimited: tag byte 5<<3|2 = 0x2a), map entry
    // key = 1, value = 2.
    let request = csi::CreateVolumeRequest {
        secrets: HashMap::from([("k".to_owned(), "v".to_owned())]),
        ..Default::default()
    };
    assert_eq!(
        request.encode_to_vec(),
        [0x2a, 6, 0x0a, 1, b'k', 0x12, 1, b'v']
    );
    // CreateVolumeRequest.mutable_parameters = 8.
    let request = csi::CreateVolumeRequest {
        mutable_parameters: HashMap::from([("k".to_owned(), "v".to_owned())]),
        ..Default::default()
    };
    assert_eq!(request.encode_to_vec()[0], 8 << 3 | 2);

    // NodePublishVolumeRequest.target_path = 4, .secrets = 7.
    let request = csi::NodePublishVolumeRequest {
        target_path: "/t".to_owned(),
        ..Default::default()
    };
    assert_eq!(request.encode_to_vec(), [4 << 3 | 2, 2, b'/', b't']);
    let request = csi::NodePublishVolumeRequest {
        secrets: HashMap::from([("k".to_owned(), "v".to_owned())]),
        ..Default::default()
    };
    assert_eq!(request.encode_to_vec()[0], 7 << 3 | 2);

    // PluginInfo.supported_versions = 4.
    let info = csi_proto::pluginregistration::PluginInfo {
        supported_versions: vec!["1.0.0".to_owned()],
        ..Default::default()
    };
    assert_eq!(
        info.encode_to_vec(),
        [4 << 3 | 2, 5, b'1', b'.', b'0', b'.', b'0']
    );

    // podmon: array_id = 4, io_sample_time_seconds = 3 (varint).
    let podmon = csi_proto::podmon::v1::ValidateVolumeHostConnectivityRequest {
        array_id: "a".to_owned(),
        io_sample_time_seconds: 7,
        ..Default::default()
    };
    assert_eq!(podmon.encode_to_vec(), [3 << 3, 7, 4 << 3 | 2, 1, b'a']);

    // A few enum values.
    use csi::controller_service_capability::rpc::Type as ControllerRpc;
    use csi::node_service_capability::rpc::Type as NodeRpc;
    use csi::volume_capability::access_mode::Mode;
    assert_eq!(Mode::SingleNodeMultiWriter as i32, 7);
    assert_eq!(ControllerRpc::ModifyVolume as i32, 14);
    assert_eq!(ControllerRpc::GetSnapshot as i32, 15);
    assert_eq!(NodeRpc::VolumeMountGroup as i32, 6);
    assert_eq!(
        csi::plugin_capability::service::Type::GroupControllerService as i32,
        3
    );
}

#[test]
fn service_paths() {
    // gRPC method paths are derived from package + service + method names.
    let fds = prost_types::FileDescriptorSet::decode(csi_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut services = BTreeSet::new();
    for file in &fds.file {
        for service in &file.service {
            services.insert(format!("{}.{}", file.package(), service.name()));
        }
    }
    for expected in [
        "csi.v1.Identity",
        "csi.v1.Controller",
        "csi.v1.Node",
        "csi.v1.GroupController",
        "csi.v1.SnapshotMetadata",
        "pluginregistration.Registration",
        "podmon.v1.Podmon",
        "cosi.v1alpha1.Identity",
        "cosi.v1alpha1.Provisioner",
        "snapshotmetadata.SnapshotMetadata",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.contains(expected),
            "missing {expected}: {services:?}"
        );
    }
    assert_eq!(
        csi_proto::csi::v1::identity_server::SERVICE_NAME,
        "csi.v1.Identity"
    );
    assert_eq!(
        csi_proto::pluginregistration::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
}

/// The package of a proto file of `FILE_DESCRIPTOR_SET`, and `Message.field=number` for each
/// field of its top-level messages.
fn top_level_fields(name: &str) -> (String, BTreeSet<String>) {
    let fds = prost_types::FileDescriptorSet::decode(csi_proto::FILE_DESCRIPTOR_SET).unwrap();
    let file = fds
        .file
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} in FILE_DESCRIPTOR_SET"));
    let fields = file
        .message_type
        .iter()
        .flat_map(|m| {
            m.field
                .iter()
                .map(move |f| format!("{}.{}={}", m.name(), f.name(), f.number()))
        })
        .collect();
    (file.package().to_owned(), fields)
}

/// COSI v1alpha1's wire contract as released (v0.2.2): every field number, and the enum values
/// drivers send.
#[test]
fn cosi_wire_facts() {
    let (package, fields) = top_level_fields("cosi/v1alpha1/cosi.proto");
    assert_eq!(package, "cosi.v1alpha1");
    let expected = [
        "S3.region=1",
        "S3.signature_version=2",
        "AzureBlob.storage_account=1",
        "GCS.private_key_name=1",
        "GCS.project_id=2",
        "GCS.service_account=3",
        "Protocol.s3=1",
        "Protocol.azureBlob=2",
        "Protocol.gcs=3",
        "CredentialDetails.secrets=1",
        "DriverGetInfoResponse.name=1",
        "DriverCreateBucketRequest.name=1",
        "DriverCreateBucketRequest.parameters=2",
        "DriverCreateBucketResponse.bucket_id=1",
        "DriverCreateBucketResponse.bucket_info=2",
        "DriverDeleteBucketRequest.bucket_id=1",
        "DriverDeleteBucketRequest.delete_context=2",
        "DriverGrantBucketAccessRequest.bucket_id=1",
        "DriverGrantBucketAccessRequest.name=2",
        "DriverGrantBucketAccessRequest.authentication_type=3",
        "DriverGrantBucketAccessRequest.parameters=4",
        "DriverGrantBucketAccessResponse.account_id=1",
        "DriverGrantBucketAccessResponse.credentials=2",
        "DriverRevokeBucketAccessRequest.bucket_id=1",
        "DriverRevokeBucketAccessRequest.account_id=2",
        "DriverRevokeBucketAccessRequest.revoke_access_context=3",
    ];
    assert_eq!(
        fields,
        expected
            .iter()
            .map(|f| (*f).to_owned())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(cosi_v1alpha1::AuthenticationType::Key as i32, 1);
    assert_eq!(cosi_v1alpha1::AuthenticationType::Iam as i32, 2);
    assert_eq!(cosi_v1alpha1::S3SignatureVersion::S3v4 as i32, 2);
    assert_eq!(
        cosi_v1alpha1::AnonymousBucketAccessMode::ReadWrite as i32,
        4
    );
    assert_eq!(
        csi_proto::cosi::v1alpha1::provisioner_server::SERVICE_NAME,
        "cosi.v1alpha1.Provisioner"
    );
}

/// The legacy v1.12 messages get the same redaction, from their own compile.
#[cfg(feature = "v1-12")]
#[test]
fn legacy_v1_12_messages_redact_secrets_too() {
    use csi_proto::csi::v1_12;
    let request = v1_12::CreateVolumeRequest {
        name: "vol-1".to_owned(),
        secrets: secrets(),
        ..Default::default()
    };
    for rendered in [format!("{request:?}"), format!("{request:#?}")] {
        assert!(!rendered.contains(SECRET_VALUE) && !rendered.contains(SECRET_KEY));
        assert!(rendered.contains("secrets: <redacted 1 key>") && rendered.contains("vol-1"));
    }
}

/// v1.13 reserved the numbers v1.12's `volume_condition` used, so the two generations share a
/// wire format for every other field: a v1.12 message decodes as v1.13 (the condition becomes
/// an unknown field) and back.
#[cfg(feature = "v1-12")]
#[test]
fn v1_12_and_v1_13_share_the_wire_format() {
    use csi_proto::csi::v1_12;
    let legacy = v1_12::NodeGetVolumeStatsResponse {
        usage: vec![v1_12::VolumeUsage {
            available: 1,
            total: 2,
            used: 1,
            unit: v1_12::volume_usage::Unit::Bytes as i32,
        }],
        volume_condition: Some(v1_12::VolumeCondition {
            abnormal: true,
            message: "gone".to_owned(),
        }),
    };
    let current = csi::NodeGetVolumeStatsResponse::decode(&*legacy.encode_to_vec()).unwrap();
    assert_eq!(current.usage.len(), 1);
    assert_eq!(current.usage[0].total, 2);
    let back = v1_12::NodeGetVolumeStatsResponse::decode(&*current.encode_to_vec()).unwrap();
    assert_eq!(back.usage, legacy.usage);
    assert_eq!(back.volume_condition, None);
}

/// The Kubernetes SnapshotMetadata API as published by external-snapshot-metadata: every field
/// number and enum value, and the service's method paths.
#[test]
fn snapshot_metadata_wire_facts() {
    let (package, fields) = top_level_fields("snapshotmetadata/schema.proto");
    assert_eq!(package, "snapshotmetadata");
    let fds = prost_types::FileDescriptorSet::decode(csi_proto::FILE_DESCRIPTOR_SET).unwrap();
    let file = fds
        .file
        .iter()
        .find(|f| f.name() == "snapshotmetadata/schema.proto")
        .expect("schema.proto");
    assert!(
        file.dependency.is_empty(),
        "the published proto imports nothing"
    );
    let expected = [
        "BlockMetadata.byte_offset=1",
        "BlockMetadata.size_bytes=2",
        "GetMetadataAllocatedRequest.security_token=1",
        "GetMetadataAllocatedRequest.namespace=2",
        "GetMetadataAllocatedRequest.snapshot_name=3",
        "GetMetadataAllocatedRequest.starting_offset=4",
        "GetMetadataAllocatedRequest.max_results=5",
        "GetMetadataAllocatedResponse.block_metadata_type=1",
        "GetMetadataAllocatedResponse.volume_capacity_bytes=2",
        "GetMetadataAllocatedResponse.block_metadata=3",
        "GetMetadataDeltaRequest.security_token=1",
        "GetMetadataDeltaRequest.namespace=2",
        "GetMetadataDeltaRequest.base_snapshot_id=3",
        "GetMetadataDeltaRequest.target_snapshot_name=4",
        "GetMetadataDeltaRequest.starting_offset=5",
        "GetMetadataDeltaRequest.max_results=6",
        "GetMetadataDeltaResponse.block_metadata_type=1",
        "GetMetadataDeltaResponse.volume_capacity_bytes=2",
        "GetMetadataDeltaResponse.block_metadata=3",
    ];
    assert_eq!(
        fields,
        expected
            .iter()
            .map(|f| (*f).to_owned())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(snapshotmetadata::BlockMetadataType::Unknown as i32, 0);
    assert_eq!(snapshotmetadata::BlockMetadataType::FixedLength as i32, 1);
    assert_eq!(
        snapshotmetadata::BlockMetadataType::VariableLength as i32,
        2
    );
    assert_eq!(
        snapshotmetadata::snapshot_metadata_server::SERVICE_NAME,
        "snapshotmetadata.SnapshotMetadata"
    );
    // The token is field 1, a string: tag 1<<3|2, then its length.
    let request = snapshotmetadata::GetMetadataDeltaRequest {
        security_token: "t".to_owned(),
        ..Default::default()
    };
    assert_eq!(request.encode_to_vec(), [1 << 3 | 2, 1, b't']);
}

#[test]
fn snapshot_metadata_empty_token_prints_as_empty() {
    let request = snapshotmetadata::GetMetadataAllocatedRequest::default();
    assert_eq!(
        format!("{request:?}"),
        r#"GetMetadataAllocatedRequest { security_token: <empty>, namespace: "", snapshot_name: "", starting_offset: 0, max_results: 0 }"#
    );
}

/// The gRPC health protocol as published (grpc/health/v1/health.proto).
#[test]
fn grpc_health_wire_facts() {
    use csi_proto::grpc::health::v1::health_check_response::ServingStatus;
    let (package, fields) = top_level_fields("grpc/health/v1/health.proto");
    assert_eq!(package, "grpc.health.v1");
    let expected: BTreeSet<String> = [
        "HealthCheckRequest.service=1",
        "HealthCheckResponse.status=1",
    ]
    .iter()
    .map(|f| (*f).to_owned())
    .collect();
    assert_eq!(fields, expected);
    assert_eq!(ServingStatus::Unknown as i32, 0);
    assert_eq!(ServingStatus::Serving as i32, 1);
    assert_eq!(ServingStatus::NotServing as i32, 2);
    assert_eq!(ServingStatus::ServiceUnknown as i32, 3);
    assert_eq!(
        csi_proto::grpc::health::v1::health_server::SERVICE_NAME,
        "grpc.health.v1.Health"
    );
}
