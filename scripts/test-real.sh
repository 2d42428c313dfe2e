#!/usr/bin/env bash
# `make test-real`: the scenario suite, and kube-sim's API tests in compare mode (with the fault
# proxy's), on a real control plane: the cluster of KUBECONFIG when it is set (kind, or any
# cluster), else one `../shared/k8s/control-plane` of each of K8S_VERSIONS (default "1.28 1.19":
# the newest that builds here and the oldest we support), each in its own directory and on its
# own port, brought up for the run and taken down after it. The versions run at the same time:
# the scenarios wait on their API server far more than they compute, so two suites take little
# longer than one. Each version's output is printed whole when it ends, then a summary: per
# server the time, the tests passed and failed, and each skip with its reason (an API the server
# does not serve).
set -euo pipefail
cd "$(dirname "$0")/.."

CONTROL_PLANE=${CONTROL_PLANE:-../shared/k8s/control-plane}
CARGO=${CARGO:-cargo}

work=$(mktemp -d)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local dir
  for dir in "$work"/cp-*; do
    [ -d "$dir" ] && CP_DIR=$dir "$CONTROL_PLANE" down >/dev/null 2>&1
  done
  rm -rf "$work"
}
trap cleanup EXIT

# With cargo-nextest (on this kind of machine) the scenarios run several at a time across the
# test binaries, those with a snapshot-controller one at a time (.config/nextest.toml); `cargo
# test` runs one binary after the other, and within one binary its tests together: there two
# snapshot scenarios' controllers may act on each other's snapshots.
if $CARGO nextest --version >/dev/null 2>&1; then
  run_scenarios=(nextest run --locked -p csi-suite-scenarios --no-fail-fast --test-threads 6)
else
  run_scenarios=(test --locked -p csi-suite-scenarios --no-fail-fast)
fi

# counts LOG: "N passed, M failed" over the result lines of `cargo test` and the summary of
# `cargo nextest` in LOG.
counts() {
  awk '/^test result:|^ *Summary \[/ { for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
       END { printf "%d passed, %d failed", p, f }' "$1"
}

# suite NAME: both test sets on the cluster of KUBECONFIG; writes NAME's summary.
suite() {
  local name=$1 status=0 begin=$SECONDS skips="$work/skips-$1" api="$work/api-$1" scenarios="$work/scenarios-$1"
  : > "$skips"
  echo "test-real: on $name ($KUBECONFIG)"
  CSI_SUITE_SKIPS=$skips KUBE_SIM_COMPARE_KUBECONFIG=$KUBECONFIG $CARGO test --locked -p kube-sim --test api --test proxy --test quantities_and_names \
    > "$api" 2>&1 || status=1
  CSI_SUITE_SKIPS=$skips $CARGO "${run_scenarios[@]}" > "$scenarios" 2>&1 || status=1
  cat "$api" "$scenarios"
  {
    echo "test-real: $name in $((SECONDS - begin)) s: kube-sim API tests $(counts "$api"); scenarios $(counts "$scenarios"), $(wc -l < "$skips") part(s) skipped:"
    sed 's/^/  /' "$skips"
  } > "$work/summary-$name"
  return $status
}

# on_version VERSION PORT: a control plane of VERSION on PORT, the suites on it, then down.
on_version() {
  local version=$1 dir="$work/cp-$1" status=0
  KUBECONFIG=$(CP_DIR=$dir CP_PORT=$2 K8S_VERSION=$version "$CONTROL_PLANE" up |
    sed -n 's/^export KUBECONFIG=//p')
  [ -n "$KUBECONFIG" ] || { echo "test-real: the v$version control plane did not come up" >&2; return 1; }
  export KUBECONFIG
  suite "v$version" || status=1
  CP_DIR=$dir "$CONTROL_PLANE" down
  return $status
}

# Build once, before the versions share the target directory.
$CARGO test --locked -p kube-sim --test api --test proxy --test quantities_and_names --no-run
$CARGO test --locked -p csi-suite-scenarios --no-run

status=0
if [ -n "${KUBECONFIG:-}" ]; then
  export KUBECONFIG
  suite "the-cluster-of-KUBECONFIG" || status=1
else
  [ -x "$CONTROL_PLANE" ] || {
    echo "test-real: set KUBECONFIG to a cluster, or put the control plane at $CONTROL_PLANE" >&2
    exit 2
  }
  # Secure ports 16443, 15443, …: each keeps its etcd ports (+7347, +7357) and v1.19's
  # insecure port (+1637) apart from the others'.
  port=16443
  pids=()
  for version in ${K8S_VERSIONS:-1.28 1.19}; do
    on_version "$version" "$port" > "$work/log-$version" 2>&1 &
    pids+=("$!:$version")
    port=$((port - 1000))
  done
  for entry in "${pids[@]}"; do
    wait "${entry%%:*}" || status=1
    echo "== test-real: v${entry#*:}"
    cat "$work/log-${entry#*:}"
  done
fi
echo "test-real: summary"
cat "$work"/summary-* 2>/dev/null || echo "  (no suite ran)"
exit $status
