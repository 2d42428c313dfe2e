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

## demo (needs root: real bind mounts; exits non-zero if any step does not behave):
## 1. the reference driver on two simulated nodes: provision, publish, snapshot, restore, fence a
##    writing node, move the volume, clean up;
## 2. the cluster story: kube-sim + cluster roles + the driver on three nodes: bind, schedule,
##    attach, mount, write, partition a node and recover, tear down.
demo:
	$(CARGO) run --release --locked -p csi-hostpath --example demo
	$(CARGO) run --release --locked -p csi-suite-scenarios --example cluster_demo

## bench: driver throughput and latency with 1, 8 and 32 clients, kube-sim's API server
## throughput, csi-provisioner with 1000 claims, csi-attacher with 1000 VolumeAttachments,
## podmon's failover time (1 and 10 pods per node, 20 runs), the registrar's and
## livenessprobe's footprint (the release binaries as their own
## processes); each rewrites its own sections of BENCHMARKS.md.
bench:
	$(CARGO) bench --locked -p csi-hostpath --bench driver
	$(CARGO) bench --locked -p kube-sim --bench apiserver
	$(CARGO) build --release --locked -p csi-provisioner -p csi-attacher -p csi-node-driver-registrar
	$(CARGO) bench --locked -p csi-suite-scenarios --bench provisioning
	$(CARGO) bench --locked -p csi-suite-scenarios --bench attaching
	$(CARGO) bench --locked -p csi-suite-scenarios --bench failover
	$(CARGO) bench --locked -p csi-node-driver-registrar --bench node_sidecars
