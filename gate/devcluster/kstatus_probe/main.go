// kstatus-probe judges Kubernetes objects with kstatus, the status library of
// sigs.k8s.io/cli-utils that Flux, kpt and cli-utils use, so NodeGate's tests
// ask the real evaluator rather than a re-implementation of its rules.
//
// It reads JSON from stdin: one object, a JSON array of objects, or a List
// (`kubectl get -o json` prints one). For each object it prints one JSON line:
// {"kind", "name", "status", "message", "conditions"}, where status is what
// status.Compute returned (InProgress, Current, Failed, Terminating, ...).
// Exit code 2 means the input could not be read, 3 that Compute failed.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Kind       string             `json:"kind"`
	Name       string             `json:"name"`
	Status     string             `json:"status"`
	Message    string             `json:"message"`
	Conditions []status.Condition `json:"conditions"`
}

// objects decodes stdin as the API machinery does (apimachinery's util/json keeps integers int64,
// which unstructured's accessors insist on; encoding/json would make them float64).
func objects(raw []byte) ([]map[string]interface{}, error) {
	var doc interface{}
	if err := utiljson.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("stdin is not JSON: %w", err)
	}
	var items []interface{}
	switch v := doc.(type) {
	case []interface{}:
		items = v
	case map[string]interface{}:
		if list, ok := v["items"].([]interface{}); ok {
			items = list
		} else {
			items = []interface{}{v}
		}
	default:
		return nil, fmt.Errorf("stdin is neither a JSON object nor an array of objects")
	}
	objs := make([]map[string]interface{}, 0, len(items))
	for i, item := range items {
		obj, ok := item.(map[string]interface{})
		if !ok {
			return nil, fmt.Errorf("item %d is not an object", i)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-probe: reading stdin: %v\n", err)
		os.Exit(2)
	}
	objs, err := objects(raw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-probe: %v\n", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objs {
		u := &unstructured.Unstructured{Object: obj}
		res, err := status.Compute(u)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus-probe: %s %s: %v\n", u.GetKind(), u.GetName(), err)
			os.Exit(3)
		}
		conditions := res.Conditions
		if conditions == nil {
			conditions = []status.Condition{}
		}
		_ = out.Encode(verdict{Kind: u.GetKind(), Name: u.GetName(), Status: res.Status.String(),
			Message: res.Message, Conditions: conditions})
	}
}
