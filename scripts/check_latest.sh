#!/usr/bin/env bash
# The newest-dependencies check: a throw-away virtual environment with the newest releases that the
# package's own requirement ranges allow (constraints.txt is NOT applied), running the tests that a new
# release of a dependency can break: the drop-in capture against transformers' own debugger (bit for bit),
# the committed fixtures regenerated, and the alignment tests. See docs/compatibility.md.
#
#   scripts/check_latest.sh                 # torch stays at this machine's CPU build (see below)
#   TORCH_SPEC='torch' scripts/check_latest.sh   # the newest torch too (on most machines a multi-GB CUDA build)
#   KEEP_VENV=1 scripts/check_latest.sh     # keep the environment and print its path
#
# Exit code: pytest's (0 when every test passed). The last lines name the versions that were installed.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tracediff-latest.XXXXXX")"
cleanup() { if [ "${KEEP_VENV:-0}" = 1 ]; then echo "kept: $work/venv"; else rm -rf "$work"; fi; }
trap cleanup EXIT
python -m venv "$work/venv"
py="$work/venv/bin/python"
printf '%s\n' "$TORCH_SPEC" > "$work/torch.txt"
"$py" -m pip install -q --disable-pip-version-check -c "$work/torch.txt" -e ".[test]"
status=0
"$py" -m pytest -q -p no:cacheprovider tests/capturing/test_compat.py tests/capturing/test_fixtures.py \
    tests/alignment "$@" || status=$?
echo "versions:"
"$py" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(torch|transformers|numpy|safetensors|pandas|deepdiff|tabulate|tqdm|hypothesis|pytest) ' || true
exit "$status"
