//! tracing setup from the component-base logging flags: `-v` picks the level, and
//! `--logging-format` picks text or JSON. `RUST_LOG`, when set, overrides `-v`.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;

use crate::flags::CommonArgs;

/// The level `-v` selects: klog's 0..5 onto error..trace; unset means info, which is what klog
/// prints by default.
pub fn level_for_verbosity(verbosity: Option<u8>) -> LevelFilter {
    match verbosity {
        None | Some(2) => LevelFilter::INFO,
        Some(0) => LevelFilter::ERROR,
        Some(1) => LevelFilter::WARN,
        Some(3 | 4) => LevelFilter::DEBUG,
        Some(_) => LevelFilter::TRACE,
    }
}

/// The filter directives: our level for everything, but the HTTP/2 and TLS stacks stay at warn
/// (at trace they log every frame, which no `--v=5` user wants).
pub fn filter_directives(verbosity: Option<u8>) -> String {
    let level = level_for_verbosity(verbosity);
    let quiet = if level > LevelFilter::WARN {
        ",h2=warn,hyper=warn,hyper_util=warn,rustls=warn,tower=warn,tonic=info"
    } else {
        ""
    };
    format!("{level}{quiet}")
}

/// Whether text logs carry colour codes: only on a terminal, and not when `NO_COLOR` is set
/// (no-color.org). A container's stderr is a pipe or file, where escape codes would end up
/// verbatim in `kubectl logs` and log collectors, which klog never writes.
pub fn coloured(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(args: &CommonArgs) {
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| EnvFilter::new(filter_directives(args.verbosity)));
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = coloured(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // A second init (tests, embedded use) keeps the first subscriber.
    let _ = if args.logging_format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    if let Some(vmodule) = &args.vmodule {
        tracing::warn!(%vmodule, "--vmodule names Go source files and has no effect here; use -v or RUST_LOG");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_onto_levels() {
        let table = [
            (None, LevelFilter::INFO),
            (Some(0), LevelFilter::ERROR),
            (Some(1), LevelFilter::WARN),
            (Some(2), LevelFilter::INFO),
            (Some(3), LevelFilter::DEBUG),
            (Some(4), LevelFilter::DEBUG),
            (Some(5), LevelFilter::TRACE),
            (Some(10), LevelFilter::TRACE),
        ];
        for (verbosity, want) in table {
            assert_eq!(level_for_verbosity(verbosity), want, "{verbosity:?}");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let table = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (false, None, false),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in table {
            assert_eq!(
                coloured(terminal, no_color),
                want,
                "{terminal} {no_color:?}"
            );
        }
    }

    #[test]
    fn noisy_transports_stay_quiet_at_high_verbosity() {
        assert_eq!(filter_directives(Some(0)), "error");
        let trace = filter_directives(Some(5));
        assert!(trace.starts_with("trace,"));
        assert!(trace.contains("h2=warn"));
        // Every directive parses.
        EnvFilter::try_new(trace).unwrap();
    }
}
