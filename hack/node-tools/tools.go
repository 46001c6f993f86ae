//go:build tools

// Package tools keeps the node commands that hack/setup.sh builds from this module (containerd,
// its runc shim, ctr, crictl) in this module's go.mod. CoreDNS is built from ./cmd/coredns.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
