// Command coredns is CoreDNS with only the plugins the local cluster's DNS needs, run as a node
// process (`coredns -conf Corefile`, the kubernetes plugin reading a kubeconfig). CoreDNS's own
// main imports every plugin (route53, azure, clouddns, ... and their cloud SDKs); this one imports
// a dozen and sets the directive list to match, in CoreDNS's plugin.cfg order (the order plugins
// run in, whatever the order in the Corefile).
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives is the subset of CoreDNS's plugin.cfg (core/dnsserver/zdirectives.go) imported above,
// in the same relative order. "prometheus" is the metrics plugin's directive; "bind" keeps the
// listener on the node's address (hack/node.py), not on every interface of the machine.
var directives = []string{
	"reload",
	"bind",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"hosts",
	"kubernetes",
	"loop",
	"forward",
}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	coremain.Run()
}
