#!/usr/bin/env bash
# Installs what `make cross` and the arm64 image need, once; later runs only check. Everything
# comes from Debian's packages: CI reaches the package registries and nothing else, so rustup's
# `rustup target add` (static.rust-lang.org) is not an option.
#   - rustc-web (bookworm-security's Rust 1.96, /usr/bin/rustc) with its standard library for
#     arm64 (libstd-rust-web-dev:arm64 ships lib/rustlib/aarch64-unknown-linux-gnu): `make cross`
#     builds with this compiler, the host build with rustup's;
#   - the cross linker (gcc-aarch64-linux-gnu) and glibc's arm64 static libraries
#     (libc6-dev-arm64-cross) for crt-static;
#   - qemu-user, whose qemu-aarch64 runs arm64 programs: the tests start the binaries with it, and
#     the image writer asks the arm64 dynamic loader which libraries losetup and mke2fs load;
#   - losetup and mke2fs for arm64 and the libraries they load, unpacked (not installed) into
#     .tools/arm64/root, the arm64 image's counterpart of this machine's own /.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
# The image's tools: the packages that carry them, and the files.
TOOL_PACKAGES=(mount:arm64 e2fsprogs:arm64)
TOOLS=(sbin/losetup sbin/mke2fs)
ROOT="$PWD/.tools/arm64/root"

installed() { [ "$(dpkg-query -W -f '${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
missing=()
for package in "${PACKAGES[@]}"; do
  installed "$package" || missing+=("$package")
done
unpacked=1
for tool in "${TOOLS[@]}"; do
  [ -x "$ROOT/$tool" ] || unpacked=""
done
[ ${#missing[@]} -gt 0 ] || [ -z "$unpacked" ] || exit 0

command -v apt-get >/dev/null 2>&1 || { echo "install-cross: needs Debian's apt-get" >&2; exit 1; }
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -qq
elif [ ${#missing[@]} -gt 0 ] || [ -z "$unpacked" ]; then
  apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-cross: installed ${missing[*]}"
fi

if [ -z "$unpacked" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # The tools' packages and the arm64 libraries they depend on, however deep (logsave, a
  # program e2fsprogs depends on, is not needed).
  libraries=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "${TOOL_PACKAGES[@]}" | grep -E '^lib[^ ]*:arm64$' | sort -u)
  # apt's download user cannot write to a directory of root's own.
  chmod 0777 "$work"
  # shellcheck disable=SC2086
  (cd "$work" && apt-get download -qq "${TOOL_PACKAGES[@]}" $libraries)
  rm -rf "$ROOT" && mkdir -p "$ROOT"
  for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$ROOT"
  done
  for tool in "${TOOLS[@]}"; do
    [ -x "$ROOT/$tool" ] || { echo "install-cross: no $tool in ${TOOL_PACKAGES[*]}" >&2; exit 1; }
  done
  echo "install-cross: unpacked ${TOOLS[*]} and their libraries into $ROOT"
fi
