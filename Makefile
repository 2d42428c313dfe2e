# The two set-up commands on a fresh machine are `make demo` and `make test`; CI runs
# `bash .ci/run`, which is `make test`.

CARGO ?= cargo
# No protoc anywhere: point any accidental use at a path that does not exist, so it fails loudly.
export PROTOC := /nonexistent/protoc-is-never-used

.PHONY: test fmt-check lint unit build demo bench

## test: everything CI runs: formatting, lints (warnings are errors), all tests.
test: fmt-check lint unit

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked

## build: release binaries of every component into target/release.
build:
	$(CARGO) build --workspace --release --locked --bins

## demo: the suite on the embedded simulated cluster.
demo:
	@echo "make demo arrives with the reference driver (csi-hostpath) and kube-sim; not built yet." >&2
	@exit 1

## bench: performance tables (cargo bench).
bench:
	$(CARGO) bench --workspace --locked
