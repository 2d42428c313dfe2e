#!/usr/bin/env bash
# Installs moto (an S3 and IAM server, from PyPI) into .tools/moto, once: the COSI tests run
# cosi-s3 against it with IAM enforcement on, so the keys the driver mints are really checked.
# The version is pinned so every machine tests against the same server.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=5.2.5
VENV="$PWD/.tools/moto"
STAMP="$VENV/.moto-$VERSION"
[ -x "$VENV/bin/moto_server" ] && [ -f "$STAMP" ] && exit 0

command -v python3 >/dev/null 2>&1 || { echo "install-moto: python3 is required" >&2; exit 1; }
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$VERSION"
touch "$STAMP"
echo "installed $VENV/bin/moto_server (moto $VERSION)"
