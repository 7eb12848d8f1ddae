#!/usr/bin/env bash
# Installs the Debian packages tptrain builds and tests with. Idempotent;
# uses sudo when not run as root.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
pkgs=(cmake make gcc g++ pkg-config libopenblas-dev libcjson-dev libsentencepiece-dev)
if [ "${1:-}" = "--tests" ]; then
  pkgs+=(python3-torch python3-numpy python3-sentencepiece)   # reference checks, run by /usr/bin/python3
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
