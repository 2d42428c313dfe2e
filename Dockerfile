# syntax=docker/dockerfile:1
# One small image with every binary the chart deploys: csi-provisioner, csi-attacher,
# csi-resizer, csi-snapshotter, snapshot-controller, csi-health-monitor, csi-snapshot-metadata,
# csi-node-driver-registrar, livenessprobe, podmon, csi-inventory, the reference driver
# csi-hostpath, and COSI's cosi-controller, cosi-provisioner and sample driver cosi-s3 (kube-sim
# is a test tool and stays out). Each container of the chart picks its binary with `command:`.
#
# Build: make docker-image   (docker build -t csi-suite:<appVersion> .), for the building
# machine's architecture: nothing here names one. `make image` writes the same content for
# amd64 and arm64 offline, without this file (an OCI image index; docs/development.md).
#
# Base images by digest, so a rebuild gets the bytes it was tested with rather than whatever a
# moving tag names that day; bump a tag and its digest together. rust:1-bookworm is the image
# Docker's official-images bot recorded for that tag on 2026-08-25 (Rust 1.98.0; the index
# digest in docker-library/repo-info, repos/rust/remote/1-bookworm.md). No digest of
# gcr.io/distroless/cc-debian12:nonroot could be checked where this was written (no registry
# reachable): pass one (`crane digest gcr.io/distroless/cc-debian12:nonroot`) as
# --build-arg DISTROLESS_DIGEST=sha256:...; left empty, the tag alone is used.
ARG DISTROLESS_DIGEST=""

FROM rust:1-bookworm@sha256:e536cf316987faedfe8ae120f83b70c7df0068fdb4fc9efcce55c71a625001d5 AS build
WORKDIR /src
COPY . .
# protox compiles the protos in-process: the build needs no protoc. The cache mounts keep the
# registry and target directory between builds. The binaries link glibc statically into
# position-independent executables with packed relative relocations, as `make build` does (see
# the Makefile: about 1.7 MiB less resident per process); crt-static needs an explicit --target.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(rustc -vV | sed -n 's/^host: //p')" \
 && RUSTFLAGS="-C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs" \
    cargo build --release --locked --target "$triple" \
      -p csi-provisioner -p csi-attacher -p csi-resizer -p csi-snapshotter -p csi-health-monitor -p csi-snapshot-metadata -p csi-node-driver-registrar -p podmon \
      -p csi-inventory -p csi-hostpath -p cosi -p cosi-s3 \
 && mkdir -p /out/bin \
 && for binary in csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller csi-health-monitor csi-snapshot-metadata csi-node-driver-registrar livenessprobe podmon csi-inventory csi-hostpath cosi-controller cosi-provisioner cosi-s3; do \
      cp "target/$triple/release/$binary" /out/bin/; \
    done
# csi-hostpath attaches loop devices with losetup (Debian's mount package) and formats ext4
# volumes with mke2fs (e2fsprogs); they and their libraries beyond glibc come along into the
# distroless image.
RUN apt-get update && apt-get install -y --no-install-recommends e2fsprogs \
 && multiarch="$(gcc -print-multiarch)" \
 && mkdir -p "/out/lib/$multiarch" \
 && cp /usr/sbin/losetup /out/bin/ \
 && cp /usr/sbin/mke2fs /out/bin/ \
 && ldd /usr/sbin/losetup /usr/sbin/mke2fs | awk '$3 ~ /^\// && $1 !~ /^libc\.so/ {print $3}' | sort -u \
  | xargs -I{} cp -L {} "/out/lib/$multiarch/"

# glibc and libgcc only (for losetup and mke2fs; the suite's binaries are static), no shell;
# runs as 65532 (nonroot) unless a container asks for root,
# as the chart does for the node driver (privileged), the registrar and node podmon.
FROM gcr.io/distroless/cc-debian12:nonroot${DISTROLESS_DIGEST:+@${DISTROLESS_DIGEST}}
COPY --from=build /out/lib/ /usr/lib/
COPY --from=build /out/bin/ /usr/local/bin/
USER 65532:65532
