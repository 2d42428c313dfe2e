//! Log events a scenario can check: a warning that must name its cause, or how often a
//! controller loop ran (its per-pass trace event).

use std::fmt::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

/// The events of this thread that a filter selects, as one line each (`LEVEL target: message
/// field=value ...`), until dropped.
#[derive(Debug)]
pub struct CapturedLogs {
    lines: Arc<Mutex<Vec<String>>>,
    _guard: DefaultGuard,
}

/// Captures the events `directives` selects (`EnvFilter` syntax, e.g.
/// `csi_provisioner::controller=trace`) on this thread, logging everything else as
/// [`crate::init_logging`] does. With `#[tokio::test]`'s current-thread runtime, the thread
/// runs every task the scenario spawns: the components it runs in this process too.
pub fn capture(directives: &str) -> CapturedLogs {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let recorder = Recorder {
        lines: lines.clone(),
    }
    .with_filter(tracing_subscriber::EnvFilter::new(directives));
    let output = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(crate::log_filter("info"));
    let subscriber = tracing_subscriber::registry().with(output).with(recorder);
    CapturedLogs {
        lines,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl CapturedLogs {
    /// Every captured line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many captured lines contain `text`.
    pub fn count(&self, text: &str) -> usize {
        self.lines()
            .iter()
            .filter(|line| line.contains(text))
            .count()
    }
}

struct Recorder {
    lines: Arc<Mutex<Vec<String>>>,
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let metadata = event.metadata();
        let mut line = Line(format!("{} {}:", metadata.level(), metadata.target()));
        event.record(&mut line);
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.0);
    }
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}
