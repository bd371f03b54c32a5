// Command field_ownership runs one server-side-apply field-manager step (an apply, or an update
// that is not an apply) on one object with the upstream structured-merge-diff library
// (sigs.k8s.io/structured-merge-diff/v4, the code the Kubernetes API server's field manager calls:
// k8s.io/apimachinery pkg/util/managedfields/internal/structuredmerge.go), so tests can see which
// manager owns a field and whether an apply conflicts, without an API server.
//
// One JSON request on stdin, one JSON answer on stdout:
//
//	request:  {"op": "apply"|"update", "manager": "helm", "force": false, "apiVersion": "keda.sh/v1alpha1",
//	           "live": {...} (null: the object is being created), "object": {...} (apply: the applied
//	           configuration; update: the object after the update), "managedFields": [...]}
//	answer:   {"object": {...}, "managedFields": [...]} or {"conflicts": ["<manager>: <path>", ...]}
//
// What the API server adds around the library, and this command does too (apimachinery v0.36.3,
// pkg/util/managedfields/internal): a manager's identifier is its entry without the fields, the
// time and, for an apply, the API version (managedfields.go BuildManagerIdentifier); an update is
// recorded under "current-operation" and then merged into the manager's own entry when it changed
// anything (managedfieldsupdater.go); metadata and type fields are never owned (stripmeta.go).
// Objects are typed by deduction (typed.DeducedParseableType: maps granular, lists atomic), not
// from the CRD's schema.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/structured-merge-diff/v4/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v4/merge"
	"sigs.k8s.io/structured-merge-diff/v4/typed"
)

type entry struct {
	Manager     string          `json:"manager"`
	Operation   string          `json:"operation"`
	APIVersion  string          `json:"apiVersion,omitempty"`
	Time        string          `json:"time,omitempty"`
	FieldsType  string          `json:"fieldsType,omitempty"`
	FieldsV1    json.RawMessage `json:"fieldsV1,omitempty"`
	Subresource string          `json:"subresource,omitempty"`
}

type identifier struct {
	Manager     string `json:"manager"`
	Operation   string `json:"operation"`
	APIVersion  string `json:"apiVersion,omitempty"`
	Subresource string `json:"subresource,omitempty"`
}

type request struct {
	Op         string                 `json:"op"`
	Manager    string                 `json:"manager"`
	Force      bool                   `json:"force"`
	APIVersion string                 `json:"apiVersion"`
	Live       map[string]interface{} `json:"live"`
	Object     map[string]interface{} `json:"object"`
	Managed    []entry                `json:"managedFields"`
}

type answer struct {
	Object    map[string]interface{} `json:"object,omitempty"`
	Managed   []entry                `json:"managedFields"`
	Conflicts []string               `json:"conflicts,omitempty"`
}

type sameVersion struct{}

func (sameVersion) Convert(v *typed.TypedValue, _ fieldpath.APIVersion) (*typed.TypedValue, error) {
	return v, nil
}
func (sameVersion) IsMissingVersionError(error) bool { return false }

var stripped = fieldpath.NewSet(
	fieldpath.MakePathOrDie("apiVersion"),
	fieldpath.MakePathOrDie("kind"),
	fieldpath.MakePathOrDie("metadata"),
	fieldpath.MakePathOrDie("metadata", "name"),
	fieldpath.MakePathOrDie("metadata", "namespace"),
	fieldpath.MakePathOrDie("metadata", "creationTimestamp"),
	fieldpath.MakePathOrDie("metadata", "selfLink"),
	fieldpath.MakePathOrDie("metadata", "uid"),
	fieldpath.MakePathOrDie("metadata", "clusterName"),
	fieldpath.MakePathOrDie("metadata", "generation"),
	fieldpath.MakePathOrDie("metadata", "managedFields"),
	fieldpath.MakePathOrDie("metadata", "resourceVersion"),
)

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fail("request: %v", err)
	}
	managers := fieldpath.ManagedFields{}
	times := map[string]string{}
	for _, e := range req.Managed {
		set := &fieldpath.Set{}
		if len(e.FieldsV1) > 0 {
			if err := set.FromJSON(bytes.NewReader(e.FieldsV1)); err != nil {
				fail("managedFields entry %q: fieldsV1: %v", e.Manager, err)
			}
		}
		id := key(e.Manager, e.Operation, e.APIVersion, e.Subresource)
		managers[id] = fieldpath.NewVersionedSet(set, fieldpath.APIVersion(e.APIVersion), e.Operation == "Apply")
		times[id] = e.Time
	}
	live := req.Live
	if live == nil {
		live = map[string]interface{}{}
	}
	liveTyped := typedOf(live)
	updater := merge.Updater{Converter: sameVersion{}}
	version := fieldpath.APIVersion(req.APIVersion)
	result := req.Object
	var err error
	switch req.Op {
	case "apply":
		id := key(req.Manager, "Apply", "", "")
		var merged *typed.TypedValue
		merged, managers, err = updater.Apply(liveTyped, typedOf(req.Object), version, managers, id, req.Force)
		if conflicts, ok := err.(merge.Conflicts); ok {
			out := []string{}
			for _, c := range conflicts {
				out = append(out, fmt.Sprintf("%s: %s", managerName(c.Manager), c.Path.String()))
			}
			sort.Strings(out)
			emit(answer{Conflicts: out, Managed: req.Managed})
			return
		}
		if err != nil {
			fail("apply: %v", err)
		}
		strip(managers, id)
		times[id] = "now"
		if merged == nil {
			result = live
		} else {
			result = merged.AsValue().Unstructured().(map[string]interface{})
		}
	case "update":
		const current = "current-operation"
		_, managers, err = updater.Update(liveTyped, typedOf(req.Object), version, managers, current)
		if err != nil {
			fail("update: %v", err)
		}
		id := key(req.Manager, "Update", req.APIVersion, "")
		if vs, ok := managers[current]; ok {
			delete(managers, current)
			if previous, ok := managers[id]; ok {
				vs = fieldpath.NewVersionedSet(vs.Set().Union(previous.Set()), vs.APIVersion(), vs.Applied())
			}
			managers[id] = vs
			strip(managers, id)
			times[id] = "now"
		}
	default:
		fail("op %q: want apply or update", req.Op)
	}
	emit(answer{Object: result, Managed: encode(managers, times)})
}

func key(manager, operation, apiVersion, subresource string) string {
	if operation == "Apply" {
		apiVersion = ""
	}
	b, _ := json.Marshal(identifier{manager, operation, apiVersion, subresource})
	return string(b)
}

func managerName(id string) string {
	var ident identifier
	if json.Unmarshal([]byte(id), &ident) != nil {
		return id
	}
	return ident.Manager
}

func strip(managers fieldpath.ManagedFields, id string) {
	vs := managers[id]
	set := vs.Set().Difference(stripped)
	if set.Empty() {
		delete(managers, id)
		return
	}
	managers[id] = fieldpath.NewVersionedSet(set, vs.APIVersion(), vs.Applied())
}

func encode(managers fieldpath.ManagedFields, times map[string]string) []entry {
	out := []entry{}
	for id, vs := range managers {
		if vs.Set().Empty() {
			continue
		}
		var ident identifier
		if err := json.Unmarshal([]byte(id), &ident); err != nil {
			fail("manager %q: %v", id, err)
		}
		fields, err := vs.Set().ToJSON()
		if err != nil {
			fail("manager %q: fields: %v", id, err)
		}
		apiVersion := ident.APIVersion
		if apiVersion == "" {
			apiVersion = string(vs.APIVersion())
		}
		out = append(out, entry{Manager: ident.Manager, Operation: ident.Operation, APIVersion: apiVersion,
			Time: times[id], FieldsType: "FieldsV1", FieldsV1: fields, Subresource: ident.Subresource})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Operation != out[j].Operation {
			return out[i].Operation < out[j].Operation
		}
		return strings.Compare(out[i].Manager, out[j].Manager) < 0
	})
	return out
}

func typedOf(obj map[string]interface{}) *typed.TypedValue {
	tv, err := typed.DeducedParseableType.FromUnstructured(obj)
	if err != nil {
		fail("object: %v", err)
	}
	return tv
}

func emit(a answer) {
	if err := json.NewEncoder(os.Stdout).Encode(a); err != nil {
		fail("answer: %v", err)
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "field_ownership: "+format+"\n", args...)
	os.Exit(2)
}
