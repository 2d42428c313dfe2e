# The two set-up commands on a fresh machine are `make demo` and `make test`; CI runs
# `bash .ci/run`: `make test`, then `make test-real` and `make test-node` when ../shared/k8s is
# present.

CARGO ?= cargo
# No protoc anywhere: point any accidental use at a path that does not exist, so it fails loudly.
export PROTOC := /nonexistent/protoc-is-never-used

.PHONY: test test-real test-node sanity fmt-check lint layers unit strace chart manifests crds build cross image docker-image demo bench

HELM := $(CURDIR)/.tools/bin/helm
# The chart tests (tests/tests/scenarios/chart.rs) render the chart with this helm.
export HELM
# cosi-s3's tests (tests/tests/scenarios/cosi_s3.rs) run it against this S3 and IAM server.
MOTO_SERVER := $(CURDIR)/.tools/moto/bin/moto_server
export MOTO_SERVER
CHART := charts/csi-suite
IMAGE ?= csi-suite:$(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' $(CHART)/Chart.yaml)

## test: everything CI runs: formatting, lints (warnings are errors), the layers, the chart,
## all tests.
test: fmt-check lint layers chart unit

## test-real: the scenario suite and kube-sim's API tests (compare mode) on a real control plane:
## the cluster of KUBECONFIG, or ../shared/k8s/control-plane of each of K8S_VERSIONS (default
## "1.28 1.19", side by side) brought up and down around the run.
test-real: $(HELM) $(MOTO_SERVER)
	CARGO="$(CARGO)" scripts/test-real.sh

## test-node: the chart on a real kubelet (../shared/k8s/node of each of K8S_VERSIONS in turn, or
## the cluster of KUBECONFIG with the image loaded): image built offline, registration, a smoke
## volume, a COSI bucket and its credentials, fencing a real writer.
test-node: $(HELM) $(MOTO_SERVER) build
	CARGO="$(CARGO)" scripts/test-node.sh

## sanity: csi-sanity (the CSI conformance suite) against the reference driver, mount and block
## volumes (needs root; the binary from ../shared/k8s or CSI_SANITY; scripts/sanity.sh says more).
sanity: build
	CARGO="$(CARGO)" scripts/sanity.sh

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## layers: the direction of dependencies (docs/development.md, "Crate map"): the drivers and the
## node sidecars build without the Kubernetes client crates, no component depends on another, and
## no binary's crate depends on kube-sim-harness (the test helpers; dev-dependencies only).
COMPONENTS := csi-provisioner csi-attacher csi-resizer csi-snapshotter csi-node-driver-registrar \
  podmon cosi csi-inventory csi-hostpath cosi-s3 csi-health-monitor csi-snapshot-metadata
layers:
	@for package in csi-hostpath csi-node-driver-registrar cosi-s3; do \
	  if $(CARGO) tree --locked -p $$package -e normal --prefix none | grep -E '^(kube|k8s-openapi|csi-sidecar) v'; then \
	    echo "make layers: $$package depends on the Kubernetes client crates" >&2; exit 1; fi; \
	done
	@for package in $(COMPONENTS); do \
	  others=$$(echo $(COMPONENTS) | tr ' ' '\n' | grep -vx $$package | paste -sd '|'); \
	  if $(CARGO) tree --locked -p $$package -e normal --prefix none --depth 1 | tail -n +2 | grep -E "^($$others) v"; then \
	    echo "make layers: $$package depends on another component" >&2; exit 1; fi; \
	done
	@for package in $(COMPONENTS) kube-sim; do \
	  if $(CARGO) tree --locked -p $$package -e normal --prefix none | grep -E '^kube-sim-harness v'; then \
	    echo "make layers: $$package depends on kube-sim-harness (test helpers, dev-dependency only)" >&2; exit 1; fi; \
	done

unit: $(HELM) $(MOTO_SERVER) strace
	$(CARGO) test --workspace --locked

# csi-hostpath's crash-point tests kill the driver at chosen system calls through strace.
strace:
	@command -v strace >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq strace; }

$(HELM):
	scripts/install-tools.sh

$(MOTO_SERVER):
	scripts/install-moto.sh

# The two committed renderings: default values, and a vendor's own driver.
render = $(HELM) template csi-suite $(CHART) --namespace csi-suite
MANIFESTS = manifests/csi-suite.yaml manifests/csi-suite-external-driver.yaml

## chart: helm lint (strict), and the committed manifests/ must be what the chart renders.
chart: $(HELM)
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --values $(CHART)/examples/external-driver.yaml
	@rm -rf target/manifests && mkdir -p target/manifests
	@$(render) > target/manifests/csi-suite.yaml
	@$(render) --values $(CHART)/examples/external-driver.yaml > target/manifests/csi-suite-external-driver.yaml
	@for f in $(MANIFESTS); do \
	  diff -u $$f target/$$f || { echo "$$f is stale: run 'make manifests' and commit it" >&2; exit 1; }; \
	done

## manifests: re-render manifests/ from the chart.
manifests: $(HELM)
	@mkdir -p manifests
	$(render) > manifests/csi-suite.yaml
	$(render) --values $(CHART)/examples/external-driver.yaml > manifests/csi-suite-external-driver.yaml

## crds: rewrite manifests/crds/ (and the chart's copy) from csi-kinds' Rust types, with
## csi-snapshotter's, cosi's and csi-snapshot-metadata's binaries (tests check they are current).
crds:
	$(CARGO) run -q -p csi-snapshotter --bin snapshot-crds manifests/crds
	$(CARGO) run -q -p csi-snapshotter --bin snapshot-crds $(CHART)/files/crds
	$(CARGO) run -q -p cosi --bin cosi-crds manifests/crds
	$(CARGO) run -q -p cosi --bin cosi-crds $(CHART)/files/cosi-crds
	$(CARGO) run -q -p csi-snapshot-metadata --bin snapshot-metadata-crds manifests/crds

## build: release binaries of every component into target/release: the image's (see the
## Dockerfile) and kube-sim, which test-node runs beside them. make sanity checks this
## csi-hostpath, so CI builds the release binaries once.
## They link glibc statically, as upstream's Go sidecars are static: nothing of libc, libm,
## libgcc_s or the dynamic loader is mapped at run time beyond what a binary calls, and with
## packed relative relocations (RELR, binutils >= 2.38, glibc >= 2.36) the executable stays
## position-independent without a 450 KiB relocation table: about 1.7 MiB less resident per
## process (BENCHMARKS.md). crt-static needs an explicit --target (a proc macro cannot be built
## with it), so cargo writes to target/$(HOST_TRIPLE)/release; the binaries are copied to
## target/release, where sanity and test-node look for them (bench reads the triple's directory:
## a cargo bench rebuilds its own package's binaries, dynamically linked, into target/release).
## make build fails if a binary came out dynamically linked (a program interpreter in its headers),
## or if readelf cannot read one (a missing readelf must not pass every binary).
IMAGE_PACKAGES := csi-provisioner csi-attacher csi-resizer csi-snapshotter csi-health-monitor \
  csi-snapshot-metadata csi-node-driver-registrar podmon csi-inventory csi-hostpath cosi cosi-s3
RELEASE_PACKAGES := $(IMAGE_PACKAGES) kube-sim
## RELEASE_PROFILE=ci-release (what .ci/run sets) builds them with Cargo.toml's CI profile
## instead: the same code generation without fat LTO.
HOST_TRIPLE = $(shell rustc -vV | sed -n 's/^host: //p')
RELEASE_RUSTFLAGS := -C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs
RELEASE_PROFILE ?= release
# Where cargo writes (CARGO_TARGET_DIR when set).
CARGO_OUT = $(or $(CARGO_TARGET_DIR),target)
# release-binaries TRIPLE DESTINATION: checks that every binary cargo built for TRIPLE is static
# and copies it to DESTINATION.
define release-binaries
mkdir -p $(2)
@for binary in $$(find $(CARGO_OUT)/$(1)/$(RELEASE_PROFILE) -maxdepth 1 -type f -perm -u+x); do \
  headers=$$(readelf -lW $$binary) || { echo "make $@: readelf failed on $$binary" >&2; exit 1; }; \
  case "$$headers" in *'program interpreter'*) \
    echo "make $@: $$binary is dynamically linked; RELEASE_RUSTFLAGS did not apply" >&2; \
    exit 1;; \
  esac; \
  cp --remove-destination -p $$binary $(2)/; \
done
endef
build:
	RUSTFLAGS="$(RELEASE_RUSTFLAGS)" $(CARGO) build --profile $(RELEASE_PROFILE) --locked --target $(HOST_TRIPLE) \
	  $(addprefix -p ,$(RELEASE_PACKAGES)) --bins
	$(call release-binaries,$(HOST_TRIPLE),target/release)

## cross: the image's release binaries for arm64 (aarch64-unknown-linux-gnu) into
## target/release-arm64, linked statically as make build links them, with Debian's Rust
## (rustc-web, /usr/bin/rustc) and its arm64 standard library, and Debian's cross linker:
## scripts/install-cross.sh installs them from Debian's packages (rustup's targets come from a
## host CI cannot reach). rustc's aarch64-unknown-linux-gnu has no static-pie, so these are
## static executables at a fixed address (as Go's are), which need no relocations at all.
## About 14 min on 2 cores with RELEASE_PROFILE=ci-release, from nothing (docs/development.md).
CROSS_TRIPLE := aarch64-unknown-linux-gnu
CROSS_RUSTC ?= /usr/bin/rustc
ARM64_ROOT := $(CURDIR)/.tools/arm64/root
cross:
	scripts/install-cross.sh
	RUSTC=$(CROSS_RUSTC) CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	  RUSTFLAGS="$(RELEASE_RUSTFLAGS)" $(CARGO) build --profile $(RELEASE_PROFILE) --locked --target $(CROSS_TRIPLE) \
	  $(addprefix -p ,$(IMAGE_PACKAGES)) --bins
	$(call release-binaries,$(CROSS_TRIPLE),target/release-arm64)

## image: the suite's image $(IMAGE) for amd64 and arm64, built offline (no container engine, no
## base image: tests/src/image.rs) from make build's and make cross's binaries, as an OCI image
## layout archive whose index holds both platforms: $(IMAGE_ARCHIVE). `docker load -i` (Docker
## >= 25), `ctr images import` and `skopeo copy oci-archive:...` read it.
IMAGE_ARCHIVE := target/image/csi-suite.oci.tar
image: build cross
	@mkdir -p $(dir $(IMAGE_ARCHIVE))
	$(CARGO) run --locked -q -p csi-suite-scenarios --example node_image -- --index $(IMAGE) $(IMAGE_ARCHIVE) \
	  target/release target/release-arm64 $(ARM64_ROOT)

## docker-image: the image from the Dockerfile, for the building machine's architecture,
## tagged $(IMAGE) (needs a registry for its base images).
docker-image:
	docker build -t $(IMAGE) .

## demo (needs root: real bind mounts; exits non-zero if any step does not behave):
## 1. the reference driver on two simulated nodes: provision, publish, snapshot, restore, fence a
##    writing node, move the volume, clean up;
## 2. the cluster story: kube-sim + cluster roles + the driver on three nodes: bind, schedule,
##    attach, mount, write, partition a node and recover, tear down.
## Both stories are built with the workspace's other examples in the dev profile: the very build
## `make test` makes too, so whichever of the two runs first, the other compiles almost nothing.
## (Optimised builds took minutes more; the stories wait on mounts and the API, not the CPU.)
## The first story is built alone first (with kube-sim selected, so shared crates get the
## workspace's features and nothing compiles twice), so it starts before the rest is built.
demo: $(MOTO_SERVER)
	@[ -x target/debug/examples/cluster_demo ] || echo "make demo: building (first run only: about 2 min on 2 cores to the first story, 1 more to the second; make test reuses it)…"
	$(CARGO) build --locked -p csi-hostpath -p kube-sim --example demo
	target/debug/examples/demo
	$(CARGO) build --locked --workspace --examples
	target/debug/examples/cluster_demo

## bench: driver throughput and latency with 1, 8 and 32 clients, kube-sim's API server
## throughput, csi-provisioner with 1000 claims, csi-attacher with 1000 VolumeAttachments,
## csi-snapshotter and snapshot-controller with 1000 VolumeSnapshots and with 100 volume group
## snapshots of 3 claims each, csi-health-monitor with 100 volumes, csi-resizer with 1000
## expansions, podmon's failover time (1 and 10 pods per node, 20 runs), COSI's controller and
## provisioner sidecar with bucket claims and accesses, the registrar's and livenessprobe's
## footprint (the release binaries as their own processes); each rewrites its own sections of
## BENCHMARKS.md.
bench: RELEASE_PROFILE = release
bench: export CSI_SUITE_RELEASE_DIR = $(CURDIR)/target/$(HOST_TRIPLE)/release
bench: $(MOTO_SERVER) build
	$(CARGO) bench --locked -p csi-hostpath --bench driver
	$(CARGO) bench --locked -p kube-sim --bench apiserver
	$(CARGO) bench --locked -p csi-suite-scenarios --bench provisioning
	$(CARGO) bench --locked -p csi-suite-scenarios --bench attaching
	$(CARGO) bench --locked -p csi-suite-scenarios --bench snapshotting
	$(CARGO) bench --locked -p csi-suite-scenarios --bench group_snapshotting
	$(CARGO) bench --locked -p csi-suite-scenarios --bench health_monitoring
	$(CARGO) bench --locked -p csi-suite-scenarios --bench expanding
	$(CARGO) bench --locked -p csi-suite-scenarios --bench failover
	$(CARGO) bench --locked -p csi-suite-scenarios --bench object_storage
	$(CARGO) bench --locked -p csi-node-driver-registrar --bench node_sidecars

## fuzz-build: every fuzz target (fuzz/, its own workspace) builds, as CI checks: cargo-fuzz
## (scripts/install-cargo-fuzz.sh, into .tools) on the nightly toolchain, in the dev profile
## without the address sanitizer: a quarter less CPU than with it, and the optimized build
## (one codegen unit, what `make fuzz` runs) four times as much.
## fuzz: each target for FUZZ_SECONDS (default 60) in turn, optimized, from its committed corpus
## (fuzz/corpus/<target>); what it adds goes to fuzz/target/corpus/<target>, a crash to
## fuzz/artifacts/<target> (docs/testing.md, "Fuzzing").
.PHONY: fuzz-build fuzz
CARGO_FUZZ := $(CURDIR)/.tools/cargo-fuzz/bin/cargo-fuzz
FUZZ_TARGETS := grpc_authority tar_extract journal quantity mountinfo secret_templates strategic_merge
FUZZ_SECONDS ?= 60
# cargo-fuzz needs nightly (sanitizers, coverage instrumentation). Without it the fuzz targets
# are skipped, but not under CI=true: in CI nothing passes unrun.
fuzz-setup = if ! $(CARGO) +nightly --version >/dev/null 2>&1; then \
	  echo "make $@: needs the nightly toolchain: rustup toolchain install nightly" >&2; \
	  [ "$$CI" = true ] && exit 1; echo "make $@: skipped" >&2; exit 0; \
	fi; cd fuzz && export PATH="$(dir $(CARGO_FUZZ)):$$PATH" &&

fuzz-build: $(CARGO_FUZZ)
	@$(fuzz-setup) $(CARGO) +nightly fuzz build --dev --sanitizer none

fuzz: $(CARGO_FUZZ)
	@$(fuzz-setup) $(CARGO) +nightly fuzz build && for target in $(FUZZ_TARGETS); do \
	  mkdir -p target/corpus/$$target && \
	  $(CARGO) +nightly fuzz run $$target target/corpus/$$target corpus/$$target -- \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 || exit 1; \
	done

$(CARGO_FUZZ):
	scripts/install-cargo-fuzz.sh
