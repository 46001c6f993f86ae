//go:build tools

// Package tools keeps the control-plane commands built by hack/setup.sh in this module's go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "helm.sh/helm/v3/cmd/helm"
)
