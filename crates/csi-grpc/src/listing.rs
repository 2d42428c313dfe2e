//! Paging through the driver's lists (ListVolumes, ListSnapshots, ControllerListVolumeHealth):
//! `max_entries` per call, `next_token` until empty. A driver answers ABORTED when a token went stale (the listing changed under it, as
//! csi-sanity probes): the listing starts again from the beginning, a bounded number of times.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use csi_proto::csi::v1 as csi;
#[cfg(feature = "v1-12")]
use csi_proto::csi::v1_12;

use crate::conn::CsiConnection;
use tonic::{Code, Status};

/// How often a listing starts again after ABORTED before giving up.
pub const RESTARTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("{rpc} failed: {code:?}: {message}")]
    Rpc {
        rpc: &'static str,
        code: Code,
        message: String,
    },
    #[error("{rpc}: the listing kept changing (ABORTED on a stale next_token {RESTARTS} times)")]
    KeptChanging { rpc: &'static str },
    #[error("{rpc}: the driver returned next_token {token:?} twice in one listing")]
    TokenLoop { rpc: &'static str, token: String },
}

#[derive(Debug, Clone, Copy)]
pub struct Paging {
    /// `max_entries` of each call; 0 lets the driver choose.
    pub max_entries: i32,
    pub timeout: Duration,
}

/// Every entry of a paged listing. `fetch(token)` returns one page and its `next_token`;
/// `progress(pages, entries)` is told after every page that has a successor.
pub async fn all_pages<E, F, Fut>(
    rpc: &'static str,
    mut fetch: F,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<E>, ListError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(Vec<E>, String), Status>>,
{
    let mut restarts = 0;
    'listing: loop {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let started_here = token.is_empty();
            match fetch(token.clone()).await {
                Ok((page, next)) => {
                    entries.extend(page);
                    pages += 1;
                    if next.is_empty() {
                        return Ok(entries);
                    }
                    if !seen.insert(next.clone()) {
                        return Err(ListError::TokenLoop { rpc, token: next });
                    }
                    progress(pages, entries.len());
                    token = next;
                }
                Err(status) if status.code() == Code::Aborted && !started_here => {
                    restarts += 1;
                    if restarts >= RESTARTS {
                        return Err(ListError::KeptChanging { rpc });
                    }
                    tracing::info!(rpc, token, "next_token went stale; listing again");
                    continue 'listing;
                }
                Err(status) => {
                    return Err(ListError::Rpc {
                        rpc,
                        code: status.code(),
                        message: status.message().to_string(),
                    });
                }
            }
        }
    }
}

pub async fn volumes(
    csi: &CsiConnection,
    paging: Paging,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<csi::list_volumes_response::Entry>, ListError> {
    all_pages(
        "ListVolumes",
        |starting_token| async move {
            let request = csi::ListVolumesRequest {
                max_entries: paging.max_entries,
                starting_token,
            };
            let response = csi.list_volumes(request, paging.timeout).await?;
            Ok((response.entries, response.next_token))
        },
        progress,
    )
    .await
}

/// ListVolumes of a driver of the VolumeCondition generation (CSI v1.0-v1.12), whose entries
/// carry each volume's condition.
#[cfg(feature = "v1-12")]
pub async fn legacy_volumes(
    csi: &CsiConnection,
    paging: Paging,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<v1_12::list_volumes_response::Entry>, ListError> {
    all_pages(
        "ListVolumes",
        |starting_token| async move {
            let request = v1_12::ListVolumesRequest {
                max_entries: paging.max_entries,
                starting_token,
            };
            let response = csi.legacy_list_volumes(request, paging.timeout).await?;
            Ok((response.entries, response.next_token))
        },
        progress,
    )
    .await
}

/// Every abnormal volume's health (CSI v1.13 ControllerListVolumeHealth, healthy volumes
/// omitted).
pub async fn volume_health(
    csi: &CsiConnection,
    paging: Paging,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<csi::VolumeHealth>, ListError> {
    all_pages(
        "ControllerListVolumeHealth",
        |starting_token| async move {
            let request = csi::ControllerListVolumeHealthRequest {
                max_entries: paging.max_entries,
                starting_token,
                ..Default::default()
            };
            let response = csi
                .controller_list_volume_health(request, paging.timeout)
                .await?;
            Ok((response.entries, response.next_token))
        },
        progress,
    )
    .await
}

pub async fn snapshots(
    csi: &CsiConnection,
    paging: Paging,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<csi::list_snapshots_response::Entry>, ListError> {
    all_pages(
        "ListSnapshots",
        |starting_token| async move {
            let request = csi::ListSnapshotsRequest {
                max_entries: paging.max_entries,
                starting_token,
                ..Default::default()
            };
            let response = csi.list_snapshots(request, paging.timeout).await?;
            Ok((response.entries, response.next_token))
        },
        progress,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    type Answers = VecDeque<Result<(Vec<u32>, String), Status>>;

    async fn list(answers: Answers) -> (Result<Vec<u32>, ListError>, Vec<String>) {
        let answers = std::sync::Mutex::new(answers);
        let asked = std::sync::Mutex::new(Vec::new());
        let listed = all_pages(
            "ListVolumes",
            |token| {
                asked.lock().unwrap().push(token);
                let answer = answers.lock().unwrap().pop_front().expect("another page");
                async move { answer }
            },
            &mut |_, _| {},
        )
        .await;
        (listed, asked.into_inner().unwrap())
    }

    fn page(entries: &[u32], next: &str) -> Result<(Vec<u32>, String), Status> {
        Ok((entries.to_vec(), next.to_string()))
    }

    #[tokio::test]
    async fn pages_are_followed_until_the_token_is_empty() {
        let (listed, asked) =
            list([page(&[1, 2], "2"), page(&[3, 4], "4"), page(&[5], "")].into()).await;
        assert_eq!(listed.unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(asked, ["", "2", "4"]);
    }

    #[tokio::test]
    async fn a_stale_token_starts_the_listing_again() {
        let (listed, asked) = list(
            [
                page(&[1, 2], "2"),
                Err(Status::aborted("stale")),
                page(&[1, 3], "3"),
                page(&[4], ""),
            ]
            .into(),
        )
        .await;
        assert_eq!(
            listed.unwrap(),
            vec![1, 3, 4],
            "nothing of the stale pass is kept"
        );
        assert_eq!(asked, ["", "2", "", "3"]);
    }

    #[tokio::test]
    async fn a_listing_that_keeps_changing_or_loops_is_an_error() {
        let stale = || [page(&[1], "1"), Err(Status::aborted("stale"))];
        let answers: Answers = stale().into_iter().chain(stale()).chain(stale()).collect();
        assert!(matches!(
            list(answers).await.0,
            Err(ListError::KeptChanging { .. })
        ));
        let (looped, _) = list([page(&[1], "a"), page(&[2], "a")].into()).await;
        assert!(matches!(looped, Err(ListError::TokenLoop { .. })));
        let (refused, _) = list([Err(Status::aborted("busy"))].into()).await;
        assert!(
            matches!(
                refused,
                Err(ListError::Rpc {
                    code: Code::Aborted,
                    ..
                })
            ),
            "ABORTED on the first page is the driver's answer, not a stale token"
        );
    }
}
