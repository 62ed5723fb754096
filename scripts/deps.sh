#!/usr/bin/env bash
# Installs what `make` and `make test` need on a fresh Debian 12 machine, and nothing that is
# already there. Idempotent: a second run does no apt-get work.
set -euo pipefail

pkgs=(gcc make pkg-config pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo libsimde-dev
      qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross valgrind jq)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || {
  echo "deps: Go is not installed (expected at /usr/local/go); install Go 1.24 or later" >&2
  exit 1
}
