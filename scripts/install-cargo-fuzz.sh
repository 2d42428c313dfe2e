#!/usr/bin/env bash
# Installs cargo-fuzz (from crates.io, built with its own lock file) into .tools/cargo-fuzz,
# once: `make fuzz-build` and `make fuzz` run it. The version is pinned so every machine
# builds the fuzz targets the same way.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.13.2
ROOT="$PWD/.tools/cargo-fuzz"
STAMP="$ROOT/.cargo-fuzz-$VERSION"
[ -x "$ROOT/bin/cargo-fuzz" ] && [ -f "$STAMP" ] && exit 0

CARGO="${CARGO:-cargo}"
command -v "$CARGO" >/dev/null 2>&1 || { echo "install-cargo-fuzz: $CARGO is required" >&2; exit 1; }
rm -rf "$ROOT"
# Its own target directory, removed afterwards: the workspace's target/ keeps only its builds.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
CARGO_TARGET_DIR="$work" "$CARGO" install cargo-fuzz --locked --version "$VERSION" --root "$ROOT" --quiet
touch "$STAMP"
echo "installed $ROOT/bin/cargo-fuzz (cargo-fuzz $VERSION)"
