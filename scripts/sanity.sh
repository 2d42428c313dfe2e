#!/usr/bin/env bash
# `make sanity`: the CSI conformance suite (csi-sanity, kubernetes-csi/csi-test) against the
# reference driver, one instance serving controller and node (`--mode=both`, attach enabled, at
# most 8 volumes per node so the attach-limit spec runs), once with mount volumes and once with
# block volumes. Needs root (the node side mounts) and the csi-sanity
# binary: $CSI_SANITY, or ../shared/k8s/csi-sanity.xz unpacked into target/tools. Without
# either it says how to get one and exits 2 (under CI=true: 1, nothing passes unrun).
#
# CSI v1.13: the csi-sanity of ../shared/k8s is csi-test v5.5.0 (spec v1.12), whose
# ControllerGetCapabilities and NodeGetCapabilities specs fail on any capability value they do
# not know, the v1.13 health ones included. So the mount run, against the default driver
# (--volume-health=v1.13), skips exactly those two specs (the driver's own tests assert the
# v1.13 sets), and the block run serves the v1.12 generation (--volume-health=v1.12) with no
# skip, so both capability specs still run against the driver.
set -euo pipefail
cd "$(dirname "$0")/.."

fail_or_skip() {
  echo "sanity: $1" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 2
}

sanity="${CSI_SANITY:-}"
if [ -z "$sanity" ]; then
  packed=../shared/k8s/csi-sanity.xz
  sanity="$PWD/target/tools/csi-sanity"
  if [ ! -x "$sanity" ]; then
    [ -f "$packed" ] || fail_or_skip "no csi-sanity: set CSI_SANITY=/path/to/csi-sanity (build it from kubernetes-csi/csi-test: 'go build ./cmd/csi-sanity'), or put csi-sanity.xz in ../shared/k8s"
    command -v xz >/dev/null 2>&1 || fail_or_skip "xz is needed to unpack $packed"
    mkdir -p target/tools
    xz -dc "$packed" > "$sanity.tmp" && chmod +x "$sanity.tmp" && mv "$sanity.tmp" "$sanity"
  fi
fi
[ "$(id -u)" = 0 ] || fail_or_skip "needs root: the driver's node side mounts volumes"

# The release driver users run, built by `make build` (make sanity does that first).
driver="${CSI_HOSTPATH:-$PWD/target/release/csi-hostpath}"
[ -x "$driver" ] || fail_or_skip "no driver at $driver: run 'make build' (or set CSI_HOSTPATH)"

work="$(mktemp -d /tmp/csi-sanity-XXXXXX)"
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; fi
  # Anything csi-sanity or the driver left mounted under the work directory.
  { grep -o " $work[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" || true; done
  rm -rf "$work"
}
trap cleanup EXIT

failed=0
v113_skip='(ControllerGetCapabilities|NodeGetCapabilities) should return appropriate capabilities'
for run_spec in mount:v1.13 block:v1.12; do
  access="${run_spec%%:*}" health="${run_spec#*:}"
  skip=()
  if [ "$health" = v1.13 ]; then
    skip=(--ginkgo.skip="$v113_skip")
    echo "== skipping 2 specs: csi-sanity v5.5.0 predates CSI v1.13 and fails on its health capabilities ($v113_skip)"
  fi
  run="$work/$access"
  mkdir -p "$run"
  "$driver" --mode=both --nodeid=sanity-node --endpoint="unix://$run/csi.sock" \
    --statedir="$run/state" --capacity=100Gi --enable-attach --max-volumes-per-node=8 \
    --allowed-path-roots="$run" --volume-health="$health" \
    >"$run/driver.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -S "$run/csi.sock" ] && break; sleep 0.1; done
  [ -S "$run/csi.sock" ] || { cat "$run/driver.log" >&2; echo "sanity: the driver did not start" >&2; exit 1; }
  echo "== csi-sanity, $access volumes, volume health API $health"
  if ! "$sanity" --csi.endpoint="$run/csi.sock" \
      --csi.mountdir="$run/target" --csi.stagingdir="$run/staging" \
      --csi.testvolumeaccesstype="$access" --csi.testnodevolumeattachlimit \
      --ginkgo.no-color "${skip[@]}"; then
    failed=1
    echo "sanity: failures with $access volumes; the driver's log: $run/driver.log" >&2
    tail -50 "$run/driver.log" >&2
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
exit "$failed"
