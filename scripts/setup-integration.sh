#!/usr/bin/env bash
# Makes the Python virtual environment the server integration tests (tests/integration/) run in:
# .venv-it/ with the official openai client, pytest, requests, pyzmq + msgpack (the KV-event
# decoder written from vLLM's schema), PyYAML, jsonschema and kubernetes-validate (tests/deploy reads the
# Kubernetes manifests and checks them against the Kubernetes schemas and its own) and selenium
# (the web page's headless-browser test drives Debian's chromium through chromedriver, both installed by
# scripts/setup.sh) from PyPI. Idempotent: does nothing
# when the environment already imports them all. Usage: scripts/setup-integration.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${1:-.venv-it}"
# ctest runs several suites that call this at once (integration_server, its process-mode twin,
# deploy_manifests): one makes the venv, the others wait, then find it complete
exec 9<"${BASH_SOURCE[0]}"
flock 9
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import openai, pytest, requests, zmq, msgpack, yaml, selenium, jsonschema, kubernetes_validate' 2>/dev/null; then
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check openai pytest requests pyzmq msgpack pyyaml selenium jsonschema kubernetes-validate
