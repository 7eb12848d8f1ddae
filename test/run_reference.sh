#!/usr/bin/env bash
# The C model against the independent PyTorch model: ref_dump writes weights,
# a padded batch and the C results; check_reference.py recomputes them in
# float64 PyTorch and compares. Usage: run_reference.sh REF_DUMP SCRIPT_DIR ACT
set -euo pipefail
dump=$1 scripts=$2 act=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$dump" "$work/case" "$act"
/usr/bin/python3 "$scripts/check_reference.py" "$work/case"
