// Command etcd is etcd's own server main, built from go.etcd.io/etcd/server/v3 at the version that
// k8s.io/kubernetes v1.37.2 requires, so the local control plane does not depend on Debian's etcd
// (3.4, too old for kube-apiserver 1.37).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
