use super::*;

fn volume(id: &str, bytes: i64) -> StorageVolume {
    StorageVolume {
        id: id.to_string(),
        capacity_bytes: bytes,
        ..Default::default()
    }
}

fn pv(name: &str, handle: &str, bytes: i64) -> ClusterVolume {
    ClusterVolume {
        pv: name.to_string(),
        uid: format!("uid-{name}"),
        handle: handle.to_string(),
        class: "fast".to_string(),
        capacity_bytes: Some(bytes),
        ..Default::default()
    }
}

fn segments(pairs: &[(&str, &str)]) -> Segments {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn kinds(report: &Report) -> Vec<(&'static str, String)> {
    report
        .findings
        .iter()
        .map(|f| {
            let what = match f {
                Finding::Orphaned { volume, .. } | Finding::OrphanedEphemeral { volume } => {
                    volume.id.clone()
                }
                Finding::Missing { pv, .. } | Finding::Mismatched { pv, .. } => pv.clone(),
                Finding::Abnormal { volume_id, .. } => volume_id.clone(),
                Finding::OrphanedSnapshot { snapshot } => snapshot.id.clone(),
                Finding::MissingSnapshot { content, .. } => content.clone(),
            };
            (f.kind(), what)
        })
        .collect()
}

fn both(pvs: Vec<ClusterVolume>) -> (Vec<ClusterVolume>, Vec<ClusterVolume>) {
    (pvs.clone(), pvs)
}

/// Each row: the storage, the PVs read before and after the storage listing, and the
/// findings expected.
#[test]
fn volumes_are_orphaned_missing_or_clean_across_the_two_readings() {
    let gib = 1 << 30;
    let deleting = ClusterVolume {
        deleting: true,
        ..pv("pv-deleting", "vol-gone", gib)
    };
    type Row = (
        &'static str,
        Vec<StorageVolume>,
        (Vec<ClusterVolume>, Vec<ClusterVolume>),
        Vec<(&'static str, &'static str)>,
    );
    let rows: Vec<Row> = vec![
        (
            "clean",
            vec![volume("vol-1", gib)],
            both(vec![pv("pv-1", "vol-1", gib)]),
            vec![],
        ),
        (
            "a volume without a PV is orphaned",
            vec![volume("vol-1", gib), volume("vol-2", gib)],
            both(vec![pv("pv-1", "vol-1", gib)]),
            vec![("orphaned", "vol-2")],
        ),
        (
            "a PV without its volume is missing",
            vec![],
            both(vec![pv("pv-1", "vol-1", gib)]),
            vec![("missing", "pv-1")],
        ),
        (
            "a PV created while the storage was listed: its volume is not orphaned",
            vec![volume("vol-new", gib)],
            (vec![], vec![pv("pv-new", "vol-new", gib)]),
            vec![],
        ),
        (
            "a PV whose volume was made after the listing began is not missing",
            vec![],
            (vec![], vec![pv("pv-new", "vol-new", gib)]),
            vec![],
        ),
        (
            "a PV deleted while the storage was listed: its volume is not orphaned",
            vec![volume("vol-1", gib)],
            (vec![pv("pv-1", "vol-1", gib)], vec![]),
            vec![],
        ),
        (
            "a PV being deleted has lost its volume on purpose",
            vec![],
            both(vec![deleting]),
            vec![],
        ),
    ];
    for (name, volumes, (pvs_before, pvs_after), expected) in rows {
        let report = compare(
            "hostpath",
            &Inputs {
                volumes,
                pvs_before,
                pvs_after,
                ..Default::default()
            },
        );
        let expected: Vec<(&str, String)> = expected
            .into_iter()
            .map(|(k, w)| (k, w.to_string()))
            .collect();
        assert_eq!(kinds(&report), expected, "{name}");
        assert_eq!(report.is_clean(), expected.is_empty(), "{name}");
    }
}

#[test]
fn the_handle_of_an_inline_volume_is_the_kubelets() {
    // printf '%s' 0b6f2c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6fscratch | sha256sum
    assert_eq!(
        inline_volume_handle("0b6f2c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f", "scratch"),
        "csi-0c1fdee27345f8335a2164b0221356c7a772ad14f3384793e4b953dc0dfdacb9"
    );
    let shapes = [
        (format!("csi-{}", "0f".repeat(32)), true),
        (format!("csi-{}", "0F".repeat(32)), false),
        (format!("csi-{}", "0f".repeat(31)), false),
        (format!("csi-{}0", "0f".repeat(32)), false),
        (format!("pvc-{}", "0f".repeat(32)), false),
        ("7c0d2f6e-5b1a-11ef-a3f4-0242ac120002".to_string(), false),
    ];
    for (id, inline) in shapes {
        assert_eq!(is_inline_handle(&id), inline, "{id}");
    }
}

/// Each row: the storage, the pods' inline volumes read before and after the storage listing,
/// and the findings expected.
#[test]
fn inline_volumes_are_in_use_while_a_pod_has_them_and_orphaned_ephemeral_after() {
    let handle = |pod: &str| inline_volume_handle(&format!("uid-{pod}"), "scratch");
    let inline = |pod: &str| InlineVolume {
        pod: format!("shop/{pod}"),
        volume: "scratch".into(),
        handle: handle(pod),
    };
    let ephemeral = |pod: &str| volume(&handle(pod), 100 << 20);
    type Row = (
        &'static str,
        Vec<StorageVolume>,
        (Vec<InlineVolume>, Vec<InlineVolume>),
        Vec<(&'static str, String)>,
    );
    let rows: Vec<Row> = vec![
        (
            "a live pod's inline volume is in use",
            vec![ephemeral("web-0")],
            (vec![inline("web-0")], vec![inline("web-0")]),
            vec![],
        ),
        (
            "a pod created while the storage was listed",
            vec![ephemeral("web-0")],
            (vec![], vec![inline("web-0")]),
            vec![],
        ),
        (
            "a pod deleted while the storage was listed",
            vec![ephemeral("web-0")],
            (vec![inline("web-0")], vec![]),
            vec![],
        ),
        (
            "no pod has it: orphaned ephemeral, not orphaned",
            vec![ephemeral("web-0"), ephemeral("web-1")],
            (vec![inline("web-1")], vec![inline("web-1")]),
            vec![("orphanedEphemeral", handle("web-0"))],
        ),
        (
            "a pod's inline volume the storage does not list is no finding",
            vec![],
            (vec![inline("web-0")], vec![inline("web-0")]),
            vec![],
        ),
        (
            "an inline handle of another pod's volume name explains nothing",
            vec![volume(
                &inline_volume_handle("uid-web-0", "cache"),
                100 << 20,
            )],
            (vec![inline("web-0")], vec![inline("web-0")]),
            vec![(
                "orphanedEphemeral",
                inline_volume_handle("uid-web-0", "cache"),
            )],
        ),
        (
            "a volume of another shape is orphaned as before",
            vec![volume("vol-1", 1 << 20)],
            (vec![], vec![]),
            vec![("orphaned", "vol-1".to_string())],
        ),
    ];
    for (name, volumes, (inline_before, inline_after), expected) in rows {
        let report = compare(
            "hostpath",
            &Inputs {
                volumes,
                inline_before,
                inline_after,
                ..Default::default()
            },
        );
        assert_eq!(kinds(&report), expected, "{name}");
    }
    let imported = compare(
        "hostpath",
        &Inputs {
            volumes: vec![ephemeral("web-0")],
            pvs_before: vec![pv("pv-1", &handle("web-0"), 100 << 20)],
            pvs_after: vec![pv("pv-1", &handle("web-0"), 100 << 20)],
            ..Default::default()
        },
    );
    assert!(
        imported.is_clean(),
        "a PV names it: {:?}",
        imported.findings
    );
}

#[test]
fn an_orphan_names_the_claim_it_was_provisioned_for() {
    let mut orphan = volume("vol-1", 1 << 20);
    orphan.context = [
        (CLAIM_NAME_KEY, "data"),
        (CLAIM_NAMESPACE_KEY, "shop"),
        (PV_NAME_KEY, "pvc-123"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let report = compare(
        "hostpath",
        &Inputs {
            volumes: vec![orphan],
            ..Default::default()
        },
    );
    let Finding::Orphaned { claim, .. } = &report.findings[0] else {
        panic!("orphaned: {:?}", report.findings);
    };
    assert_eq!(claim.as_deref(), Some("shop/data"));
}

#[test]
fn size_and_topology_differences_are_mismatches() {
    let gib = 1 << 30;
    let zone_a = segments(&[("zone", "a")]);
    let zone_b = segments(&[("zone", "b")]);
    let on = |segments: &[&Segments]| {
        PvTopology::Segments(segments.iter().map(|s| (*s).clone()).collect())
    };
    let placed = |topology: Vec<Segments>| StorageVolume {
        topology,
        ..volume("vol-1", gib)
    };
    type Row = (&'static str, ClusterVolume, StorageVolume, Vec<Difference>);
    let rows: Vec<Row> = vec![
        (
            "same",
            pv("pv-1", "vol-1", gib),
            volume("vol-1", gib),
            vec![],
        ),
        (
            "storage size unknown (0) is not compared",
            pv("pv-1", "vol-1", gib),
            volume("vol-1", 0),
            vec![],
        ),
        (
            "PV larger than the volume",
            pv("pv-1", "vol-1", 2 * gib),
            volume("vol-1", gib),
            vec![Difference::Size {
                pv_bytes: 2 * gib,
                storage_bytes: gib,
            }],
        ),
        (
            "PV without capacity is not compared",
            ClusterVolume {
                capacity_bytes: None,
                ..pv("pv-1", "vol-1", gib)
            },
            volume("vol-1", 2 * gib),
            vec![],
        ),
        (
            "same topology",
            ClusterVolume {
                topology: on(&[&zone_a, &zone_b]),
                ..pv("pv-1", "vol-1", gib)
            },
            placed(vec![zone_b.clone(), zone_a.clone()]),
            vec![],
        ),
        (
            "other zone",
            ClusterVolume {
                topology: on(&[&zone_a]),
                ..pv("pv-1", "vol-1", gib)
            },
            placed(vec![zone_b.clone()]),
            vec![Difference::Topology {
                pv: "zone=a".into(),
                storage: "zone=b".into(),
            }],
        ),
        (
            "a PV usable everywhere for a volume in one zone",
            pv("pv-1", "vol-1", gib),
            placed(vec![zone_a.clone()]),
            vec![Difference::Topology {
                pv: "no node affinity".into(),
                storage: "zone=a".into(),
            }],
        ),
        (
            "a driver reporting no topology is not compared",
            ClusterVolume {
                topology: on(&[&zone_a]),
                ..pv("pv-1", "vol-1", gib)
            },
            volume("vol-1", gib),
            vec![],
        ),
        (
            "affinity this comparison does not model",
            ClusterVolume {
                topology: PvTopology::Other,
                ..pv("pv-1", "vol-1", gib)
            },
            placed(vec![zone_a.clone()]),
            vec![],
        ),
    ];
    for (name, cluster, storage, expected) in rows {
        assert_eq!(differences(&cluster, &storage), expected, "{name}");
    }
}

#[test]
fn abnormal_volumes_are_reported_with_their_pv_and_counted_per_class() {
    let mut sick = volume("vol-1", 1 << 20);
    sick.condition = Some(Condition {
        abnormal: true,
        message: "data is missing".into(),
    });
    let mut fine = volume("vol-2", 1 << 20);
    fine.condition = Some(Condition {
        abnormal: false,
        message: "ok".into(),
    });
    let report = compare(
        "hostpath",
        &Inputs {
            volumes: vec![sick, fine, volume("vol-3", 1 << 20)],
            pvs_before: vec![pv("pv-1", "vol-1", 1 << 20), pv("pv-2", "vol-2", 1 << 20)],
            pvs_after: vec![pv("pv-1", "vol-1", 1 << 20), pv("pv-2", "vol-2", 1 << 20)],
            ..Default::default()
        },
    );
    assert_eq!(
        report.findings[0],
        Finding::Abnormal {
            volume_id: "vol-1".into(),
            pv: Some("pv-1".into()),
            class: "fast".into(),
            message: "data is missing".into(),
        }
    );
    assert_eq!(kinds(&report)[1], ("orphaned", "vol-3".to_string()));
    assert_eq!(report.classes["fast"].persistent_volumes, 2);
    assert_eq!(report.classes["fast"].findings["abnormal"], 1);
    assert_eq!(report.classes[""].findings["orphaned"], 1);
    assert_eq!(report.count("orphaned"), 1);
}

#[test]
fn snapshots_are_compared_with_their_contents() {
    let snapshot = |id: &str| StorageSnapshot {
        id: id.to_string(),
        source_volume_id: "vol-1".into(),
        size_bytes: 1 << 20,
        ready: true,
    };
    let content = |name: &str, handle: &str| ClusterSnapshot {
        content: name.to_string(),
        uid: format!("uid-{name}"),
        handle: handle.to_string(),
        class: "snap".into(),
        deleting: false,
    };
    let report = compare(
        "hostpath",
        &Inputs {
            snapshots: Some(SnapshotInputs {
                snapshots: vec![snapshot("snap-1"), snapshot("snap-2"), snapshot("snap-new")],
                contents_before: vec![content("c-1", "snap-1"), content("c-3", "snap-3")],
                contents_after: vec![
                    content("c-1", "snap-1"),
                    content("c-3", "snap-3"),
                    content("c-new", "snap-new"),
                    content("c-later", "snap-later"),
                ],
            }),
            ..Default::default()
        },
    );
    assert_eq!(
        kinds(&report),
        vec![
            ("orphanedSnapshot", "snap-2".to_string()),
            ("missingSnapshot", "c-3".to_string())
        ]
    );
    assert_eq!(report.snapshots_on_storage, Some(3));
    assert_eq!(report.snapshot_contents, Some(4));
    assert_eq!(report.classes["snap"].findings["missingSnapshot"], 1);
}

#[test]
fn findings_serialise_with_their_kind() {
    let finding = Finding::Missing {
        pv: "pv-1".into(),
        volume_id: "vol-1".into(),
        class: "fast".into(),
        claim: Some("shop/data".into()),
    };
    assert_eq!(
        serde_json::to_value(&finding).unwrap(),
        serde_json::json!({"kind": "missing", "pv": "pv-1", "volumeId": "vol-1",
            "class": "fast", "claim": "shop/data"})
    );
    let ephemeral = Finding::OrphanedEphemeral {
        volume: volume("csi-00", 5),
    };
    assert_eq!(
        serde_json::to_value(&ephemeral).unwrap(),
        serde_json::json!({"kind": "orphanedEphemeral",
            "volume": {"id": "csi-00", "capacity_bytes": 5}})
    );
}
