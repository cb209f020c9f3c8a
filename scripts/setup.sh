#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: torch first, then tmt itself.
# Installing torch explicitly first keeps pip from resolving the project's `torch` requirement
# to a multi-GB CUDA build on machines without a GPU. Override with TORCH_SPEC, e.g.
#   TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip_quiet() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip_quiet $TORCH_SPEC
fi
pip_quiet -e ".[dev]"
# Headless Chromium for the web-page test (tests/e2e/test_web_page.py, which skips without it):
# installed only where we are root with apt and no Chromium is present yet.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
        || echo "setup: could not install chromium; the web-page test will be skipped" >&2
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
