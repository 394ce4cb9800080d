#!/usr/bin/env bash
# What tests/test_nonroot.py needs to run the gateway as an ordinary user, as an
# operator without root would: a system user, and clawsup INSTALLED (a wheel built
# from this checkout, not an editable install) in a venv of Debian's own Python,
# which that user can read (the Python that runs the suite may live under a 0700
# home, as pyenv's does). Run as root; scripts/test.sh calls it before pytest.
#
#   bash scripts/nonroot-setup.sh           set up, or bring up to date (quick when it is)
#   bash scripts/nonroot-setup.sh --check   exit 0 if up to date, else 1 and say why
#
# The dependencies are pinned to the versions the suite's own Python has (PYTHON,
# else python3, as scripts/test.sh installed them): the installed gateway then speaks
# the same grpc and protobuf, and finds the docker image that scripts/docker-engine.sh
# built (its tag carries those versions, sandbox/launch/image.py).
#
# The venv is rebuilt only when the key changes: a hash of what goes into the wheel
# (pyproject.toml, README.md, the packages' folders), of this script, of the pins,
# and of the interpreter's version. The key is written last, so an interrupted run
# reruns.
# CLAWSUP_NONROOT_USER and CLAWSUP_NONROOT_VENV override the defaults (the test reads
# the same variables).
set -euo pipefail
cd "$(dirname "$0")/.."

USER_NAME=${CLAWSUP_NONROOT_USER:-clawsup-ci}
VENV=${CLAWSUP_NONROOT_VENV:-/opt/clawsup-nonroot}
PY=/usr/bin/python3
SUITE_PY=${PYTHON:-python3}
STAMP=$VENV/.clawsup-source-key
# Everything that goes into the wheel: pyproject.toml and setup.py (which maps the
# folders to the clawsup namespace), the folders, the docker image's recipe.
SOURCES=(pyproject.toml setup.py README.md supervisor sandbox proto plugins Dockerfile.sandbox scripts/build-sandbox-image)

pins() {
  "$SUITE_PY" -c 'import importlib.metadata as m
names = {(d.metadata["Name"] or "").lower(): d.version for d in m.distributions()}
print("\n".join(f"{n}=={v}" for n, v in sorted(names.items()) if n and n != "clawsup"))' 2>/dev/null || true
}

source_key() {
  {
    "$PY" --version 2>&1
    pins
    for s in "${SOURCES[@]}" scripts/nonroot-setup.sh; do
      [ -e "$s" ] || continue
      find "$s" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0
    done | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

problem() {
  id -u "$USER_NAME" >/dev/null 2>&1 || { echo "no user $USER_NAME"; return; }
  [ -x "$PY" ] || { echo "no $PY (Debian: apt-get install python3 python3-venv)"; return; }
  [ -x "$VENV/bin/clawsup" ] || { echo "no clawsup installed in $VENV"; return; }
  [ "$(cat "$STAMP" 2>/dev/null)" = "$(source_key)" ] || { echo "$VENV holds an older build of this checkout"; return; }
}

if [ "${1:-}" = "--check" ]; then
  why=$(problem)
  [ -z "$why" ] && exit 0
  echo "$why; run \`bash scripts/nonroot-setup.sh\` as root" >&2
  exit 1
fi

[ -z "$(problem)" ] && { echo "== non-root setup: $VENV is up to date"; exit 0; }
if [ "$(id -u)" != 0 ]; then
  echo "scripts/nonroot-setup.sh needs root (it creates the user $USER_NAME and $VENV): $(problem)" >&2
  exit 1
fi
umask 022
exec 9>/run/lock/clawsup-nonroot-setup.lock
flock 9

if ! [ -x "$PY" ] || ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "== installing Debian's python3 and python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
fi

if ! id -u "$USER_NAME" >/dev/null 2>&1; then
  echo "== creating the system user $USER_NAME"
  useradd --system --user-group --create-home --home-dir "/var/lib/$USER_NAME" --shell /usr/sbin/nologin "$USER_NAME"
fi

if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "== creating the venv $VENV from $PY"
  if [ -e "$VENV" ] && ! [ -e "$VENV/pyvenv.cfg" ]; then
    echo "$VENV exists and is not a venv; not removing it (set CLAWSUP_NONROOT_VENV to another path)" >&2
    exit 1
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi

KEY=$(source_key)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$KEY" ]; then
  echo "== installing this checkout into $VENV (a wheel, not editable)"
  rm -f "$STAMP"
  # Built from a copy: an in-tree build leaves build/ behind, whose stale files (a
  # module deleted since) would go into the next wheel.
  WORK=$(mktemp -d /tmp/clawsup-nonroot.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  mkdir "$WORK/src"
  for s in "${SOURCES[@]}"; do
    if [ -e "$s" ]; then cp -r --parents "$s" "$WORK/src/"; fi
  done
  find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
  pins >"$WORK/pins.txt"
  # A local folder is always reinstalled, and the previous build's files removed.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --constraint "$WORK/pins.txt" "$WORK/src"
  chmod -R a+rX "$VENV"
  echo "$KEY" >"$STAMP"
fi
echo "== non-root setup: $USER_NAME, $VENV ready"
