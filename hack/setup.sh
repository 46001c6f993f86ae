#!/usr/bin/env bash
# hack/setup.sh — idempotent developer/CI setup for kubeinfer (called by `make setup`).
#
#   bash hack/setup.sh                 all steps
#   bash hack/setup.sh --python-only   step 1 only (.venv + package with test extras), for `make lint`
#   bash hack/setup.sh --binaries-only steps 3-4 only (Go toolchain check + control-plane binaries)
#
# Steps:
#   1. Python >= 3.11, .venv, `pip install -e '.[test]'` when pyproject.toml changed (stamp).
#   2. Debian's prometheus (/usr/bin/prometheus) via apt-get when absent; no service left running.
#   3. Go toolchain check (clear message when missing).
#   4. etcd, kube-apiserver, kube-controller-manager, kubectl, helm built from hack/go.mod into
#      .cache/bin/, only when the pinned versions / build flags changed or a binary is missing.
#
# Stamps live in .cache/stamps/; logs of the Go build in .cache/logs/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="$ROOT/.cache"
BIN="$CACHE/bin"
STAMPS="$CACHE/stamps"
LOGS="$CACHE/logs"
mkdir -p "$BIN" "$STAMPS" "$LOGS"

MODE="all"
case "${1:-}" in
  --python-only) MODE="python" ;;
  --binaries-only) MODE="binaries" ;;
  "") ;;
  *) echo "usage: $0 [--python-only|--binaries-only]" >&2; exit 2 ;;
esac

TOTAL=4
T0=$(date +%s)
# One setup at a time per checkout (several engineers/CI steps may call `make setup` at once).
exec 9>"$CACHE/setup.lock"
if ! flock -n 9; then
  echo "[setup] another hack/setup.sh is running in this checkout; waiting for it"
  flock 9
fi
step() { echo "[setup $1/$TOTAL] $2 (+$(( $(date +%s) - T0 ))s)"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# ---------------------------------------------------------------- 1. python
setup_python() {
  step 1 "python: .venv and the kubeinfer package with test extras"
  local py=""
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 \
        && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      py="$(command -v "$cand")"; break
    fi
  done
  if [ ! -x .venv/bin/python ]; then
    [ -n "$py" ] || die "Python >= 3.11 not found (apt-get install python3 python3-venv)"
    echo "  creating .venv with $py"
    "$py" -m venv .venv
  fi
  .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || die ".venv has Python < 3.11: remove .venv and re-run"
  local want; want="$(hash_of pyproject.toml)"
  if [ "$(cat "$STAMPS/python" 2>/dev/null || true)" != "$want" ] \
      || ! .venv/bin/python -c 'import kubeinfer' 2>/dev/null; then
    echo "  pip install -e '.[test]'"
    # -P: without it the repository root is sys.path[0] and its operator/ shadows the stdlib module
    # in a venv that has no kubeinfer yet (pip then fails at import time on a fresh clone).
    .venv/bin/python -P -m pip install --disable-pip-version-check -q -e '.[test]'
    echo "$want" > "$STAMPS/python"
  else
    echo "  up to date (pyproject.toml unchanged)"
  fi
}

# ---------------------------------------------------------------- 2. prometheus
setup_prometheus() {
  step 2 "prometheus: Debian package (/usr/bin/prometheus)"
  if [ -x /usr/bin/prometheus ]; then
    echo "  present: $(/usr/bin/prometheus --version 2>&1 | head -1)"
    return
  fi
  command -v apt-get >/dev/null 2>&1 || die "/usr/bin/prometheus missing and no apt-get: install Prometheus by hand"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "  apt-get update && apt-get install prometheus"
  $sudo apt-get update -qq
  # policy-rc.d 101 keeps Debian's maintainer scripts from starting the service where an init exists.
  local prc=/usr/sbin/policy-rc.d created_prc=0
  if [ ! -e "$prc" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$prc" >/dev/null; $sudo chmod +x "$prc"; created_prc=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus \
    || { [ "$created_prc" = 1 ] && $sudo rm -f "$prc"; die "apt-get install prometheus failed"; }
  [ "$created_prc" = 1 ] && $sudo rm -f "$prc"
  # No systemd here, but stop a service if some init did start one: tests start their own.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $sudo systemctl stop prometheus || true
    $sudo systemctl disable prometheus >/dev/null 2>&1 || true
  fi
  [ -x /usr/bin/prometheus ] || die "prometheus package installed but /usr/bin/prometheus missing"
  echo "  installed: $(/usr/bin/prometheus --version 2>&1 | head -1)"
}

# ---------------------------------------------------------------- 3. go
setup_go() {
  step 3 "go toolchain"
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"   # the official tarball's place, when not on PATH
  fi
  if ! command -v go >/dev/null 2>&1; then
    if binaries_up_to_date; then
      echo "  go not found, but the binaries in .cache/bin are up to date: not needed"
      return
    fi
    die "the Go toolchain is missing (need go >= $(awk '/^go /{print $2}' hack/go.mod), as in hack/go.mod).
  It builds etcd, kube-apiserver, kube-controller-manager, kubectl and helm from the Go module proxy.
  Install it (e.g. 'apt-get install golang-go' if new enough, or the official tarball) and put 'go' on PATH."
  fi
  echo "  $(go version)"
}

# ---------------------------------------------------------------- 4. binaries
# Pinned versions: hack/go.mod. The version ldflags make the API server report v1.37.2 (Helm's
# kubeVersion checks read it). buildDate is fixed so that the link is reproducible and cached.
K8S_VERSION="v1.37.2"
HELM_VERSION="v3.22.0"
BUILD_DATE="2026-01-01T00:00:00Z"
ldflags() {
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=37"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  ld+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  echo "$ld"
}
# name=package, built in this order (etcd first: small, and the tests need all of them anyway).
TARGETS=(
  "etcd=./cmd/etcd"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubectl=k8s.io/kubernetes/cmd/kubectl"
  "helm=helm.sh/helm/v3/cmd/helm"
)

# The stamp: pinned versions (go.mod, go.sum), the etcd main, the build flags and target list.
binaries_stamp() {
  { cat hack/go.mod hack/go.sum hack/cmd/etcd/main.go; ldflags; echo "${TARGETS[*]}"; } | sha256sum | cut -c1-16
}
binaries_up_to_date() {
  local t
  for t in "${TARGETS[@]}"; do [ -x "$BIN/${t%%=*}" ] || return 1; done
  [ "$(cat "$STAMPS/binaries" 2>/dev/null || true)" = "$(binaries_stamp)" ]
}

setup_binaries() {
  step 4 "control-plane binaries and helm -> .cache/bin/"
  if binaries_up_to_date; then
    echo "  up to date (hack/go.mod, go.sum and build flags unchanged): ${TARGETS[*]%%=*}"
    return
  fi
  local ld; ld="$(ldflags)"
  local want; want="$(binaries_stamp)"
  local jobs="${KUBEINFER_BUILD_JOBS:-2}"
  echo "  building with go build -p $jobs (log: .cache/logs/go-build.log); a cold build takes a long time"
  : > "$LOGS/go-build.log"
  local i=0 name pkg s
  for t in "${TARGETS[@]}"; do
    i=$((i + 1)); name="${t%%=*}"; pkg="${t#*=}"
    s=$(date +%s)
    echo "  [$i/${#TARGETS[@]}] $name ($pkg) ..."
    if ! (cd hack && nice -n 10 go build -p "$jobs" -trimpath -ldflags "$ld" -o "$BIN/$name.tmp" "$pkg") \
        >>"$LOGS/go-build.log" 2>&1; then
      tail -30 "$LOGS/go-build.log" >&2
      die "go build of $name failed (full log: .cache/logs/go-build.log)"
    fi
    mv -f "$BIN/$name.tmp" "$BIN/$name"
    echo "  [$i/${#TARGETS[@]}] $name built in $(( $(date +%s) - s ))s ($(du -h "$BIN/$name" | cut -f1))"
  done
  echo "$want" > "$STAMPS/binaries"
}

case "$MODE" in
  python) setup_python ;;
  binaries) setup_go; setup_binaries ;;
  all) setup_python; setup_prometheus; setup_go; setup_binaries ;;
esac
echo "[setup] done in $(( $(date +%s) - T0 ))s"
