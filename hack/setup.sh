#!/usr/bin/env bash
# hack/setup.sh — idempotent developer/CI setup for kubeinfer (called by `make setup`).
#
#   bash hack/setup.sh                 all steps
#   bash hack/setup.sh --python-only   step 1 only (.venv from the lock + the package), for `make lint`
#   bash hack/setup.sh --binaries-only steps 4-7 only (Go toolchain check + the Go-built binaries)
#   bash hack/setup.sh --peers         only the peer servers `make bench-peers` measures kubeinfer against:
#                                      .cache/peer-mlserver, .cache/peer-litserve, .cache/peer-infinity
#                                      (hack/lock.py PEERS), as step 9
#   bash hack/setup.sh --bench-granian only .cache/bench-granian: granian for `make bench-frontend`, a venv
#                                      that reads the running .venv's packages (hack/lock.py OVERLAYS)
#   bash hack/setup.sh --perf-analyzer step 10 only (Triton's perf_analyzer)
#
# Steps:
#   1. Python >= 3.11, .venv: the lock, requirements/lock.txt (`pip install --require-hashes`: every
#      dependency and test tool at its locked version, each file checked against its sha256), then
#      kubeinfer itself (`pip install --no-deps --no-build-isolation -e .`), when pyproject.toml or the
#      lock changed (stamp). `make lock` (hack/lock.py) rewrites the lock from pyproject.toml's ranges.
#   2. Debian's prometheus (/usr/bin/prometheus) via apt-get when absent; no service left running.
#   3. Debian packages the node needs (runc, CNI plugins, buildah, debootstrap, iptables, nftables,
#      conntrack) via apt-get when one of their commands is absent (hack/setup-node.sh).
#   4. Go toolchain check (clear message when missing).
#   5. Kubernetes binaries from hack/go.mod into .cache/bin/: etcd, kube-apiserver,
#      kube-controller-manager, kubectl, helm (control plane) and kube-scheduler, kubelet,
#      kube-proxy (node).
#   6. Node binaries from hack/node-tools/go.mod into .cache/bin/: containerd, containerd-shim-runc-v2,
#      ctr, crictl, coredns (hack/setup-node.sh).
#   7. Prometheus with kubernetes_sd from hack/prometheus/go.mod into .cache/bin/prometheus (the node's
#      Prometheus: Debian's package is built without kubernetes_sd) (hack/setup-node.sh).
#   8. The storage servers the model-source tests start, from hack/storage-tools/go.mod into
#      .cache/bin/: minio (an S3-compatible object store) and crane (`crane registry serve`, an OCI
#      registry, and the client that pushes model images to it).
#   9. Test clients that cannot share .venv (their pins conflict with the lock; hack/lock.py TOOLS):
#      .cache/kserve-client, the KServe Python SDK, from requirements/kserve-client.txt
#      (`uv pip install --require-hashes`), when that file or .venv's Python changed (stamp).
#  10. Triton's perf_analyzer, a test client: the perf-analyzer wheel and a Debian trixie glibc/libstdc++
#      sysroot for its binary (newer than bookworm's), every file pinned with its sha256 in
#      hack/perf-analyzer.pins, into .cache/perf-analyzer/; the wrapper .cache/bin/perf_analyzer runs the
#      binary through the sysroot's dynamic loader. Redone when that file changed (stamp).
#   Steps 5 to 8 rebuild a binary only when its inputs changed (the module's go.mod/go.sum, its
#   local main package, its build flags) or it is missing: one stamp per binary.
#
# Versions are pinned in the go.mod files only; the version ldflags are derived from them.
# Stamps live in .cache/stamps/; logs of the Go builds in .cache/logs/.
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
  --peers) MODE="peers" ;;
  --bench-granian) MODE="bench-granian" ;;
  --perf-analyzer) MODE="perf-analyzer" ;;
  "") ;;
  *) echo "usage: $0 [--python-only|--binaries-only|--peers|--bench-granian|--perf-analyzer]" >&2; exit 2 ;;
esac

TOTAL=10
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
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# ---------------------------------------------------------------- 1. python
setup_python() {
  step 1 "python: .venv from requirements/lock.txt and the kubeinfer package"
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
  local want; want="$(hash_of pyproject.toml requirements/lock.txt)"
  if [ "$(cat "$STAMPS/python" 2>/dev/null || true)" != "$want" ] \
      || ! .venv/bin/python -c 'import kubeinfer' 2>/dev/null; then
    # -P: without it the repository root is sys.path[0] and its operator/ shadows the stdlib module
    # in a venv that has no kubeinfer yet (pip then fails at import time on a fresh clone).
    # Packages the lock does not name are left alone (pip installs, it does not sync).
    echo "  pip install --require-hashes -r requirements/lock.txt"
    .venv/bin/python -P -m pip install --disable-pip-version-check -q --require-hashes --only-binary :all: \
      -r requirements/lock.txt
    echo "  pip install --no-deps --no-build-isolation -e ."
    .venv/bin/python -P -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
    echo "$want" > "$STAMPS/python"
  else
    echo "  up to date (pyproject.toml and requirements/lock.txt unchanged)"
  fi
}

# A venv made through another path to the same directory (a git worktree whose .cache is a symlink to
# this one) names that path in its scripts' interpreter lines, and once that path is gone every script
# fails with "No such file or directory": point those lines at this directory's python (its only
# absolute path that a script runs by; pyvenv.cfg names the base interpreter, not the venv).
repoint_scripts() {
  local dir="$1" f line n=0
  for f in "$dir"/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    IFS= read -r line < "$f" 2>/dev/null || continue
    case "$line" in
      "#!$dir/bin/python"*) ;;
      "#!"/*/bin/python*)
        sed -i "1s|^#!.*/bin/python|#!$dir/bin/python|" "$f"
        n=$((n + 1)) ;;
    esac
  done
  if [ "$n" -gt 0 ]; then echo "  $(basename "$dir"): $n scripts pointed at $dir/bin/python"; fi
}

# ---------------------------------------------------------------- 8. test client venvs
# One venv per client in .cache/NAME, from requirements/NAME.txt (every file pinned and hashed; `make
# lock` compiles it alone from NAME.in). Rebuilt from scratch (--clear) when the file or .venv's
# Python changed, so a half-built venv from an interrupted run is never taken as done.
install_envs() {
  local name dir want s
  for name in "$@"; do
    dir="$CACHE/$name"
    want="$( { cat "requirements/$name.txt"; .venv/bin/python -VV; } | sha256sum | cut -c1-16)"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$STAMPS/$name" 2>/dev/null || true)" = "$want" ]; then
      echo "  $name: up to date (requirements/$name.txt unchanged)"
      repoint_scripts "$dir"
      continue
    fi
    s=$(date +%s)
    echo "  $name: python -m venv --clear .cache/$name; uv pip install --require-hashes -r requirements/$name.txt"
    rm -f "$STAMPS/$name"
    .venv/bin/python -P -m venv --clear "$dir"
    # uv (the lock's, in .venv), not the venv's pip 23: pip resolves a dependency's extra (kserve's
    # uvicorn[standard]>=0.30.6,<1) apart from its pin, takes the newest release and then refuses it
    # under --require-hashes as unpinned, so a release after the file was compiled broke the install.
    .venv/bin/uv pip install --quiet --python "$dir/bin/python" --require-hashes --only-binary :all: \
      -r "requirements/$name.txt" || die "uv pip install -r requirements/$name.txt into .cache/$name failed"
    echo "$want" > "$STAMPS/$name"
    echo "  $name: installed in $(( $(date +%s) - s ))s"
  done
}
TOOL_ENVS=(kserve-client)
setup_tool_envs() {
  step 9 "test clients: .cache/kserve-client (KServe Python SDK) from requirements/kserve-client.txt"
  install_envs "${TOOL_ENVS[@]}"
}
# The peers of `make bench-peers` (hack/lock.py PEERS): not installed by a plain `make setup`, which
# the tests need; each is a few GB (torch and its CUDA wheels again) and a few minutes.
PEER_ENVS=(peer-mlserver peer-litserve peer-infinity)
setup_peer_envs() {
  echo "[setup peers] bench-peers servers: .cache/peer-mlserver (MLServer), .cache/peer-litserve (LitServe),"
  echo "  .cache/peer-infinity (infinity-emb)"
  install_envs "${PEER_ENVS[@]}"
}

# Benchmark overlays (hack/lock.py OVERLAYS): a venv .cache/NAME with only what requirements/NAME.txt
# adds (compiled with the lock as constraints) and a .pth file that, when KUBEINFER_BENCH_SITE_PACKAGES
# names directories (os.pathsep-separated), adds each after the venv's own packages with
# site.addsitedir, so their .pth files run too (kubeinfer's editable install). The benchmark sets it to
# the site-packages of the .venv it runs from: the venv is shared by the git worktrees whose .cache is
# a symlink to this one, each of which brings its own .venv and checkout. A venv made with
# --system-site-packages would see the base interpreter's packages, not .venv's (itself a venv).
OVERLAY_PTH='import os, site; list(map(site.addsitedir, filter(None, os.environ.get("KUBEINFER_BENCH_SITE_PACKAGES", "").split(os.pathsep))))'
OVERLAY_ENVS=(bench-granian)
setup_overlay_envs() {
  echo "[setup bench-granian] .cache/bench-granian (granian, over .venv's packages) for make bench-frontend"
  install_envs "${OVERLAY_ENVS[@]}"
  local name site
  for name in "${OVERLAY_ENVS[@]}"; do
    site="$("$CACHE/$name/bin/python" -P -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    printf '%s\n' "$OVERLAY_PTH" > "$site/_kubeinfer_bench_overlay.pth"
  done
}

# ---------------------------------------------------------------- 10. perf_analyzer
# The wheel through pip (by version, --require-hashes), the .debs from Debian's archive by their pool
# path (sha256sum -c), each as hack/perf-analyzer.pins names it; unpacked into a new directory that
# replaces the old one only when complete, so an interrupted run is never taken as done.
PA_PINS="hack/perf-analyzer.pins"
PA_DIR="$CACHE/perf-analyzer"
DEBIAN_ARCHIVE="https://deb.debian.org/debian"
# The wrapper: ld.so of the sysroot loads the binary with the sysroot's libc, libstdc++ and libgcc_s
# (--library-path comes before the machine's directories); every argument is passed on. Its own
# directory is found at run time, so it works through the .cache symlink of a git worktree too.
PA_WRAPPER='#!/bin/sh
# Triton'"'"'s perf_analyzer (the perf-analyzer wheel), written by hack/setup.sh step 10: its binary needs
# glibc >= 2.38, so it runs through the dynamic loader of the Debian trixie sysroot in .cache/perf-analyzer.
pa="$(dirname "$(readlink -f "$0")")/../perf-analyzer"
exec "$pa/sysroot/usr/lib64/ld-linux-x86-64.so.2" --argv0 perf_analyzer \
  --library-path "$pa/sysroot/usr/lib/x86_64-linux-gnu" "$pa/wheel/perf_analyzer/bin/perf_analyzer" "$@"
'
setup_perf_analyzer() {
  step 10 "perf_analyzer: the perf-analyzer wheel + a Debian trixie glibc sysroot ($PA_PINS) -> .cache/bin/perf_analyzer"
  local want; want="$( { cat "$PA_PINS"; echo "$PA_WRAPPER"; } | sha256sum | cut -c1-16)"
  if [ "$(cat "$STAMPS/perf-analyzer" 2>/dev/null || true)" = "$want" ] && [ -x "$BIN/perf_analyzer" ] \
      && "$BIN/perf_analyzer" --version >/dev/null 2>&1; then
    echo "  up to date ($PA_PINS unchanged): $("$BIN/perf_analyzer" --version 2>&1 | head -1)"
    return
  fi
  local s new kind name version sha file n=0; s=$(date +%s)
  rm -f "$STAMPS/perf-analyzer"
  new="$PA_DIR.new"
  rm -rf "$new" && mkdir -p "$new/download" "$new/wheel" "$new/sysroot"
  while read -r kind name version sha file; do
    case "$kind" in
      wheel)
        echo "  pip download $name==$version (--platform manylinux_2_38_x86_64, --require-hashes)"
        echo "$name==$version --hash=sha256:$sha" > "$new/download/requirements.txt"
        .venv/bin/python -P -m pip download --disable-pip-version-check -q --no-deps --only-binary :all: \
          --platform manylinux_2_38_x86_64 --python-version 3.11 --require-hashes \
          -r "$new/download/requirements.txt" -d "$new/download" || die "pip download $name==$version failed"
        echo "$sha  $new/download/$file" | sha256sum -c --quiet - || die "$file: sha256 is not $sha"
        .venv/bin/python -P -m zipfile -e "$new/download/$file" "$new/wheel" || die "unzip $file failed"
        chmod +x "$new/wheel/perf_analyzer/bin/perf_analyzer" ;;
      deb)
        echo "  $name $version: ${file##*/}"
        curl -fsSL --retry 3 -o "$new/download/${file##*/}" "$DEBIAN_ARCHIVE/$file" \
          || die "download of $DEBIAN_ARCHIVE/$file failed (a 404: a trixie point release replaced $name $version; re-pin $PA_PINS as it says)"
        echo "$sha  $new/download/${file##*/}" | sha256sum -c --quiet - \
          || die "${file##*/}: sha256 is not $sha ($PA_PINS)"
        dpkg-deb -x "$new/download/${file##*/}" "$new/sysroot" || die "dpkg-deb -x ${file##*/} failed" ;;
      *) die "$PA_PINS: unknown kind '$kind'" ;;
    esac
    n=$((n + 1))
  done < <(grep -Ev '^[[:space:]]*(#|$)' "$PA_PINS")
  [ "$n" -gt 0 ] || die "$PA_PINS names nothing"
  rm -rf "$new/download"
  rm -rf "$PA_DIR" && mv "$new" "$PA_DIR"
  printf '%s' "$PA_WRAPPER" > "$BIN/perf_analyzer.tmp" && chmod +x "$BIN/perf_analyzer.tmp"
  mv -f "$BIN/perf_analyzer.tmp" "$BIN/perf_analyzer"
  local version_line
  version_line="$("$BIN/perf_analyzer" --version 2>&1)" || die "perf_analyzer --version failed: $version_line"
  echo "$want" > "$STAMPS/perf-analyzer"
  echo "  installed in $(( $(date +%s) - s ))s ($(du -sh "$PA_DIR" | cut -f1)): $version_line"
}

# ---------------------------------------------------------------- apt (steps 2 and 3)
# apt_install PKG...: apt-get install without starting any service (policy-rc.d answers 101, "action
# not allowed", to Debian's maintainer scripts where an init exists), then stop one that some init
# started anyway: the tests and the local cluster start their own processes.
APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install the Debian packages $* by hand"
  local log="$LOGS/apt.log"
  if [ "$APT_UPDATED" = 0 ]; then
    echo "  apt-get update (log: ${log#"$ROOT"/})"
    $SUDO apt-get update -qq >>"$log" 2>&1 || { tail -20 "$log" >&2; die "apt-get update failed"; }
    APT_UPDATED=1
  fi
  echo "  apt-get install $*"
  local prc=/usr/sbin/policy-rc.d created_prc=0 rc=0 s; s=$(date +%s)
  if [ ! -e "$prc" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$prc" >/dev/null; $SUDO chmod +x "$prc"; created_prc=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1 \
    || rc=$?
  [ "$created_prc" = 1 ] && $SUDO rm -f "$prc"
  [ "$rc" = 0 ] || { tail -20 "$log" >&2; die "apt-get install $* failed (log: ${log#"$ROOT"/})"; }
  echo "  installed in $(( $(date +%s) - s ))s"
  if command -v systemctl >/dev/null 2>&1; then
    local svc
    for svc in "$@"; do
      if systemctl is-active --quiet "$svc" 2>/dev/null; then
        $SUDO systemctl stop "$svc" || true
        $SUDO systemctl disable "$svc" >/dev/null 2>&1 || true
      fi
    done
  fi
}

# ---------------------------------------------------------------- 2. prometheus
setup_prometheus() {
  step 2 "prometheus: Debian package (/usr/bin/prometheus)"
  if [ -x /usr/bin/prometheus ]; then
    echo "  present: $(/usr/bin/prometheus --version 2>&1 | head -1)"
    return
  fi
  apt_install prometheus
  [ -x /usr/bin/prometheus ] || die "prometheus package installed but /usr/bin/prometheus missing"
  echo "  installed: $(/usr/bin/prometheus --version 2>&1 | head -1)"
}

# ---------------------------------------------------------------- 3. node packages: hack/setup-node.sh
# ---------------------------------------------------------------- 4. go
setup_go() {
  step 4 "go toolchain"
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"   # the official tarball's place, when not on PATH
  fi
  if ! command -v go >/dev/null 2>&1; then
    if go_binaries_up_to_date; then
      echo "  go not found, but the binaries in .cache/bin are up to date: not needed"
      return
    fi
    die "the Go toolchain is missing (need go >= $(awk '/^go /{print $2}' hack/node-tools/go.mod), as in hack/node-tools/go.mod).
  It builds etcd, the Kubernetes binaries, helm, containerd, crictl and CoreDNS from the Go module proxy.
  Install it (e.g. 'apt-get install golang-go' if new enough, or the official tarball) and put 'go' on PATH."
  fi
  echo "  $(go version)"
}

# ---------------------------------------------------------------- Go builds (steps 5 and 6)
# modver DIR MODULE: the version of MODULE that DIR/go.mod selects (a replace's target wins).
modver() {
  awk -v m="$2" '
    { sub(/^(require|replace)[ \t]+/, "") }
    $1 == m && $2 == "=>" { r = $NF }
    $1 == m && $2 ~ /^v/  { v = $2 }
    END { print (r != "" ? r : v) }' "$1/go.mod"
}
# A target is "name=package"; per-binary build tags and CGO_ENABLED come from the associative
# arrays TAGS and CGO (unset: no tags, Go's default cgo setting).
declare -A TAGS=() CGO=()

# go_stamp DIR LDFLAGS TARGET: what one binary is built from.
go_stamp() {
  local dir="$1" ld="$2" name="${3%%=*}" pkg="${3#*=}"
  {
    cat "$dir/go.mod" "$dir/go.sum"
    case "$pkg" in ./*) cat "$dir/${pkg#./}"/*.go ;; esac
    echo "$pkg|$ld|${TAGS[$name]:-}|${CGO[$name]:-default}"
  } | sha256sum | cut -c1-16
}
go_target_up_to_date() {
  local name="${3%%=*}"
  [ -x "$BIN/$name" ] && [ "$(cat "$STAMPS/bin-$name" 2>/dev/null || true)" = "$(go_stamp "$@")" ]
}

# go_build STEP TITLE DIR LDFLAGS TARGET...: build the targets that are not up to date, in order,
# with per-binary time and size.
go_build() {
  local stepno="$1" title="$2" dir="$3" ld="$4"; shift 4
  step "$stepno" "$title"
  local t todo=()
  for t in "$@"; do go_target_up_to_date "$dir" "$ld" "$t" || todo+=("$t"); done
  if [ "${#todo[@]}" = 0 ]; then
    echo "  up to date ($dir/go.mod, go.sum and build flags unchanged): ${*%%=*}"
    return
  fi
  local jobs="${KUBEINFER_BUILD_JOBS:-2}" log="$LOGS/go-build-$(basename "$dir").log"
  echo "  building ${todo[*]%%=*} with go build -p $jobs (log: ${log#"$ROOT"/}); a cold build takes a long time"
  : > "$log"
  local i=0 name pkg s tags cgo
  for t in "${todo[@]}"; do
    i=$((i + 1)); name="${t%%=*}"; pkg="${t#*=}"
    tags="${TAGS[$name]:-}"; cgo="${CGO[$name]:-$(go env CGO_ENABLED)}"
    s=$(date +%s)
    echo "  [$i/${#todo[@]}] $name ($pkg${tags:+, tags: $tags}) ..."
    echo "=== $name: CGO_ENABLED=$cgo go build -tags '$tags' $pkg" >>"$log"
    if ! (cd "$dir" && CGO_ENABLED="$cgo" nice -n 10 go build -p "$jobs" -trimpath -tags "$tags" \
          -ldflags "$ld" -o "$BIN/$name.tmp" "$pkg") >>"$log" 2>&1; then
      tail -30 "$log" >&2
      die "go build of $name failed (full log: ${log#"$ROOT"/})"
    fi
    mv -f "$BIN/$name.tmp" "$BIN/$name"
    go_stamp "$dir" "$ld" "$t" > "$STAMPS/bin-$name"
    echo "  [$i/${#todo[@]}] $name built in $(( $(date +%s) - s ))s ($(du -h "$BIN/$name" | cut -f1))"
  done
}

# ---------------------------------------------------------------- 5. kubernetes binaries
# Pinned versions: hack/go.mod (k8s.io/kubernetes, its staging modules, etcd, helm). The version
# ldflags make the API server, kubelet and kubectl report the pinned version (Helm's kubeVersion
# checks read it); buildDate is fixed so that the link is reproducible and cached.
BUILD_DATE="2026-01-01T00:00:00Z"
K8S_TARGETS=(
  "etcd=./cmd/etcd"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubectl=k8s.io/kubernetes/cmd/kubectl"
  "helm=helm.sh/helm/v3/cmd/helm"
  "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler"
  "kubelet=k8s.io/kubernetes/cmd/kubelet"
  "kube-proxy=k8s.io/kubernetes/cmd/kube-proxy"
)
k8s_ldflags() {
  local k8s helm cg p maj min ld="-s -w"
  k8s="$(modver hack k8s.io/kubernetes)"; helm="$(modver hack helm.sh/helm/v3)"
  cg="$(modver hack k8s.io/client-go)"
  [ -n "$k8s" ] && [ -n "$helm" ] && [ -n "$cg" ] || die "hack/go.mod: k8s.io/kubernetes, helm or client-go not found"
  IFS=. read -r maj min _ <<<"${k8s#v}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$k8s -X $p.gitMajor=$maj -X $p.gitMinor=$min"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  ld+=" -X helm.sh/helm/v3/internal/version.version=$helm"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  # Helm's default Kubernetes version (without a cluster: `helm template`, `helm lint`) is v1.20
  # unless set at link time; helm's Makefile sets it from client-go: v0.X.Y -> 1.X.
  IFS=. read -r maj min _ <<<"${cg#v}"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $p.k8sVersionMajor=$((maj + 1)) -X $p.k8sVersionMinor=$min"
  done
  echo "$ld"
}
setup_k8s_binaries() {
  go_build 5 "kubernetes binaries (control plane, node) and helm -> .cache/bin/" hack "$(k8s_ldflags)" \
    "${K8S_TARGETS[@]}"
}

# ---------------------------------------------------------------- 3 and 6: the node
# shellcheck source=hack/setup-node.sh
source "$ROOT/hack/setup-node.sh"

go_binaries_up_to_date() {
  local t ld
  ld="$(k8s_ldflags)"
  for t in "${K8S_TARGETS[@]}"; do go_target_up_to_date hack "$ld" "$t" || return 1; done
  ld="$(node_ldflags)"
  for t in "${NODE_TARGETS[@]}"; do go_target_up_to_date hack/node-tools "$ld" "$t" || return 1; done
  for t in "${STORAGE_TARGETS[@]}"; do go_target_up_to_date hack/storage-tools "-s -w" "$t" || return 1; done
}

# ---------------------------------------------------------------- 8. storage servers for the tests
# Real servers for the model-source tests (s3:// and oci://), built like the node's binaries: MinIO
# (github.com/minio/minio: its releases are not semver tags, so go.mod pins a pseudo-version) and
# go-containerregistry's crane. Static, no cgo. No version ldflags: MinIO parses its Version as a
# release timestamp (its own build sets one), and its default DEVELOPMENT.GOGET is what it expects
# from a `go build` of the module.
STORAGE_TARGETS=(
  "minio=github.com/minio/minio"
  "crane=github.com/google/go-containerregistry/cmd/crane"
)
CGO[minio]=0
CGO[crane]=0
setup_storage_tools() {
  go_build 8 "storage servers for the tests (minio, crane) -> .cache/bin/" hack/storage-tools \
    "-s -w" "${STORAGE_TARGETS[@]}"
}

case "$MODE" in
  python) setup_python ;;
  peers) setup_peer_envs ;;
  bench-granian) setup_overlay_envs ;;
  perf-analyzer) setup_perf_analyzer ;;
  binaries) setup_go; setup_k8s_binaries; setup_node_binaries; setup_node_prometheus; setup_storage_tools ;;
  all) setup_python; setup_prometheus; setup_node_packages; setup_go; setup_k8s_binaries; setup_node_binaries
       setup_node_prometheus; setup_storage_tools; setup_tool_envs; setup_perf_analyzer ;;
esac
echo "[setup] done in $(( $(date +%s) - T0 ))s"
