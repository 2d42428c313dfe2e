//! Controller and Identity RPCs of the real driver over its Unix socket: success,
//! idempotency, and every error code of the spec's tables.

mod common;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_hostpath::config::DEFAULT_DRIVER_NAME;
use csi_proto::csi::v1 as csi;
use tonic::Code;

#[tokio::test]
async fn identity() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let info = c
        .get_plugin_info(csi::GetPluginInfoRequest {}, T)
        .await
        .unwrap();
    assert_eq!(info.name, DEFAULT_DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
    let ready = c.probe(csi::ProbeRequest {}, T).await.unwrap();
    assert_eq!(ready.ready, Some(true));
    let plugin = csi_grpc::conn::DriverInfo::discover(c, T, csi_grpc::conn::Services::CONTROLLER)
        .await
        .unwrap();
    assert!(plugin.plugin.controller_service);
    assert!(plugin.plugin.volume_accessibility_constraints);
    assert!(plugin.plugin.online_expansion);
    use csi::controller_service_capability::rpc::Type as Rpc;
    for rpc in [
        Rpc::CreateDeleteVolume,
        Rpc::PublishUnpublishVolume,
        Rpc::PublishReadonly,
        Rpc::ListVolumes,
        Rpc::ListVolumesPublishedNodes,
        Rpc::GetCapacity,
        Rpc::CreateDeleteSnapshot,
        Rpc::ListSnapshots,
        Rpc::GetSnapshot,
        Rpc::CloneVolume,
        Rpc::ExpandVolume,
        Rpc::GetVolumeHealth,
        Rpc::ListVolumeHealth,
        Rpc::GetVolume,
        Rpc::SingleNodeMultiWriter,
        Rpc::ModifyVolume,
    ] {
        assert!(plugin.has_controller(rpc), "{rpc:?}");
    }
    let node = csi_grpc::conn::DriverInfo::discover(
        &cluster.node("node-a").csi,
        T,
        csi_grpc::conn::Services {
            plugin: true,
            controller: false,
            node: true,
        },
    )
    .await
    .unwrap();
    use csi::node_service_capability::rpc::Type as NodeRpc;
    for rpc in [
        NodeRpc::StageUnstageVolume,
        NodeRpc::GetVolumeStats,
        NodeRpc::ExpandVolume,
        NodeRpc::GetVolumeHealth,
        NodeRpc::GetStorageHealth,
        NodeRpc::SingleNodeMultiWriter,
    ] {
        assert!(node.has_node(rpc), "{rpc:?}");
    }
    // The default is the v1.13 health API only: no VOLUME_CONDITION of v1.12.
    assert_eq!(plugin.volume_condition, Default::default());
    assert_eq!(node.volume_condition, Default::default());
    assert!(
        !node.plugin.controller_service,
        "node instances serve no controller"
    );
    let info = cluster
        .node("node-a")
        .csi
        .node_get_info(csi::NodeGetInfoRequest {}, T)
        .await
        .unwrap();
    assert_eq!(info.node_id, "node-a");
    assert_eq!(info.max_volumes_per_node, 3);
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get("topology.hostpath.csi-suite.io/node")
            .map(String::as_str),
        Some("node-a")
    );
    cluster.stop().await;
}

#[tokio::test]
async fn create_volume_table() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let ok = create_request("vol", GI, mount(Mode::SingleNodeWriter));
    let first = c
        .create_volume(ok.clone(), T)
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(first.capacity_bytes, GI);
    let again = c
        .create_volume(ok.clone(), T)
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, first.volume_id, "idempotent by name");

    let mut echo = create_request("echo", GI, mount(Mode::SingleNodeWriter));
    echo.parameters = [("color".to_string(), "blue".to_string())].into();
    let echoed = c.create_volume(echo, T).await.unwrap().volume.unwrap();
    assert_eq!(
        echoed.volume_context.get("color").map(String::as_str),
        Some("blue")
    );

    let mut no_caps = ok.clone();
    no_caps.volume_capabilities.clear();
    let mut mixed = ok.clone();
    mixed
        .volume_capabilities
        .push(block(Mode::SingleNodeWriter));
    let mut no_mode = ok.clone();
    no_mode.volume_capabilities[0].access_mode = None;
    let mut inverted = ok.clone();
    inverted.capacity_range = Some(csi::CapacityRange {
        required_bytes: 2 * GI,
        limit_bytes: GI,
    });
    let mut bigger = ok.clone();
    bigger.capacity_range = Some(csi::CapacityRange {
        required_bytes: 2 * GI,
        limit_bytes: 0,
    });
    let mut as_block = ok.clone();
    as_block.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let mut from_missing_snapshot = create_request("from-snap", GI, mount(Mode::SingleNodeWriter));
    from_missing_snapshot.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: "missing".into(),
            },
        )),
    });
    let mut from_missing_volume = create_request("from-vol", GI, mount(Mode::SingleNodeWriter));
    from_missing_volume.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "missing".into(),
            },
        )),
    });
    let mut bad_mutable = create_request("mutable", GI, mount(Mode::SingleNodeWriter));
    bad_mutable.mutable_parameters = [("XXX_FakeKey".to_string(), "v".to_string())].into();
    let mut unknown_pool = create_request("pool", GI, mount(Mode::SingleNodeWriter));
    unknown_pool.parameters = [("kind".to_string(), "nope".to_string())].into();
    let mut foreign_topology = create_request("topo", GI, mount(Mode::SingleNodeWriter));
    foreign_topology.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: [("zone".to_string(), "z1".to_string())].into(),
        }],
        preferred: vec![],
    });
    let mut huge_parameters = create_request("params", GI, mount(Mode::SingleNodeWriter));
    huge_parameters.parameters = [("color".to_string(), "b".repeat(1 << 20))].into();
    let table = [
        (
            "missing name",
            create_request("", GI, mount(Mode::SingleNodeWriter)),
            Code::InvalidArgument,
        ),
        (
            "a name past 128 bytes",
            create_request(&"n".repeat(129), GI, mount(Mode::SingleNodeWriter)),
            Code::InvalidArgument,
        ),
        (
            "parameters past 4 KiB",
            huge_parameters,
            Code::InvalidArgument,
        ),
        ("no capabilities", no_caps, Code::InvalidArgument),
        ("mixed block and mount", mixed, Code::InvalidArgument),
        ("no access mode", no_mode, Code::InvalidArgument),
        ("required above limit", inverted, Code::OutOfRange),
        (
            "beyond the maximum volume size",
            create_request("huge", 2 << 40, mount(Mode::SingleNodeWriter)),
            Code::OutOfRange,
        ),
        ("same name, other size", bigger, Code::AlreadyExists),
        (
            "same name, other access type",
            as_block,
            Code::AlreadyExists,
        ),
        (
            "unknown source snapshot",
            from_missing_snapshot,
            Code::NotFound,
        ),
        ("unknown source volume", from_missing_volume, Code::NotFound),
        (
            "mutable parameter not accepted",
            bad_mutable,
            Code::InvalidArgument,
        ),
        ("unknown capacity pool", unknown_pool, Code::InvalidArgument),
        (
            "topology without our key",
            foreign_topology,
            Code::ResourceExhausted,
        ),
        (
            "exhausted capacity",
            create_request("too-much", 9 * GI, mount(Mode::SingleNodeWriter)),
            Code::ResourceExhausted,
        ),
    ];
    for (case, request, want) in table {
        assert_eq!(code(c.create_volume(request, T).await), want, "{case}");
    }
    cluster.stop().await;
}

#[tokio::test]
async fn topology_places_on_the_preferred_known_node() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let key = "topology.hostpath.csi-suite.io/node".to_string();
    let segment = |node: &str| csi::Topology {
        segments: [(key.clone(), node.to_string())].into(),
    };
    let mut request = create_request("topo", GI, mount(Mode::SingleNodeWriter));
    request.parameters = [("kind".to_string(), "fast".to_string())].into();
    request.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![
            segment("node-a"),
            segment("node-b"),
            segment("node-unknown"),
        ],
        preferred: vec![segment("node-b")],
    });
    let volume = c
        .create_volume(request.clone(), T)
        .await
        .unwrap()
        .volume
        .unwrap();
    let nodes: Vec<&str> = volume
        .accessible_topology
        .iter()
        .map(|t| t.segments[&key].as_str())
        .collect();
    assert_eq!(
        nodes,
        ["node-b", "node-a"],
        "preferred first, unknown nodes dropped"
    );

    // The fast pool holds 2 GiB per node: node-b has 1 GiB left, so a 1.5 GiB volume lands on node-a.
    let capacity = |node: &str| csi::GetCapacityRequest {
        parameters: [("kind".to_string(), "fast".to_string())].into(),
        accessible_topology: Some(segment(node)),
        ..Default::default()
    };
    let b = c.get_capacity(capacity("node-b"), T).await.unwrap();
    assert_eq!(b.available_capacity, GI);
    assert_eq!(b.maximum_volume_size, Some(GI));
    request.name = "topo-2".into();
    request.capacity_range = Some(csi::CapacityRange {
        required_bytes: 3 * GI / 2,
        limit_bytes: 0,
    });
    let second = c.create_volume(request, T).await.unwrap().volume.unwrap();
    assert_eq!(second.accessible_topology[0].segments[&key], "node-a");
    assert_eq!(
        c.get_capacity(capacity("node-a"), T)
            .await
            .unwrap()
            .available_capacity,
        GI / 2
    );
    assert_eq!(
        c.get_capacity(capacity("node-unknown"), T)
            .await
            .unwrap()
            .available_capacity,
        0
    );
    let mut other_pool = capacity("node-a");
    other_pool.parameters = [("kind".to_string(), "nope".to_string())].into();
    assert_eq!(
        c.get_capacity(other_pool, T)
            .await
            .unwrap()
            .available_capacity,
        0
    );
    cluster.stop().await;
}

#[tokio::test]
async fn delete_volume_table() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let volume = create(c, "del", GI).await;
    assert_eq!(
        code(
            c.delete_volume(csi::DeleteVolumeRequest::default(), T)
                .await
        ),
        Code::InvalidArgument
    );
    let unknown = csi::DeleteVolumeRequest {
        volume_id: "unknown".into(),
        ..Default::default()
    };
    assert_eq!(
        code(c.delete_volume(unknown, T).await),
        Code::Ok,
        "unknown volumes are already deleted"
    );
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    c.controller_publish_volume(publish, T).await.unwrap();
    let delete = csi::DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(c.delete_volume(delete.clone(), T).await),
        Code::FailedPrecondition,
        "still published"
    );
    let unpublish = csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    c.controller_unpublish_volume(unpublish, T).await.unwrap();
    c.delete_volume(delete.clone(), T).await.unwrap();
    c.delete_volume(delete, T).await.unwrap();
    let data = cluster.state_dir.join("volumes").join(&volume.volume_id);
    assert!(!data.exists(), "data removed");
    cluster.stop().await;
}

#[tokio::test]
async fn controller_publish_table() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let volume = create(c, "pub", GI).await;
    let request = |node: &str, readonly: bool, mode: Mode| csi::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.into(),
        volume_capability: Some(mount(mode)),
        readonly,
        ..Default::default()
    };
    let published = c
        .controller_publish_volume(request("node-a", false, Mode::SingleNodeWriter), T)
        .await
        .unwrap();
    assert_eq!(
        published
            .publish_context
            .get("readonly")
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(
        code(
            c.controller_publish_volume(request("node-a", false, Mode::SingleNodeWriter), T)
                .await
        ),
        Code::Ok,
        "idempotent"
    );
    let mut no_volume = request("node-a", false, Mode::SingleNodeWriter);
    no_volume.volume_id.clear();
    let mut no_capability = request("node-a", false, Mode::SingleNodeWriter);
    no_capability.volume_capability = None;
    let mut unknown_volume = request("node-a", false, Mode::SingleNodeWriter);
    unknown_volume.volume_id = "unknown".into();
    let mut wrong_type = request("node-a", false, Mode::SingleNodeWriter);
    wrong_type.volume_capability = Some(block(Mode::SingleNodeWriter));
    let table = [
        ("missing volume id", no_volume, Code::InvalidArgument),
        (
            "missing node id",
            request("", false, Mode::SingleNodeWriter),
            Code::InvalidArgument,
        ),
        ("missing capability", no_capability, Code::InvalidArgument),
        ("unknown volume", unknown_volume, Code::NotFound),
        (
            "unknown node",
            request("node-z", false, Mode::SingleNodeWriter),
            Code::NotFound,
        ),
        (
            "capability of another access type",
            wrong_type,
            Code::InvalidArgument,
        ),
        (
            "republished read-only",
            request("node-a", true, Mode::SingleNodeWriter),
            Code::AlreadyExists,
        ),
        (
            "single-node volume on a second node",
            request("node-b", false, Mode::SingleNodeWriter),
            Code::FailedPrecondition,
        ),
    ];
    for (case, request, want) in table {
        assert_eq!(
            code(c.controller_publish_volume(request, T).await),
            want,
            "{case}"
        );
    }
    // Multi-node volumes go to several nodes, up to the per-node limit of 3.
    let mut ids = Vec::new();
    for i in 0..3 {
        let v = create(c, &format!("multi-{i}"), GI / 4).await;
        ids.push(v.volume_id);
    }
    for id in &ids {
        let r = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "node-b".into(),
            volume_capability: Some(mount(Mode::MultiNodeMultiWriter)),
            ..Default::default()
        };
        c.controller_publish_volume(r, T).await.unwrap();
    }
    let fourth = csi::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: "node-b".into(),
        volume_capability: Some(mount(Mode::MultiNodeMultiWriter)),
        ..Default::default()
    };
    assert_eq!(
        code(c.controller_publish_volume(fourth, T).await),
        Code::ResourceExhausted,
        "attach limit"
    );
    let listed = c
        .list_volumes(csi::ListVolumesRequest::default(), T)
        .await
        .unwrap();
    let status = listed
        .entries
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == volume.volume_id)
        .unwrap()
        .status
        .clone()
        .unwrap();
    assert_eq!(status.published_node_ids, ["node-a"]);
    let health = c
        .controller_get_volume_health(
            csi::ControllerGetVolumeHealthRequest {
                volume_id: volume.volume_id.clone(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(health.volume_health.unwrap().health_statuses, []);

    assert_eq!(
        code(
            c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest::default(), T)
                .await
        ),
        Code::InvalidArgument
    );
    let unknown = csi::ControllerUnpublishVolumeRequest {
        volume_id: "unknown".into(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    assert_eq!(
        code(c.controller_unpublish_volume(unknown, T).await),
        Code::Ok,
        "already unpublished"
    );
    let all = csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        ..Default::default()
    };
    c.controller_unpublish_volume(all.clone(), T).await.unwrap();
    c.controller_unpublish_volume(all, T).await.unwrap();
    let got = c
        .controller_get_volume(
            csi::ControllerGetVolumeRequest {
                volume_id: volume.volume_id.clone(),
            },
            T,
        )
        .await
        .unwrap();
    assert!(got.status.unwrap().published_node_ids.is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn validate_list_get_expand_modify() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(create(c, &format!("v{i}"), GI / 8).await.volume_id);
    }
    ids.sort();
    let validate = |id: &str, capability| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: vec![capability],
        ..Default::default()
    };
    let confirmed = c
        .validate_volume_capabilities(validate(&ids[0], mount(Mode::MultiNodeReaderOnly)), T)
        .await
        .unwrap();
    assert!(confirmed.confirmed.is_some());
    let refused = c
        .validate_volume_capabilities(validate(&ids[0], block(Mode::SingleNodeWriter)), T)
        .await
        .unwrap();
    assert!(refused.confirmed.is_none() && !refused.message.is_empty());
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate("unknown", mount(Mode::SingleNodeWriter)), T)
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate("", mount(Mode::SingleNodeWriter)), T)
                .await
        ),
        Code::InvalidArgument
    );
    let mut none = validate(&ids[0], mount(Mode::SingleNodeWriter));
    none.volume_capabilities.clear();
    assert_eq!(
        code(c.validate_volume_capabilities(none, T).await),
        Code::InvalidArgument
    );

    // Paging: two at a time reaches every volume exactly once.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_volumes(
                csi::ListVolumesRequest {
                    max_entries: 2,
                    starting_token: token.clone(),
                },
                T,
            )
            .await
            .unwrap();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, ids);
    let bad = csi::ListVolumesRequest {
        max_entries: 0,
        starting_token: "not-a-token".into(),
    };
    assert_eq!(code(c.list_volumes(bad, T).await), Code::Aborted);
    assert_eq!(
        code(
            c.list_volumes(
                csi::ListVolumesRequest {
                    max_entries: -1,
                    starting_token: String::new()
                },
                T
            )
            .await
        ),
        Code::InvalidArgument
    );

    let get = |id: &str| csi::ControllerGetVolumeRequest {
        volume_id: id.into(),
    };
    assert_eq!(
        code(c.controller_get_volume(get("unknown"), T).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_get_volume(get(""), T).await),
        Code::InvalidArgument
    );
    assert_eq!(
        c.controller_get_volume(get(&ids[1]), T)
            .await
            .unwrap()
            .volume
            .unwrap()
            .volume_id,
        ids[1]
    );

    let expand = |id: &str, bytes| csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = c
        .controller_expand_volume(expand(&ids[2], GI), T)
        .await
        .unwrap();
    assert_eq!(grown.capacity_bytes, GI);
    assert!(
        !grown.node_expansion_required,
        "filesystem volumes need no node step"
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("unknown", GI), T).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand(&ids[2], 2 << 40), T)
                .await
        ),
        Code::OutOfRange
    );

    assert_eq!(
        code(
            c.controller_expand_volume(expand(&ids[2], 10 * GI), T)
                .await
        ),
        Code::ResourceExhausted
    );
    let mut no_range = expand(&ids[2], GI);
    no_range.capacity_range = None;
    assert_eq!(
        code(c.controller_expand_volume(no_range, T).await),
        Code::InvalidArgument
    );
    // An empty range asks for nothing: refused, not read as a new volume's 1 GiB default.
    assert_eq!(
        code(c.controller_expand_volume(expand(&ids[3], 0), T).await),
        Code::InvalidArgument
    );
    let unchanged = c
        .controller_expand_volume(expand(&ids[3], 1), T)
        .await
        .unwrap();
    assert_eq!(
        unchanged.capacity_bytes,
        GI / 8,
        "a smaller request leaves the volume as it is"
    );

    let modify = |id: &str, key: &str| csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: [(key.to_string(), "3000".to_string())].into(),
        ..Default::default()
    };
    c.controller_modify_volume(modify(&ids[3], "iops"), T)
        .await
        .unwrap();
    assert_eq!(
        code(
            c.controller_modify_volume(modify(&ids[3], "XXX_FakeKey"), T)
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_modify_volume(modify("unknown", "iops"), T)
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_modify_volume(modify("", "iops"), T).await),
        Code::InvalidArgument
    );
    cluster.stop().await;
}

/// With no `--accepted-mutable-parameter-names`, as upstream's hostpath driver: every mutable
/// parameter is refused (csi-sanity's "invalid volume attribute class" specs).
#[tokio::test]
async fn no_mutable_parameter_is_accepted_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = csi_hostpath::local::LocalCluster::start(dir.path(), &[], |_| {})
        .await
        .unwrap();
    let c = &cluster.controller.csi;
    let fake = || [("XXX_FakeKey".to_string(), "XXX_FakeValue".to_string())].into();
    let mut request = create_request("fake-class", GI, mount(Mode::SingleNodeWriter));
    request.mutable_parameters = fake();
    assert_eq!(
        code(c.create_volume(request, T).await),
        Code::InvalidArgument
    );
    let volume = create(c, "plain", GI).await.volume_id;
    let modify = csi::ControllerModifyVolumeRequest {
        volume_id: volume,
        mutable_parameters: fake(),
        ..Default::default()
    };
    assert_eq!(
        code(c.controller_modify_volume(modify, T).await),
        Code::InvalidArgument
    );
    cluster.stop().await;
}

#[tokio::test]
async fn snapshots_and_clones_carry_data() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let source = create(c, "source", GI / 4).await;
    let data = cluster.state_dir.join("volumes").join(&source.volume_id);
    std::fs::write(data.join("hello.txt"), b"from the source").unwrap();

    let snap = |name: &str, source: &str| csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    };
    let snapshot = c
        .create_snapshot(snap("snap", &source.volume_id), T)
        .await
        .unwrap()
        .snapshot
        .unwrap();
    assert!(snapshot.ready_to_use);
    assert_eq!(snapshot.size_bytes, GI / 4);
    let again = c
        .create_snapshot(snap("snap", &source.volume_id), T)
        .await
        .unwrap()
        .snapshot
        .unwrap();
    assert_eq!(
        again.snapshot_id, snapshot.snapshot_id,
        "idempotent by name"
    );
    let other = create(c, "other", GI / 4).await;
    assert_eq!(
        code(c.create_snapshot(snap("snap", &other.volume_id), T).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.create_snapshot(snap("x", "unknown"), T).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.create_snapshot(snap("", &source.volume_id), T).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.create_snapshot(snap("y", ""), T).await),
        Code::InvalidArgument
    );

    // Restore from the snapshot and clone the volume: both carry the file.
    let mut restore = create_request("restored", GI / 4, mount(Mode::SingleNodeWriter));
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            },
        )),
    });
    let restored = c
        .create_volume(restore.clone(), T)
        .await
        .unwrap()
        .volume
        .unwrap();
    let mut clone = create_request("cloned", GI / 4, mount(Mode::SingleNodeWriter));
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: source.volume_id.clone(),
            },
        )),
    });
    let cloned = c.create_volume(clone, T).await.unwrap().volume.unwrap();
    for volume in [&restored, &cloned] {
        let file = cluster
            .state_dir
            .join("volumes")
            .join(&volume.volume_id)
            .join("hello.txt");
        assert_eq!(std::fs::read(file).unwrap(), b"from the source");
    }
    let mut smaller = restore.clone();
    smaller.name = "smaller".into();
    smaller.capacity_range = Some(csi::CapacityRange {
        required_bytes: GI / 8,
        limit_bytes: 0,
    });
    assert_eq!(code(c.create_volume(smaller, T).await), Code::OutOfRange);
    let mut other_source = restore;
    other_source.volume_content_source = None;
    assert_eq!(
        code(c.create_volume(other_source, T).await),
        Code::AlreadyExists,
        "same name, other source"
    );

    let list = |request: csi::ListSnapshotsRequest| async {
        c.list_snapshots(request, T).await.unwrap().entries.len()
    };
    assert_eq!(list(csi::ListSnapshotsRequest::default()).await, 1);
    assert_eq!(
        list(csi::ListSnapshotsRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await,
        1
    );
    assert_eq!(
        list(csi::ListSnapshotsRequest {
            snapshot_id: "unknown".into(),
            ..Default::default()
        })
        .await,
        0
    );
    assert_eq!(
        list(csi::ListSnapshotsRequest {
            source_volume_id: other.volume_id.clone(),
            ..Default::default()
        })
        .await,
        0
    );
    let bad = csi::ListSnapshotsRequest {
        starting_token: "bad".into(),
        ..Default::default()
    };
    assert_eq!(code(c.list_snapshots(bad, T).await), Code::Aborted);

    let delete = csi::DeleteSnapshotRequest {
        snapshot_id: snapshot.snapshot_id.clone(),
        ..Default::default()
    };
    c.delete_snapshot(delete.clone(), T).await.unwrap();
    c.delete_snapshot(delete, T).await.unwrap();
    assert_eq!(
        code(
            c.delete_snapshot(csi::DeleteSnapshotRequest::default(), T)
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(list(csi::ListSnapshotsRequest::default()).await, 0);
    cluster.stop().await;
}

/// A directory volume's capacity binds its copies: a clone or restore costs the data its
/// source holds (holes free), and a source holding more than the new volume's capacity (a
/// tenant wrote past it) is refused with OUT_OF_RANGE, its partial copy removed.
#[tokio::test]
async fn copies_of_directory_volumes_keep_holes_and_fit_the_capacity() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const MI: i64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let volumes = cluster.state_dir.join("volumes");
    let source = create(c, "source", MI).await;
    let sparse = std::fs::File::create(volumes.join(&source.volume_id).join("sparse")).unwrap();
    sparse.set_len(2 << 30).unwrap();
    sparse.write_all_at(&[1; 8192], 1 << 30).unwrap();
    drop(sparse);
    let from = |name: &str, source: csi::volume_content_source::Type| {
        let mut request = create_request(name, MI, mount(Mode::SingleNodeWriter));
        request.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(source),
        });
        request
    };
    let of_volume = || {
        csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
            volume_id: source.volume_id.clone(),
        })
    };
    let snapshot_of_source = |name: &str| csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.volume_id.clone(),
        ..Default::default()
    };
    let of_snapshot = |snapshot: &csi::Snapshot| {
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: snapshot.snapshot_id.clone(),
        })
    };
    let snapshot = c
        .create_snapshot(snapshot_of_source("sparse"), T)
        .await
        .unwrap()
        .snapshot
        .unwrap();
    for request in [
        from("clone", of_volume()),
        from("restore", of_snapshot(&snapshot)),
    ] {
        let volume = c.create_volume(request, T).await.unwrap().volume.unwrap();
        let copy = std::fs::metadata(volumes.join(&volume.volume_id).join("sparse")).unwrap();
        assert_eq!(copy.len(), 2 << 30);
        assert!(
            copy.blocks() * 512 < MI as u64,
            "{} bytes on disk",
            copy.blocks() * 512
        );
    }

    // The tenant writes 2 MiB into its 1 MiB volume: no copy of it fits a 1 MiB volume.
    std::fs::write(
        volumes.join(&source.volume_id).join("dense"),
        vec![7; 2 << 20],
    )
    .unwrap();
    let snapshot = c
        .create_snapshot(snapshot_of_source("dense"), T)
        .await
        .unwrap()
        .snapshot
        .unwrap();
    for request in [
        from("too-big-clone", of_volume()),
        from("too-big-restore", of_snapshot(&snapshot)),
    ] {
        let refused = c.create_volume(request.clone(), T).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Code::OutOfRange,
            "{}: {refused:?}",
            request.name
        );
        assert!(
            refused.message().contains("more data than"),
            "{}",
            refused.message()
        );
    }
    let listed = c
        .list_volumes(csi::ListVolumesRequest::default(), T)
        .await
        .unwrap()
        .entries
        .len();
    assert_eq!(listed, 3, "the source and the two copies that fit");
    assert_eq!(std::fs::read_dir(&volumes).unwrap().count(), 3);
    cluster.stop().await;
}

#[tokio::test]
async fn group_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = create(c, "ga", GI / 8).await.volume_id;
    let b = create(c, "gb", GI / 8).await.volume_id;
    let request = |name: &str, ids: Vec<String>| csi::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: ids,
        ..Default::default()
    };
    let group = c
        .create_volume_group_snapshot(request("g", vec![a.clone(), b.clone()]), T)
        .await
        .unwrap()
        .group_snapshot
        .unwrap();
    assert!(group.ready_to_use);
    assert_eq!(group.snapshots.len(), 2);
    assert!(
        group
            .snapshots
            .iter()
            .all(|s| s.group_snapshot_id == group.group_snapshot_id)
    );
    let again = c
        .create_volume_group_snapshot(request("g", vec![b.clone(), a.clone()]), T)
        .await
        .unwrap()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, group.group_snapshot_id);
    assert_eq!(
        code(
            c.create_volume_group_snapshot(request("g", vec![a.clone()]), T)
                .await
        ),
        Code::AlreadyExists
    );
    assert_eq!(
        code(
            c.create_volume_group_snapshot(request("", vec![a.clone()]), T)
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.create_volume_group_snapshot(request("h", vec![]), T)
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.create_volume_group_snapshot(request("h", vec!["unknown".into()]), T)
                .await
        ),
        Code::NotFound
    );
    let member = csi::DeleteSnapshotRequest {
        snapshot_id: group.snapshots[0].snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(c.delete_snapshot(member, T).await),
        Code::FailedPrecondition
    );
    let members: Vec<String> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();
    let get = csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: members.clone(),
        ..Default::default()
    };
    assert_eq!(
        c.get_volume_group_snapshot(get, T)
            .await
            .unwrap()
            .group_snapshot
            .unwrap()
            .snapshots
            .len(),
        2
    );
    let wrong = csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: vec![members[0].clone()],
        ..Default::default()
    };
    assert_eq!(
        code(c.get_volume_group_snapshot(wrong, T).await),
        Code::InvalidArgument
    );
    let delete = csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: members,
        ..Default::default()
    };
    c.delete_volume_group_snapshot(delete.clone(), T)
        .await
        .unwrap();
    c.delete_volume_group_snapshot(delete, T).await.unwrap();
    let gone = csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(c.get_volume_group_snapshot(gone, T).await),
        Code::NotFound
    );
    assert!(
        c.list_snapshots(csi::ListSnapshotsRequest::default(), T)
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    cluster.stop().await;
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_volume() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let attempts = futures::future::join_all((0..16).map(|_| {
        c.create_volume(
            create_request("contended", GI / 8, mount(Mode::SingleNodeWriter)),
            T,
        )
    }))
    .await;
    let mut ids = std::collections::BTreeSet::new();
    for attempt in attempts {
        match attempt {
            Ok(response) => {
                ids.insert(response.volume.unwrap().volume_id);
            }
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status}"),
        }
    }
    assert_eq!(ids.len(), 1, "every success names the same volume");
    let listed = c
        .list_volumes(csi::ListVolumesRequest::default(), T)
        .await
        .unwrap();
    assert_eq!(listed.entries.len(), 1);
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_connectivity() {
    use csi_proto::podmon::v1::ValidateVolumeHostConnectivityRequest as Request;
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let probe = c
        .validate_volume_host_connectivity(Request::default(), T)
        .await
        .unwrap();
    assert!(probe.messages.iter().any(|m| m.contains("implemented")));
    let volume = create(c, "io", GI / 8).await;
    let request = |node: &str| Request {
        volume_ids: vec![volume.volume_id.clone()],
        node_id: node.into(),
        io_sample_time_seconds: 5,
        ..Default::default()
    };
    let quiet = c
        .validate_volume_host_connectivity(request("node-a"), T)
        .await
        .unwrap();
    assert!(quiet.connected, "node-a's instance heartbeats");
    std::fs::write(
        cluster
            .state_dir
            .join("volumes")
            .join(&volume.volume_id)
            .join("f"),
        b"io",
    )
    .unwrap();
    let busy = c
        .validate_volume_host_connectivity(request("node-a"), T)
        .await
        .unwrap();
    assert!(busy.ios_in_progress);
    let unknown = c
        .validate_volume_host_connectivity(request("node-z"), T)
        .await
        .unwrap();
    assert!(!unknown.connected);
    let no_node = Request {
        volume_ids: vec![volume.volume_id.clone()],
        ..Default::default()
    };
    assert_eq!(
        code(c.validate_volume_host_connectivity(no_node, T).await),
        Code::InvalidArgument
    );
    cluster.stop().await;
}
