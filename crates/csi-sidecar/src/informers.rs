//! Shared caches (kube-runtime reflectors) for controllers: one wake-up signal for all of a
//! controller's caches, and one wait for their initial lists. The sidecars and kube-sim's
//! cluster roles use it alike.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Reflector-backed caches of one controller: every change in any of them wakes the
/// controller, and [`Informers::synced`] waits for all of their initial lists.
pub struct Informers {
    client: Client,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    synced: Vec<futures::future::BoxFuture<'static, bool>>,
}

impl Informers {
    pub fn new(client: &Client, shutdown: &CancellationToken) -> Self {
        Self {
            client: client.clone(),
            wake: Arc::new(Notify::new()),
            shutdown: shutdown.clone(),
            synced: Vec::new(),
        }
    }

    /// A cache of every object of a cluster-wide or all-namespaces kind.
    pub fn all<K>(&mut self) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.watch(Api::all(self.client.clone()), watcher::Config::default())
    }

    /// A cache of what `api` and `config` select.
    pub fn watch<K>(&mut self, api: Api<K>, config: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        let wake = self.wake.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    event = stream.next() => match event {
                        Some(Ok(_)) => wake.notify_one(),
                        Some(Err(error)) => tracing::debug!(%error, "watch error, retrying"),
                        None => return,
                    },
                }
            }
        });
        let ready = reader.clone();
        self.synced.push(Box::pin(
            async move { ready.wait_until_ready().await.is_ok() },
        ));
        reader
    }

    /// The wake-up signal of these caches, for a controller that does not wait for
    /// [`Informers::synced`] (one that must act on persisted state while the API is away).
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Waits until every cache has its initial list (or shutdown); returns the role's wake-up
    /// signal, or `None` on shutdown.
    pub async fn synced(self) -> Option<Arc<Notify>> {
        let all = futures::future::join_all(self.synced);
        tokio::select! {
            () = self.shutdown.cancelled() => None,
            results = all => results.into_iter().all(|ok| ok).then_some(self.wake),
        }
    }
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers")
            .field("caches", &self.synced.len())
            .finish_non_exhaustive()
    }
}
