#!/usr/bin/env bash
# Installs the Debian packages tptrain builds and tests with. Idempotent;
# uses sudo when not run as root.
#   install_deps.sh [--plot] [--tests]
# --plot adds python3-matplotlib (scripts/plot_metrics.py); --tests adds it
# too, with python3-torch, python3-numpy and python3-sentencepiece for the
# reference checks (all run by /usr/bin/python3), and clang with libFuzzer
# for the fuzz targets (ctest fuzz_smoke).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
pkgs=(cmake make gcc g++ pkg-config libopenblas-dev libcjson-dev libsentencepiece-dev)
for arg in "$@"; do
  case $arg in
    --plot) pkgs+=(python3-matplotlib) ;;
    --tests) pkgs+=(python3-matplotlib python3-torch python3-numpy python3-sentencepiece clang libclang-rt-14-dev) ;;
    *) echo "install_deps: unknown argument '$arg' (expected --plot, --tests)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
