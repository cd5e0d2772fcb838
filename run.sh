#!/usr/bin/env bash
# Set up .venv (on first use, or when pyproject.toml / constraints.txt changed) and run a task.
#   ./run.sh demo [diffmech demo options]   e.g. ./run.sh demo --out results/demo
#   ./run.sh test [pytest options]          the test suite (python -m pytest -q)
#   ./run.sh setup [EXTRA]                  only create / update .venv (default extra: test)
# PYTHON selects the interpreter that creates the venv (default: python3, needs >= 3.10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.diffmech-install-stamp"
# torch first, exact version: a wheel of it is on this machine's disk; letting the resolver pick
# torch from a range would download a multi-GB CUDA build instead.
TORCH_PIN="torch==2.13.0"

# setup EXTRA: install the project with the named extra ("robots" for the demo, "test" for the suite).
# The test extra holds everything the robots extra does, so a venv set up for the tests serves the demo.
setup() {
    local extra="$1"
    if [ ! -x "$PY" ]; then
        "${PYTHON:-python3}" -c 'import sys; assert sys.version_info >= (3, 10), "diffmech needs Python >= 3.10"'
        echo "run.sh: creating $VENV" >&2
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    local key have
    key="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1) $TORCH_PIN"
    have="$(cat "$STAMP" 2>/dev/null || true)"
    if [ "$have" = "$key test" ] || [ "$have" = "$key $extra" ]; then
        return 0
    fi
    echo "run.sh: installing diffmech[$extra] into $VENV (first run takes a few minutes)" >&2
    "$PY" -m pip install --disable-pip-version-check -q "$TORCH_PIN"
    "$PY" -m pip install --disable-pip-version-check -q -c constraints.txt -e ".[$extra]"
    echo "$key $extra" > "$STAMP"
}

# The browser test of the 3-D view needs a headless Chromium: Debian's package, installed when this
# machine has none and apt-get can run (as root, e.g. in CI); otherwise the test says what is missing.
browser() {
    local b
    for b in chromium-headless-shell chromium chromium-browser google-chrome; do
        command -v "$b" > /dev/null && return 0
    done
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        echo "run.sh: installing Debian's chromium for the browser test (apt-get, about a minute)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null 2>&1 \
            || { apt-get update -q > /dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null 2>&1; } \
            || echo "run.sh: apt-get could not install chromium; the browser test will fail" >&2
    fi
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    setup) setup "${1:-test}" ;;
    demo) setup robots; exec "$PY" -m diffmech demo "$@" ;;
    test) setup test; browser; exec "$PY" -m pytest -q "$@" ;;
    *)
        echo "usage: ./run.sh {demo|test|setup} [args...]" >&2
        exit 2
        ;;
esac
