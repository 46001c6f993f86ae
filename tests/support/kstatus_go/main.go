// Command kstatus reads Kubernetes objects (a JSON list) on stdin and prints, per object, the status
// that kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status: Flux and cli-utils read objects through it)
// computes: InProgress, Failed, Current, ... Used by tests/support/kstatus.py.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	var objs []map[string]interface{}
	data, err := io.ReadAll(os.Stdin)
	if err == nil {
		err = kjson.Unmarshal(data, &objs) // integers as int64, as the API machinery expects
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := []map[string]string{}
	for _, o := range objs {
		res, err := status.Compute(&unstructured.Unstructured{Object: o})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out = append(out, map[string]string{"status": res.Status.String(), "message": res.Message})
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
