//! The report as a person reads it (aligned tables, one per finding kind) or as JSON. Pure.

use csi_kinds::quantity::binary_si;

use crate::report::{Difference, Finding, KINDS, Report, StorageVolume, describe_segments};

/// Columns padded to their widest cell, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out += &line(row.clone());
    }
    out
}

fn or_dash(text: String) -> String {
    if text.is_empty() { "-".into() } else { text }
}

fn size(bytes: i64) -> String {
    if bytes > 0 {
        binary_si(bytes)
    } else {
        "-".into()
    }
}

fn heading(kind: &str) -> &'static str {
    match kind {
        "orphaned" => "ORPHANED: volumes on the storage without a PersistentVolume",
        "orphanedEphemeral" => {
            "ORPHANED EPHEMERAL: inline volume handles on the storage that no pod has (not for import)"
        }
        "missing" => "MISSING: PersistentVolumes whose volume the driver does not list",
        "mismatched" => "MISMATCHED: PersistentVolumes that disagree with their volume",
        "abnormal" => "ABNORMAL: volumes the driver reports unhealthy",
        "orphanedSnapshot" => {
            "ORPHANED SNAPSHOTS: snapshots on the storage without a VolumeSnapshotContent"
        }
        _ => "MISSING SNAPSHOTS: VolumeSnapshotContents whose snapshot the driver does not list",
    }
}

/// An orphan's columns up to CONDITION, the same for both kinds of orphans.
fn orphan_row(volume: &StorageVolume) -> Vec<String> {
    vec![
        volume.id.clone(),
        size(volume.capacity_bytes),
        or_dash(describe_segments(volume.topology.iter())),
        volume
            .published_nodes
            .as_ref()
            .map_or("?".into(), |nodes| or_dash(nodes.join(","))),
        volume.condition.as_ref().map_or("-".into(), |c| {
            if c.abnormal { "abnormal" } else { "ok" }.into()
        }),
    ]
}

fn difference(difference: &Difference) -> String {
    match difference {
        Difference::Size {
            pv_bytes,
            storage_bytes,
        } => {
            format!(
                "size: PV {}, storage {}",
                binary_si(*pv_bytes),
                binary_si(*storage_bytes)
            )
        }
        Difference::Topology { pv, storage } => format!("topology: PV {pv}, storage {storage}"),
    }
}

/// One finding as a row of its kind's table.
fn row(finding: &Finding) -> Vec<String> {
    match finding {
        Finding::Orphaned { volume, claim } => {
            let mut row = orphan_row(volume);
            row.push(claim.clone().unwrap_or_else(|| "-".into()));
            row
        }
        Finding::OrphanedEphemeral { volume } => orphan_row(volume),
        Finding::Missing {
            pv,
            volume_id,
            class,
            claim,
        } => vec![
            pv.clone(),
            volume_id.clone(),
            or_dash(class.clone()),
            claim.clone().unwrap_or_else(|| "-".into()),
        ],
        Finding::Mismatched {
            pv,
            volume_id,
            class,
            differences,
        } => vec![
            pv.clone(),
            volume_id.clone(),
            or_dash(class.clone()),
            differences
                .iter()
                .map(difference)
                .collect::<Vec<_>>()
                .join("; "),
        ],
        Finding::Abnormal {
            volume_id,
            pv,
            class,
            message,
        } => vec![
            volume_id.clone(),
            pv.clone().unwrap_or_else(|| "-".into()),
            or_dash(class.clone()),
            message.clone(),
        ],
        Finding::OrphanedSnapshot { snapshot } => vec![
            snapshot.id.clone(),
            or_dash(snapshot.source_volume_id.clone()),
            size(snapshot.size_bytes),
            snapshot.ready.to_string(),
        ],
        Finding::MissingSnapshot {
            content,
            snapshot_id,
            class,
        } => {
            vec![content.clone(), snapshot_id.clone(), or_dash(class.clone())]
        }
    }
}

fn headers(kind: &str) -> &'static [&'static str] {
    match kind {
        "orphaned" => &[
            "VOLUME",
            "SIZE",
            "TOPOLOGY",
            "PUBLISHED ON",
            "CONDITION",
            "MADE FOR CLAIM",
        ],
        "orphanedEphemeral" => &["VOLUME", "SIZE", "TOPOLOGY", "PUBLISHED ON", "CONDITION"],
        "missing" => &["PV", "VOLUME", "CLASS", "CLAIM"],
        "mismatched" => &["PV", "VOLUME", "CLASS", "DIFFERENCE"],
        "abnormal" => &["VOLUME", "PV", "CLASS", "MESSAGE"],
        "orphanedSnapshot" => &["SNAPSHOT", "SOURCE VOLUME", "SIZE", "READY"],
        _ => &["CONTENT", "SNAPSHOT", "CLASS"],
    }
}

/// The report as tables.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "Driver {}: {} volumes on the storage, {} PersistentVolumes, {} inline volumes of pods",
        report.driver, report.volumes_on_storage, report.persistent_volumes, report.inline_volumes
    );
    match (report.snapshots_on_storage, report.snapshot_contents) {
        (Some(snapshots), Some(contents)) => {
            out += &format!("; {snapshots} snapshots, {contents} VolumeSnapshotContents.\n")
        }
        _ => out += "; snapshots not compared.\n",
    }
    for kind in KINDS {
        let rows: Vec<Vec<String>> = report
            .findings
            .iter()
            .filter(|f| f.kind() == kind)
            .map(row)
            .collect();
        if !rows.is_empty() {
            out += &format!("\n{}\n{}", heading(kind), table(headers(kind), &rows));
        }
    }
    let kinds: Vec<&str> = KINDS
        .into_iter()
        .filter(|kind| report.count(kind) > 0)
        .collect();
    if !kinds.is_empty() {
        let mut headers = vec!["CLASS", "PVS"];
        headers.extend(kinds.iter().copied());
        let rows: Vec<Vec<String>> = report
            .classes
            .iter()
            .map(|(class, counts)| {
                let mut row = vec![
                    if class.is_empty() {
                        "(none)".into()
                    } else {
                        class.clone()
                    },
                    counts.persistent_volumes.to_string(),
                ];
                row.extend(
                    kinds
                        .iter()
                        .map(|k| counts.findings.get(*k).copied().unwrap_or(0).to_string()),
                );
                row
            })
            .collect();
        out += &format!("\nPER CLASS\n{}", table(&headers, &rows));
    }
    out += &if report.is_clean() {
        "\nClean: every volume has its PersistentVolume or pod and every PersistentVolume its volume.\n"
            .to_string()
    } else {
        format!("\n{} findings.\n", report.findings.len())
    };
    out
}

pub fn json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("a report serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{ClusterVolume, Inputs, compare};

    #[test]
    fn the_text_report_has_a_table_per_finding_kind_and_counts_per_class() {
        let report = compare(
            "hostpath",
            &Inputs {
                volumes: vec![
                    StorageVolume {
                        id: "vol-orphan".into(),
                        capacity_bytes: 1 << 30,
                        published_nodes: Some(vec![]),
                        ..Default::default()
                    },
                    StorageVolume {
                        id: format!("csi-{}", "0a".repeat(32)),
                        capacity_bytes: 100 << 20,
                        published_nodes: Some(vec!["node-a".into()]),
                        ..Default::default()
                    },
                ],
                pvs_before: vec![ClusterVolume {
                    pv: "pv-lost".into(),
                    uid: "u".into(),
                    handle: "vol-lost".into(),
                    class: "fast".into(),
                    ..Default::default()
                }],
                pvs_after: vec![ClusterVolume {
                    pv: "pv-lost".into(),
                    uid: "u".into(),
                    handle: "vol-lost".into(),
                    class: "fast".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let text = text(&report);
        let expected = "\
Driver hostpath: 2 volumes on the storage, 1 PersistentVolumes, 0 inline volumes of pods; snapshots not compared.

ORPHANED: volumes on the storage without a PersistentVolume
VOLUME      SIZE  TOPOLOGY  PUBLISHED ON  CONDITION  MADE FOR CLAIM
vol-orphan  1Gi   -         -             -          -

ORPHANED EPHEMERAL: inline volume handles on the storage that no pod has (not for import)
VOLUME                                                                SIZE   TOPOLOGY  PUBLISHED ON  CONDITION
csi-0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a  100Mi  -         node-a        -

MISSING: PersistentVolumes whose volume the driver does not list
PV       VOLUME    CLASS  CLAIM
pv-lost  vol-lost  fast   -

PER CLASS
CLASS   PVS  orphaned  orphanedEphemeral  missing
(none)  0    1         1                  0
fast    1    0         0                  1

3 findings.
";
        assert_eq!(text, expected);
        let json: serde_json::Value = serde_json::from_str(&json(&report)).unwrap();
        assert_eq!(json["findings"][0]["kind"], "orphaned");
        assert_eq!(json["findings"][1]["kind"], "orphanedEphemeral");
        assert_eq!(json["classes"]["fast"]["findings"]["missing"], 1);
    }
}
