package outputapi

import (
	extopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// OpenAPI model names of the API's types.
const (
	modelBashTask     = "dev.bashtask.output.v1alpha1.BashTask"
	modelOutputStatus = "dev.bashtask.output.v1alpha1.BashTaskOutputStatus"
	modelLogOptions   = "dev.bashtask.output.v1alpha1.LogOptions"
	modelStdinOptions = "dev.bashtask.output.v1alpha1.StdinOptions"
	modelObjectMeta   = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
)

// OpenAPIModelName names the type in the OpenAPI document.
func (BashTask) OpenAPIModelName() string { return modelBashTask }

// OpenAPIModelName names the type in the OpenAPI document.
func (BashTaskOutputStatus) OpenAPIModelName() string { return modelOutputStatus }

// OpenAPIModelName names the type in the OpenAPI document.
func (LogOptions) OpenAPIModelName() string { return modelLogOptions }

// OpenAPIModelName names the type in the OpenAPI document.
func (StdinOptions) OpenAPIModelName() string { return modelStdinOptions }

func str(desc string) spec.Schema {
	return spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}, Description: desc}}
}

func integer(desc string) spec.Schema {
	return spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"integer"}, Format: "int64", Description: desc}}
}

func boolean(desc string) spec.Schema {
	return spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"boolean"}, Description: desc}}
}

// openAPIDefinitions are the schemas of the API's types, written by hand
// (four small types), and those of the meta types they refer to. The
// server needs them: server-side apply's type converter is built from them
// whether or not a resource accepts writes.
func openAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := extopenapi.GetOpenAPIDefinitions(ref)
	defs[modelBashTask] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{
			Description: "BashTask is the output API's view of a bashtask.dev BashTask.",
			Type:        []string{"object"},
			Properties: map[string]spec.Schema{
				"apiVersion": str("APIVersion of the object."),
				"kind":       str("Kind of the object."),
				"metadata":   {SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(modelObjectMeta)}},
				"status":     {SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(modelOutputStatus)}},
			},
		}},
		Dependencies: []string{modelObjectMeta, modelOutputStatus},
	}
	defs[modelOutputStatus] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{
			Description: "BashTaskOutputStatus is how much output a task's status reports.",
			Type:        []string{"object"},
			Properties: map[string]spec.Schema{
				"nodeName":    str("The node whose agent runs or ran the task."),
				"stdoutBytes": integer("Bytes of stdout the status reports."),
				"stderrBytes": integer("Bytes of stderr the status reports."),
				"finished":    boolean("True once the task has its terminal reason."),
			},
		}},
	}
	defs[modelLogOptions] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{
			Description: "LogOptions are the query parameters of bashtasks/log.",
			Type:        []string{"object"},
			Properties: map[string]spec.Schema{
				"apiVersion": str("APIVersion of the object."),
				"kind":       str("Kind of the object."),
				"stream":     str("stdout (the default) or stderr."),
				"offset":     integer("The first byte wanted, from the stream's start."),
				"limitBytes": integer("When positive, the most bytes of the body."),
				"follow":     boolean("Keep the response open while the task runs."),
			},
		}},
	}
	defs[modelStdinOptions] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{
			Description: "StdinOptions are the query parameters of bashtasks/stdin.",
			Type:        []string{"object"},
			Properties: map[string]spec.Schema{
				"apiVersion": str("APIVersion of the object."),
				"kind":       str("Kind of the object."),
				"offset":     integer("The input offset of the body's first byte."),
				"close":      boolean("Close the input after the body: the command reads EOF."),
			},
		}},
	}
	return defs
}
