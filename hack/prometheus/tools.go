//go:build tools

// Package tools pins Prometheus for hack/setup.sh: Debian's prometheus package is built without
// kubernetes_sd, which the one-node cluster's Prometheus needs (tests/e2e, the demo).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
