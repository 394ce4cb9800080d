#!/usr/bin/env bash
# The README's second set-up command, and what .ci/run calls: install what the tests
# need (bubblewrap for the bwrap backend; gdb, with which a test hijacks a workspace
# host from its own command; the Python test dependencies) and run the whole suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v gdb >/dev/null 2>&1 || missing+=(gdb)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${missing[*]} (tests of the bwrap backend, and of a hijacked host)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "${missing[*]} missing and cannot be installed from here (needs root and apt-get);" >&2
    echo "install them, or the tests that need them will skip (and fail under CI=true)" >&2
  fi
fi

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

# The docker backend's tests need an engine and the sandbox image (built here, from
# Debian's packages: no registry needed). Under CI a failure here fails the run.
if ! bash scripts/docker-engine.sh; then
  echo "docker engine or image unavailable: the docker tests will skip (and fail under CI=true)" >&2
fi

# tests/test_nonroot.py runs the installed package as an ordinary user: that user, and
# a venv of the system's Python holding this checkout as a wheel (rebuilt on change).
if ! bash scripts/nonroot-setup.sh; then
  echo "non-root setup unavailable: tests/test_nonroot.py will skip (and fail under CI=true)" >&2
fi

# mypy --strict over our code (generated stubs excluded): a type error fails the run
# before the suite starts.
echo "== typecheck"
bash scripts/typecheck

python3 -m pytest -n 2 -p no:cacheprovider "$@"
