# One runtime image with every binary of the workspace (csi-provisioner, csi-attacher,
# csi-node-driver-registrar, livenessprobe, podmon, csi-hostpath, kube-sim). Each Deployment or
# DaemonSet container picks its binary with `command:`.
#
# Build: docker build -t csi-suite:dev .

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# protox compiles the protos in-process: the build needs no protoc.
RUN cargo build --workspace --release --locked --bins \
 && mkdir /out \
 && find target/release -maxdepth 1 -type f -executable -exec cp {} /out/ \;

# Debian slim rather than distroless: csi-hostpath attaches block volumes with util-linux's
# losetup. The sidecars need nothing beyond libc.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
