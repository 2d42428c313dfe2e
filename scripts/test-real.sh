#!/usr/bin/env bash
# `make test-real`: the scenario suite, and kube-sim's API tests in compare mode, on a real
# control plane: the cluster of KUBECONFIG when it is set (kind, or any cluster), else the one
# `../shared/k8s/control-plane` brings up here, and takes down again when the run ends.
# Scenarios that need an API the server lacks, or kube-sim's fault injection, report a named skip;
# this script counts them.
set -euo pipefail
cd "$(dirname "$0")/.."

CONTROL_PLANE=${CONTROL_PLANE:-../shared/k8s/control-plane}
CARGO=${CARGO:-cargo}

skips=$(mktemp)
started=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  rm -f "$skips"
  if [ -n "$started" ]; then "$CONTROL_PLANE" down; fi
}
trap cleanup EXIT

if [ -z "${KUBECONFIG:-}" ]; then
  if [ ! -x "$CONTROL_PLANE" ]; then
    echo "test-real: set KUBECONFIG to a cluster, or put the control plane at $CONTROL_PLANE" >&2
    exit 2
  fi
  started=1
  eval "$("$CONTROL_PLANE" up | grep '^export KUBECONFIG=')"
fi
export KUBECONFIG
echo "test-real: on the cluster of $KUBECONFIG"
export CSI_SUITE_SKIPS=$skips

status=0
KUBE_SIM_COMPARE_KUBECONFIG=$KUBECONFIG $CARGO test --locked -p kube-sim --test api || status=1
$CARGO test --locked -p csi-suite-scenarios --no-fail-fast || status=1

count=$(wc -l < "$skips")
echo "test-real: $count scenario part(s) skipped on this server (an API it does not serve, or kube-sim's fault injection):"
sed 's/^/  /' "$skips"
exit $status
