#!/usr/bin/env bash
# e2e on kind: builds the image, loads it into a kind cluster, installs the chart, proves a
# volume end to end (provision, attach, mount, write, read, delete), then runs the scenario
# suite against the same cluster with KUBECONFIG.
#
# Needs docker, kind (https://kind.sigs.k8s.io) and cargo; helm and kubectl come from
# scripts/install-tools.sh. The scenario suite's mounting stories need root.
#
#   e2e/run.sh              create (or reuse) the cluster, run everything
#   KEEP_CLUSTER=1 e2e/run.sh   leave a cluster this run creates running afterwards
#   KIND_NODE_IMAGE=kindest/node:v1.34.0 e2e/run.sh   pick the Kubernetes version
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${KIND_CLUSTER_NAME:-csi-suite}"
IMAGE="csi-suite:e2e"
NAMESPACE="csi-suite"
KUBECONFIG_FILE="$PWD/target/e2e/kubeconfig"

for tool in docker kind cargo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "e2e: $tool is required" >&2; exit 1; }
done
scripts/install-tools.sh helm kubectl
helm="$PWD/.tools/bin/helm"
kubectl="$PWD/.tools/bin/kubectl"
mkdir -p "$(dirname "$KUBECONFIG_FILE")"
export KUBECONFIG="$KUBECONFIG_FILE"

if ! kind get clusters | grep -x "$CLUSTER" >/dev/null; then
  kind create cluster --name "$CLUSTER" --config e2e/kind.yaml \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --kubeconfig "$KUBECONFIG_FILE" --wait 120s
  # Only a cluster this run created is deleted afterwards.
  if [ -z "${KEEP_CLUSTER:-}" ]; then
    trap 'kind delete cluster --name "$CLUSTER"' EXIT
  fi
else
  kind export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE"
fi

make docker-image IMAGE="$IMAGE"
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "== install the chart"
"$helm" upgrade --install csi-suite charts/csi-suite --namespace "$NAMESPACE" --create-namespace \
  --set image.tag=e2e --set storageClass.create=true \
  --set driver.controller.node="${CLUSTER}-control-plane" --wait --timeout 5m
"$kubectl" -n "$NAMESPACE" rollout status daemonset/csi-suite-node --timeout 3m
"$kubectl" -n "$NAMESPACE" rollout status deployment/csi-suite-controller --timeout 3m

echo "== smoke: provision, attach, mount, write, read, delete"
"$kubectl" create namespace smoke --dry-run=client -o yaml | "$kubectl" apply -f -
"$kubectl" -n smoke apply -f e2e/smoke.yaml
"$kubectl" -n smoke wait pod/smoke --for=condition=Ready --timeout 3m
"$kubectl" -n smoke exec smoke -- cat /data/proof | grep -x written-by-smoke >/dev/null
pv="$("$kubectl" -n smoke get pvc smoke -o jsonpath='{.spec.volumeName}')"
"$kubectl" get volumeattachments -o jsonpath='{range .items[*]}{.spec.source.persistentVolumeName} {.status.attached}{"\n"}{end}' \
  | grep -x "$pv true" >/dev/null
"$kubectl" delete namespace smoke --wait --timeout 3m
for _ in $(seq 60); do
  "$kubectl" get pv "$pv" >/dev/null 2>&1 || break
  sleep 2
done
if "$kubectl" get pv "$pv" >/dev/null 2>&1; then
  echo "e2e: PV $pv is still there two minutes after its claim was deleted" >&2
  "$kubectl" get pv "$pv" -o yaml >&2
  exit 1
fi
echo "smoke passed ($pv provisioned, attached, written, read and deleted)"

# The scenario suite brings its own sidecars and simulated kubelets for the same driver name:
# take the chart away first, so two provisioners never race for one claim.
"$helm" uninstall csi-suite --namespace "$NAMESPACE" --wait
echo "== scenario suite against $CLUSTER"
cargo test --locked -p csi-suite-scenarios -- --test-threads=2
