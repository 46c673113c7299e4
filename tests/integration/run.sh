#!/usr/bin/env bash
# ctest entry for the server integration suite: makes the venv (scripts/setup-integration.sh), then
# runs pytest on tests/integration/ against $OSPREY_BIN. Exit 77 (ctest: skipped) when the venv cannot
# be made (no network for PyPI) or pytest collected nothing (its exit code 5).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! bash scripts/setup-integration.sh .venv-it; then
    echo "integration: cannot make the Python environment (.venv-it); skipping" >&2
    exit 77
fi
.venv-it/bin/python -m pytest -q -p no:cacheprovider tests/integration "$@"
rc=$?
[ $rc -eq 5 ] && exit 77
exit $rc
