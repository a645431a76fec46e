#!/usr/bin/env bash
# One entry point for a fresh Linux machine (Python 3.10+):
#   scripts/dev.sh serve [verl-sf serve args...]   set up (the common languages), then start the server on 127.0.0.1:8080
#   scripts/dev.sh test  [pytest args...]          set up everything (verl, Ray, TRL, every language), lint and
#                                                  type-check (ruff, mypy), then run all tests
# Setup is idempotent: a stamp keyed on setup.cfg skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VERL_SF_VENV:-$ROOT/.venv}
mode=${1:-}
[ -n "$mode" ] && shift || true

pick_python() {
  # $PYTHON if given; otherwise the distribution's own interpreter (/usr/bin) before any other
  # of the same version: Debian and Ubuntu build theirs with PGO and LTO, which runs Python
  # faster than a default pyenv build (docs/performance.md) -- every sandbox run, the server
  # and the load generator are Python.  `ensurepip` is what `-m venv` needs.
  if [ -n "${PYTHON:-}" ]; then
    if "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then echo "$PYTHON"; return 0; fi
    echo "verl-sf: PYTHON=$PYTHON is not a Python 3.10 or newer" >&2; exit 1
  fi
  local candidates=()
  for version in 3.11 3.12 3.10 3.13; do candidates+=("/usr/bin/python$version" "python$version"); done
  for py in "${candidates[@]}" python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "verl-sf: needs Python 3.10 or newer (with its venv module) on PATH" >&2; exit 1
}

has_libseccomp() {
  PATH=$PATH:/sbin:/usr/sbin ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'
}

install_system_packages() {
  # bubblewrap builds every sandbox and libseccomp compiles its filter; we install them when we can.
  # The check also needs perf (scripts/benchmark_profile.py samples the machine with it).
  local wanted=()
  command -v bwrap >/dev/null 2>&1 || wanted+=(bubblewrap)
  has_libseccomp || wanted+=(libseccomp2)
  [ "${1:-}" = test ] && ! command -v perf >/dev/null 2>&1 && wanted+=(linux-perf)
  [ ${#wanted[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "verl-sf: installing ${wanted[*]} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
  else
    echo "verl-sf: WARNING: ${wanted[*]} missing and this user cannot install it;" >&2
    echo "verl-sf:          \`verl-sf doctor\` says which isolation the server can still give." >&2
  fi
}

report_isolation() {
  # Which isolation rung this user gets here, what is missing and the fix (the server picks the
  # strongest itself; `--isolation <rung>` demands one). Informative: it never stops the start.
  case " $* " in *" --isolation none "*|*" --isolation=none "*) return 0 ;; esac
  "$VENV/bin/verl-sf" doctor >&2 || true
}

ensure_ci_account() {
  # The isolation and hostile tests also start the server as this ordinary account (no login, no home).
  [ "$(id -u)" = 0 ] || return 0
  if ! id -u verlsf-ci >/dev/null 2>&1; then
    echo "verl-sf: creating the system account verlsf-ci for the non-root server tests" >&2
    useradd --system --no-create-home --shell /usr/sbin/nologin verlsf-ci
  fi
  # That account runs the server from this checkout and venv. A checkout under a private (0700)
  # directory such as /root is out of its reach: give the directories above it the search bit only
  # (nothing in them becomes listable or readable), and say so.
  if ! runuser -u verlsf-ci -- test -r "$ROOT/verl_sf/__init__.py" -a -x "$VENV/bin/python" 2>/dev/null; then
    local dir="$ROOT"
    while [ "$dir" != / ]; do
      dir=$(dirname "$dir")
      if [ -n "$(find "$dir" -maxdepth 0 ! -perm -o+x)" ]; then
        echo "verl-sf: letting other users traverse $dir (chmod o+x) so verlsf-ci reaches the checkout" >&2
        chmod o+x "$dir"
      fi
    done
  fi
  if ! runuser -u verlsf-ci -- test -r "$ROOT/verl_sf/__init__.py" -a -x "$VENV/bin/python" 2>/dev/null; then
    echo "verl-sf: WARNING: verlsf-ci cannot read $ROOT or $VENV: the non-root isolation tests will fail" >&2
  fi
}

pip_quiet() {
  # Installs quietly; drops pip's notes about index locations this machine's pip.conf names but lacks.
  "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v -e "^WARNING: Location '" >&2)
}

setup_venv() {
  local extras=$1
  local py; py=$(pick_python)
  [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
  local stamp="$VENV/.verl-sf-$extras-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    echo "verl-sf: installing into $VENV (first run takes a few minutes)" >&2
    pip_quiet --upgrade pip
    if [ "$extras" = all ]; then
      # verl needs torch; pin the CPU build so pip does not pull a multi-GB CUDA wheel.
      pip_quiet "torch==2.13.0"
      pip_quiet -e ".[scientific,ray,verl,rollout,bench,test,daytona]"
    else
      pip_quiet -e ".[scientific]"
    fi
    touch "$stamp"
  fi
  # Bytecode for the checkout (pip compiles only what it installs): with PYTHONDONTWRITEBYTECODE
  # set, as in many images, every server, zygote and Ray worker would compile it from source again.
  "$VENV/bin/python" -m compileall -q -j 0 verl_sf >/dev/null
}

install_languages() {
  # Toolchains for Sandbox Fusion's languages (`verl-sf languages list` shows what is there).  As an
  # ordinary user this prints what to ask an administrator for; the server still starts and
  # answers absent languages with a SandboxError naming the fix.
  if ! "$VENV/bin/verl-sf" languages install "$@"; then
    echo "verl-sf: WARNING: some languages are not installed (see above); \`verl-sf languages list\` says which" >&2
  fi
}

case "$mode" in
  serve)
    install_system_packages
    setup_venv serve
    install_languages default
    report_isolation "$@"
    exec "$VENV/bin/verl-sf" serve "$@"
    ;;
  test)
    install_system_packages test
    setup_venv all
    install_languages all
    ensure_ci_account
    # Lint and types first (config in pyproject.toml); `ruff format` is not enforced: the tree is not formatted.
    "$VENV/bin/ruff" check --no-cache .
    "$VENV/bin/mypy"
    # The slowest tests are listed at the end: the whole check must stay well under 30 minutes.  Two
    # pytest-xdist workers (VERL_SF_TEST_WORKERS), each test module on one of them; Ray's on one.  As
    # root each worker's non-root servers get an account of their own; an ordinary user has one uid,
    # whose RLIMIT_NPROC both workers' runs would share, so runs one process (0: no workers).
    default_workers=2
    [ "$(id -u)" = 0 ] || default_workers=0
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 \
      -n "${VERL_SF_TEST_WORKERS:-$default_workers}" --dist loadgroup "$@"
    ;;
  *)
    echo "usage: scripts/dev.sh serve|test [args...]" >&2; exit 2 ;;
esac
