//! One cancellation token for every task: SIGTERM or SIGINT cancels it; a second signal exits
//! at once. Tasks get [`GRACE_PERIOD`] to stop after cancellation.

use std::future::Future;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
pub use tokio_util::sync::CancellationToken;

/// How long tasks may take to stop after the shutdown signal.
pub const GRACE_PERIOD: Duration = Duration::from_secs(5);

/// Returns a token cancelled on the first SIGTERM/SIGINT. A second signal exits the process
/// with status 1 (the operator insisted). Must be called inside a Tokio runtime.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal, exiting now");
        std::process::exit(1);
    });
    Ok(token)
}

/// Outcome of [`run_until_cancelled`].
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped<T> {
    /// The task finished on its own.
    Finished(T),
    /// Shutdown was requested and the task finished within the grace period.
    Drained(T),
    /// Shutdown was requested and the task did not finish within the grace period.
    TimedOut,
}

/// Runs `task` (which must watch `token` itself) until it ends; once `token` is cancelled the
/// task gets `grace` to finish before it is dropped.
pub async fn run_until_cancelled<T>(
    token: &CancellationToken,
    grace: Duration,
    task: impl Future<Output = T>,
) -> Stopped<T> {
    tokio::pin!(task);
    tokio::select! {
        output = &mut task => return Stopped::Finished(output),
        _ = token.cancelled() => {}
    }
    match tokio::time::timeout(grace, task).await {
        Ok(output) => Stopped::Drained(output),
        Err(_) => {
            tracing::warn!(?grace, "task did not stop within the grace period");
            Stopped::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn finished_task_returns_its_output() {
        let token = CancellationToken::new();
        let out = run_until_cancelled(&token, GRACE_PERIOD, async { 7 }).await;
        assert_eq!(out, Stopped::Finished(7));
    }

    #[tokio::test(start_paused = true)]
    async fn cooperative_task_drains_after_cancel() {
        let token = CancellationToken::new();
        let child = token.child_token();
        let task = async move {
            child.cancelled().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            "drained"
        };
        token.cancel();
        let out = run_until_cancelled(&token, GRACE_PERIOD, task).await;
        assert_eq!(out, Stopped::Drained("drained"));
    }

    #[tokio::test(start_paused = true)]
    async fn stuck_task_is_abandoned_after_grace() {
        let token = CancellationToken::new();
        token.cancel();
        let out = run_until_cancelled(&token, GRACE_PERIOD, std::future::pending::<()>()).await;
        assert_eq!(out, Stopped::TimedOut);
    }
}
