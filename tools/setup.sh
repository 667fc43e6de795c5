#!/usr/bin/env bash
# The set-up `make demo` and `make test` depend on, for a fresh Debian 12 machine.
#
#   tools/setup.sh demo   Go, a C compiler, cargo; candle-graph in build/tools
#   tools/setup.sh test   that, and: Debian's packages for the torch tests, the virtualenv
#                         build/venv, NVIDIA's real libraries (build/reallibs) and PyPI's
#                         torch 2.x (build/venv-torch2)
#
# Idempotent: each step checks first and does nothing when its result is there, so a
# second run takes well under 2 s. Only apt-get needs root; without it the missing
# packages are named with the command that installs them. Go and cargo are not Debian's
# (Debian 12's Go is too old): they are checked, and their absence named.
#
# build/venv is the Python of every test (Debian 12's own pip refuses to install into the
# system Python: externally-managed-environment). It is made from /usr/bin/python3 with
# --system-site-packages, so Debian's torch 1.13 (python3-torch) is visible in it: the
# torch 1.13 tests run under build/venv/bin/python; pytest and jsonschema are added to it
# from PyPI where the system does not provide them.
set -euo pipefail
cd "$(dirname "$0")/.."

LEVEL=${1:-test}
case $LEVEL in demo|test) ;; *) echo "usage: tools/setup.sh [demo|test]" >&2; exit 2 ;; esac
BASE_PY=/usr/bin/python3
VENV=build/venv
# What build/venv must import; its marker file holds this line once it does.
VENV_MODULES="pytest jsonschema"
# Debian packages of the test level, and why:
#   python3-torch        torch 1.13 for the binding's torch tests (first interpreter)
#   python3-pytest       pytest for that torch (visible in build/venv)
#   g++ ninja-build libtorch-dev   build the C++ op observer (torch.utils.cpp_extension)
#   python3-venv         build/venv, build/venv-torch2 and the packaging test's venv
#   python3-wheel        setuptools 66 (Debian's, in a fresh venv) builds wheels with it:
#                        the packaging test installs bindings/python offline with it
#   chromium             the view tests open the HTML pages in a real headless browser
APT_PACKAGES="python3-torch python3-pytest g++ ninja-build libtorch-dev python3-venv python3-wheel chromium"

fail() { echo "tools/setup.sh: $*" >&2; exit 1; }

check_go() {
  local go=${GO:-go} need have
  need=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' go.mod)
  command -v "$go" >/dev/null ||
    fail "go not found: building libcandle_trace.so needs Go >= $need (https://go.dev/dl)"
  have=$("$go" env GOVERSION)
  have=${have#go}
  # sort -V: the lower of the two must be the one go.mod asks for.
  [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" = "$need" ] ||
    fail "$go is Go $have: building libcandle_trace.so needs Go >= $need (https://go.dev/dl)"
}

check_cc() {
  command -v "${CC:-cc}" >/dev/null ||
    fail "C compiler ${CC:-cc} not found: cgo and the C tests need one (apt-get install gcc)"
}

check_cargo() {  # only needed while candle-graph is not installed
  [ -x build/tools/bin/candle-graph ] || command -v cargo >/dev/null ||
    fail "cargo not found: installing candle-graph (the reference reader) into build/tools needs Rust's cargo (https://rustup.rs)"
}

apt_packages() {
  local installed pkg missing=""
  if ! command -v dpkg-query >/dev/null; then
    echo "tools/setup.sh: no dpkg here (not Debian): not checking for the packages $APT_PACKAGES;" \
      "install their equivalents (torch 1.13+ for /usr/bin/python3, pytest, g++, ninja, torch's headers, venv)" >&2
    return 0
  fi
  # dpkg-query exits 1 when a package is unknown to dpkg: that is a missing one too.
  installed=" $(dpkg-query -W -f='${db:Status-Status}:${Package} ' $APT_PACKAGES 2>/dev/null || true)"
  for pkg in $APT_PACKAGES; do
    case $installed in *" installed:$pkg "*) ;; *) missing="$missing${missing:+ }$pkg" ;; esac
  done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    fail "missing Debian packages: $missing; install them as root: sudo apt-get install --no-install-recommends $missing"
  fi
  echo "tools/setup.sh: installing $missing"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
}

venv() {
  local marker="$VENV/.setup" want="base=$BASE_PY modules=$VENV_MODULES"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  rm -rf "$VENV"
  "$BASE_PY" -m venv --system-site-packages "$VENV" ||
    fail "$BASE_PY -m venv failed (Debian: apt-get install python3-venv)"
  local mod missing=""
  for mod in $VENV_MODULES; do
    "$VENV/bin/python" -c "import $mod" 2>/dev/null || missing="$missing $mod"
  done
  if [ -n "$missing" ]; then
    echo "tools/setup.sh: installing$missing into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $missing
  fi
  echo "$want" >"$marker"
}

check_go
check_cc
check_cargo
if [ "$LEVEL" = test ]; then
  apt_packages
  venv
  # The Makefile's own rules, each a no-op when done: candle-graph (cargo install into
  # build/tools), NVIDIA's libraries (build/reallibs), PyPI's torch 2.x (build/venv-torch2).
  ${MAKE:-make} -s --no-print-directory tools real-libs torch2-venv
else
  ${MAKE:-make} -s --no-print-directory tools
fi
