use std::ffi::OsString;

use clap::{CommandFactory, Parser};

use super::*;

/// A binary with the common flags and a CSI endpoint.
#[derive(Parser, Debug)]
struct CsiBinary {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    csi: CsiArgs,
}

#[test]
fn single_dash_rewrite_leaves_short_flags_and_values_alone() {
    let command = CsiBinary::command();
    let argv = [
        "bin",
        "-v=5",
        "-timeout=3s",
        "--worker-threads",
        "-1",
        "-unknown",
        "--",
        "-timeout",
    ];
    let out = normalize_single_dash_long_flags(argv.iter().map(OsString::from), &command);
    let out: Vec<_> = out.iter().map(|s| s.to_str().unwrap()).collect();
    assert_eq!(
        out,
        [
            "bin",
            "-v=5",
            "--timeout=3s",
            "--worker-threads",
            "-1",
            "-unknown",
            "--",
            "-timeout"
        ]
    );
}
