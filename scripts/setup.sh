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
# System packages, installed only where we are root with apt and they are missing: headless
# Chromium for the web-page test (tests/e2e/test_web_page.py, which skips without it), and
# tcmalloc, which `tmt train` preloads when it is present (about 1 GB less memory at base size,
# and faster: README, Performance).
missing=()
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    missing+=(chromium)
fi
if ! .venv/bin/python -c "import sys; from transformer_mt.allocator import find_tcmalloc
sys.exit(find_tcmalloc() is None)"; then
    missing+=(libtcmalloc-minimal4)
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ${#missing[@]} -gt 0 ]; then
    (apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null) \
        || echo "setup: could not install ${missing[*]}; without chromium the web-page test is" \
                "skipped, without tcmalloc tmt train uses glibc's malloc" >&2
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
