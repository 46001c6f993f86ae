# hack/setup-node.sh — the node parts of hack/setup.sh (sourced by it; not run on its own):
#
#   3. Debian packages the one-node cluster needs, via apt-get when one of their commands is absent.
#   6. containerd (with its CRI plugin), containerd-shim-runc-v2, ctr, crictl and CoreDNS, built from
#      the Go module hack/node-tools/go.mod into .cache/bin/.
#
# Uses step, die, apt_install, modver, go_build, TAGS and CGO from hack/setup.sh.

# ---------------------------------------------------------------- 3. node packages (Debian)
# "command-or-file=package": what the node runs, and the Debian package that provides it.
#   runc                  the OCI runtime containerd's runc shim calls
#   /usr/lib/cni/*        CNI plugins containerd's CRI plugin calls for the pod network
#   iptables, nft         kube-proxy (iptables or nftables mode), the portmap CNI plugin, kubelet
#   conntrack             kube-proxy clears stale UDP conntrack entries with it
#   mount, nsenter        kubelet (volume mounts), containerd
#   ip                    inspecting and cleaning up the pod network
#   buildah, debootstrap  the images (`make images`): the base image is a debootstrap of bookworm
NODE_PACKAGES=(
  "/usr/sbin/runc=runc"
  "/usr/lib/cni/bridge=containernetworking-plugins"
  "/usr/lib/cni/host-local=containernetworking-plugins"
  "/usr/lib/cni/loopback=containernetworking-plugins"
  "/usr/lib/cni/portmap=containernetworking-plugins"
  "/usr/sbin/iptables=iptables"
  "/usr/sbin/iptables-restore=iptables"
  "/usr/sbin/nft=nftables"
  "/usr/sbin/conntrack=conntrack"
  "/usr/bin/mount=mount"
  "/usr/bin/nsenter=util-linux"
  "/usr/bin/ip=iproute2"
  "/usr/bin/buildah=buildah"
  "/usr/sbin/debootstrap=debootstrap"
  "/usr/share/keyrings/debian-archive-keyring.gpg=debian-archive-keyring"
)

setup_node_packages() {
  step 3 "node packages: Debian runc, CNI plugins, buildah, debootstrap, iptables, nftables, conntrack"
  local e path pkg missing=() pkgs=()
  for e in "${NODE_PACKAGES[@]}"; do
    path="${e%%=*}"; pkg="${e#*=}"
    if [ ! -e "$path" ]; then
      missing+=("$path")
      [[ " ${pkgs[*]} " == *" $pkg "* ]] || pkgs+=("$pkg")
    fi
  done
  if [ "${#pkgs[@]}" -gt 0 ]; then
    echo "  missing: ${missing[*]}"
    apt_install "${pkgs[@]}"
    for e in "${NODE_PACKAGES[@]}"; do
      [ -e "${e%%=*}" ] || die "package ${e#*=} installed but ${e%%=*} is missing"
    done
  fi
  echo "  present: runc $(/usr/sbin/runc --version | awk 'NR==1{print $3}'), CNI plugins in /usr/lib/cni" \
       "($(dpkg-query -W -f='${Version}' containernetworking-plugins 2>/dev/null || echo '?'))," \
       "buildah $(/usr/bin/buildah --version | awk '{print $3}'), $(/usr/sbin/iptables --version)," \
       "nft $(/usr/sbin/nft --version | awk '{print $2}'), conntrack $(/usr/sbin/conntrack --version 2>&1 | awk '{print $2}')"
}

# ---------------------------------------------------------------- 6. node binaries (Go)
# Pinned versions: hack/node-tools/go.mod (containerd v2, cri-tools, CoreDNS; one module, so that their
# shared dependencies are compiled once). hack/node-tools/tools.go keeps the containerd and crictl commands
# in it; hack/node-tools/cmd/coredns is CoreDNS with only the plugins the cluster DNS needs.
NODE_TARGETS=(
  "containerd=github.com/containerd/containerd/v2/cmd/containerd"
  "containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
  "ctr=github.com/containerd/containerd/v2/cmd/ctr"
  "crictl=sigs.k8s.io/cri-tools/cmd/crictl"
  "coredns=./cmd/coredns"
)
# containerd's Makefile: urfave_cli_no_docs always, the shim also no_grpc. We leave out the btrfs
# (needs cgo and libbtrfs headers), devmapper and zfs snapshotters; overlayfs and native stay in.
# Everything static (CGO_ENABLED=0), as containerd builds its shim and cri-tools and CoreDNS build
# theirs; nothing here uses cgo on Linux once btrfs is out.
CONTAINERD_TAGS="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
TAGS[containerd]="$CONTAINERD_TAGS"
TAGS[ctr]="$CONTAINERD_TAGS"
TAGS[containerd-shim-runc-v2]="$CONTAINERD_TAGS no_grpc"
CGO[containerd]=0; CGO[containerd-shim-runc-v2]=0; CGO[ctr]=0; CGO[crictl]=0; CGO[coredns]=0

node_ldflags() {
  local ctd cri dns
  ctd="$(modver hack/node-tools github.com/containerd/containerd/v2)"
  cri="$(modver hack/node-tools sigs.k8s.io/cri-tools)"
  dns="$(modver hack/node-tools github.com/coredns/coredns)"
  [ -n "$ctd" ] && [ -n "$cri" ] && [ -n "$dns" ] || die "hack/node-tools/go.mod: containerd, cri-tools or coredns not found"
  local ld="-s -w"
  ld+=" -X github.com/containerd/containerd/v2/version.Version=$ctd"
  ld+=" -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
  ld+=" -X sigs.k8s.io/cri-tools/pkg/version.Version=$cri"   # as its hack/release.sh: the tag
  ld+=" -X github.com/coredns/coredns/coremain.GitCommit=$dns"   # no commit in a module: the version
  echo "$ld"
}
setup_node_binaries() {
  go_build 6 "node binaries (containerd, shim, ctr, crictl, coredns) -> .cache/bin/" hack/node-tools \
    "$(node_ldflags)" "${NODE_TARGETS[@]}"
}

# ---------------------------------------------------------------- 7. the node's Prometheus (Go)
# Debian's prometheus (step 2, used by the integration tests with file_sd) is built without
# kubernetes_sd: Debian's packaging leaves out the Kubernetes discovery (its error: "field
# kubernetes_sd_configs not found"). The one-node cluster's Prometheus discovers the runtime pods
# as on any cluster, so it is built here from the pinned github.com/prometheus/prometheus
# (hack/prometheus/go.mod; v0.3XX.Y is Prometheus 3.XX.Y). No web UI assets (the builtinassets tag
# needs the npm build): the HTTP API, which the operator and the tests use, is complete.
PROMETHEUS_TARGETS=("prometheus=github.com/prometheus/prometheus/cmd/prometheus")
CGO[prometheus]=0

prometheus_ldflags() {
  local v; v="$(modver hack/prometheus github.com/prometheus/prometheus)"
  [ -n "$v" ] || die "hack/prometheus/go.mod: github.com/prometheus/prometheus not found"
  # module v0.316.0 is Prometheus 3.16.0
  local minor="${v#v0.}"; minor="${minor%%.*}"; local patch="${v##*.}"
  local pv="3.$(( minor - 300 )).$patch"
  echo "-s -w -X github.com/prometheus/common/version.Version=$pv -X github.com/prometheus/common/version.Branch=module -X github.com/prometheus/common/version.Revision=$v"
}
setup_node_prometheus() {
  go_build 7 "the node's Prometheus (kubernetes_sd) -> .cache/bin/prometheus" hack/prometheus \
    "$(prometheus_ldflags)" "${PROMETHEUS_TARGETS[@]}"
}
