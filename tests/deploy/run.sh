#!/usr/bin/env bash
# ctest entry for the offline deployment checks (tests/deploy/test_manifests.py: deploy/k8s/*.yaml and
# deploy/Containerfile against each other and against $OSPREY_BIN's --help): makes the venv
# (scripts/setup-integration.sh, which has PyYAML), then runs pytest. Exit 77 (ctest: skipped) when
# the venv cannot be made (no network for PyPI).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! bash scripts/setup-integration.sh .venv-it; then
    echo "deploy: cannot make the Python environment (.venv-it); skipping" >&2
    exit 77
fi
.venv-it/bin/python -m pytest -q -p no:cacheprovider tests/deploy "$@"
rc=$?
[ $rc -eq 5 ] && exit 77
exit $rc
