//! The writer of the in-flight record ([`crate::inflight`]): one task owns the Lease and
//! writes every change queued since its last write in one update — a group commit, so a
//! burst of claims costs a few writes, not one per claim, and a lone claim waits for one. A
//! claim entered waits for the write that carries it; a claim that leaves does not wait (a
//! stale entry is only finished again, and CreateVolume returns the same volume).
//!
//! Leases are what the provisioner's RBAC already grants (leader election: get, create,
//! update). Where it does not, the record is unavailable and the claim finalizer of
//! [`crate::protection`] protects instead.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use csi_sidecar::lock;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::inflight::{self, Entry, RecordError};

/// How long entries that do not fit wait before the writer tries them again.
const FULL_RETRY: Duration = Duration::from_millis(200);

/// Conflicting writes retried in a row before the batch fails (another writer: a former
/// leader still running).
const CONFLICT_RETRIES: usize = 5;

#[derive(Clone, Debug, thiserror::Error)]
pub enum RecordWriteError {
    /// The RBAC grants no write of the Lease: the claim finalizer protects instead.
    #[error("writing the in-flight record {0}: forbidden")]
    Forbidden(String),
    #[error("writing the in-flight record {lease}: {message}")]
    Failed { lease: String, message: String },
    /// At start: the entries a former run left cannot be read, so nothing is provisioned.
    #[error("reading the in-flight record {lease}: {message}")]
    Read { lease: String, message: String },
}

enum Change {
    Enter {
        entry: Box<Entry>,
        written: oneshot::Sender<Result<(), RecordWriteError>>,
    },
    Leave(String),
}

/// The provisioner's side of the record.
pub(super) struct InflightRecord {
    changes: mpsc::UnboundedSender<Change>,
    /// The entries written or being written, by claim UID.
    entries: Mutex<BTreeMap<String, Entry>>,
    /// False once the Lease proved forbidden.
    available: AtomicBool,
    lease: String,
}

impl InflightRecord {
    /// Reads the record (the entries a former run left) and starts its writer.
    pub async fn start(
        client: Client,
        namespace: &str,
        name: &str,
        shutdown: CancellationToken,
    ) -> Result<Self, RecordWriteError> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let lease = format!("{namespace}/{name}");
        let (current, available) = match api.get_opt(name).await {
            Ok(current) => (current, true),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::warn!(%lease, "the in-flight record cannot be read (forbidden): claims are protected by a finalizer instead");
                (None, false)
            }
            Err(error) => {
                return Err(RecordWriteError::Read {
                    lease,
                    message: error.to_string(),
                });
            }
        };
        let annotations = current
            .as_ref()
            .map(|l| l.annotations().clone())
            .unwrap_or_default();
        let (entries, broken) = inflight::entries_of(&annotations);
        for error in broken {
            tracing::error!(%lease, %error, "an unreadable entry in the in-flight record");
        }
        if !entries.is_empty() {
            tracing::info!(%lease, entries = entries.len(), "provisionings left in flight by a former run");
        }
        let (changes, queued) = mpsc::unbounded_channel();
        let writer = Writer {
            api,
            name: name.to_string(),
            lease: lease.clone(),
            current,
            waiting: Vec::new(),
            leaving: Vec::new(),
        };
        if available {
            tokio::spawn(writer.run(queued, shutdown));
        }
        Ok(Self {
            changes,
            entries: Mutex::new(entries),
            available: AtomicBool::new(available),
            lease,
        })
    }

    /// Whether claims are recorded here (else a finalizer on the claim protects them).
    pub fn available(&self) -> bool {
        self.available.load(Ordering::SeqCst)
    }

    /// Enters an attempt on `claim` with `class`, returning once it is written (at once when
    /// the same entry is).
    pub async fn enter(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<(), RecordWriteError> {
        if !self.available() {
            return Err(RecordWriteError::Forbidden(self.lease.clone()));
        }
        let entry = Entry::new(claim, class);
        let uid = entry.uid();
        if lock(&self.entries).get(&uid) == Some(&entry) {
            return Ok(());
        }
        let (written, answer) = oneshot::channel();
        let change = Change::Enter {
            entry: Box::new(entry.clone()),
            written,
        };
        let stopped = || RecordWriteError::Failed {
            lease: self.lease.clone(),
            message: "the record's writer stopped".to_string(),
        };
        self.changes.send(change).map_err(|_| stopped())?;
        match answer.await.map_err(|_| stopped())? {
            Ok(()) => {
                lock(&self.entries).insert(uid, entry);
                Ok(())
            }
            Err(error) => {
                if matches!(error, RecordWriteError::Forbidden(_))
                    && self.available.swap(false, Ordering::SeqCst)
                {
                    tracing::warn!(lease = %self.lease, "the in-flight record cannot be written (forbidden): claims are protected by a finalizer instead");
                }
                Err(error)
            }
        }
    }

    /// The claim with `uid` is provisioned (or nothing was created): its entry goes with the
    /// next write.
    pub fn leave(&self, uid: &str) {
        if lock(&self.entries).remove(uid).is_some() {
            let _ = self.changes.send(Change::Leave(uid.to_string()));
        }
    }

    pub fn entry(&self, uid: &str) -> Option<Entry> {
        lock(&self.entries).get(uid).cloned()
    }

    /// The UIDs of the claims in flight.
    pub fn uids(&self) -> Vec<String> {
        lock(&self.entries).keys().cloned().collect()
    }
}

/// The task that owns the Lease.
struct Writer {
    api: Api<Lease>,
    name: String,
    lease: String,
    /// The Lease as last read or written; `None` before it exists.
    current: Option<Lease>,
    /// Entries that did not fit, with their waiters.
    waiting: Vec<(Entry, oneshot::Sender<Result<(), RecordWriteError>>)>,
    /// Claims that left, not written yet (their write failed).
    leaving: Vec<String>,
}

impl Writer {
    async fn run(
        mut self,
        mut queued: mpsc::UnboundedReceiver<Change>,
        shutdown: CancellationToken,
    ) {
        loop {
            let retry = !self.waiting.is_empty() || !self.leaving.is_empty();
            let first = tokio::select! {
                () = shutdown.cancelled() => return,
                change = queued.recv() => match change {
                    Some(change) => Some(change),
                    // The provisioner is gone: nobody waits for a write any more.
                    None => return,
                },
                () = tokio::time::sleep(FULL_RETRY), if retry => None,
            };
            let mut batch: Vec<Change> = first.into_iter().collect();
            while let Ok(change) = queued.try_recv() {
                batch.push(change);
            }
            self.write(batch).await;
        }
    }

    /// One update carrying every change of the batch (and the entries waiting for room).
    async fn write(&mut self, batch: Vec<Change>) {
        let mut left = std::mem::take(&mut self.leaving);
        let mut entered = std::mem::take(&mut self.waiting);
        for change in batch {
            match change {
                Change::Enter { entry, written } => entered.push((*entry, written)),
                Change::Leave(uid) => left.push(uid),
            }
        }
        let mut added = Vec::new();
        let mut refused = Vec::new();
        for (entry, written) in entered {
            match inflight::annotation_of(&entry) {
                Ok(annotation) => added.push((annotation, entry, written)),
                Err(error) => refused.push((written, error)),
            }
        }
        for (written, error) in refused {
            let _ = written.send(Err(self.failed(&error)));
        }
        if added.is_empty() && left.is_empty() {
            return;
        }
        let annotations: Vec<(String, String)> = added.iter().map(|(a, _, _)| a.clone()).collect();
        let outcome = self.update(&left, &annotations).await;
        if outcome.result.is_err() {
            self.leaving = left;
        }
        for ((_, entry, written), fits) in added.into_iter().zip(outcome.fits) {
            match (&outcome.result, fits) {
                (Ok(()), true) => {
                    let _ = written.send(Ok(()));
                }
                (Ok(()), false) => self.waiting.push((entry, written)),
                (Err(error), _) => {
                    let _ = written.send(Err(error.clone()));
                }
            }
        }
    }

    fn failed(&self, error: &RecordError) -> RecordWriteError {
        RecordWriteError::Failed {
            lease: self.lease.clone(),
            message: error.to_string(),
        }
    }

    /// Writes the Lease with `left` removed and `added` in, re-reading it after a conflict.
    async fn update(&mut self, left: &[String], added: &[(String, String)]) -> Update {
        let mut conflicts = 0;
        loop {
            let current = self
                .current
                .as_ref()
                .map(|l| l.annotations().clone())
                .unwrap_or_default();
            let (annotations, waiting) = inflight::apply(&current, left, added);
            let fits = added
                .iter()
                .map(|(key, _)| {
                    !waiting
                        .iter()
                        .any(|uid| key.strip_prefix(inflight::ENTRY_PREFIX) == Some(uid))
                })
                .collect();
            let result = match &self.current {
                Some(lease) => {
                    let mut lease = lease.clone();
                    lease.metadata.annotations = Some(annotations);
                    self.api
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await
                }
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            annotations: Some(annotations),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
            };
            let error = match result {
                Ok(written) => {
                    self.current = Some(written);
                    return Update {
                        result: Ok(()),
                        fits,
                    };
                }
                Err(error) => error,
            };
            let code = match &error {
                kube::Error::Api(status) => status.code,
                _ => 0,
            };
            if code == 403 {
                return Update::failed(RecordWriteError::Forbidden(self.lease.clone()), added);
            }
            if code == 409 && conflicts < CONFLICT_RETRIES {
                conflicts += 1;
                match self.api.get_opt(&self.name).await {
                    Ok(fresh) => {
                        self.current = fresh;
                        continue;
                    }
                    Err(error) => return self.error(error, added),
                }
            }
            return self.error(error, added);
        }
    }

    fn error(&self, error: kube::Error, added: &[(String, String)]) -> Update {
        tracing::warn!(lease = %self.lease, %error, "writing the in-flight record failed");
        Update::failed(
            RecordWriteError::Failed {
                lease: self.lease.clone(),
                message: error.to_string(),
            },
            added,
        )
    }
}

struct Update {
    result: Result<(), RecordWriteError>,
    /// Per added entry: whether it fitted.
    fits: Vec<bool>,
}

impl Update {
    fn failed(error: RecordWriteError, added: &[(String, String)]) -> Self {
        Self {
            result: Err(error),
            fits: vec![true; added.len()],
        }
    }
}
