// Package traceformat is the one definition of how candle-graph/trace/10
// spells things: the schema names, the record kinds and every enum's values.
// The writer (internal/events) and the reader (internal/report/trace) both
// take their spellings from here, and a test holds the Python and Rust
// bindings and docs/trace-format.schema.json to the same lists, so a
// spelling cannot drift between the four.
//
// Enums that the C ABI also has list their spellings in the order of its
// numeric values (include/candle_trace.h), so that the value is the index.
package traceformat

// Schema is the trace format written and read; PreviousSchema is the one
// before it, still read (it has no tensor_stats records).
const (
	Schema         = "candle-graph/trace/10"
	PreviousSchema = "candle-graph/trace/9"
)

// Kinds are the record kinds, the "kind" field of each line.
var Kinds = []string{
	"meta", "span_start", "span_end", "op", "tensor", "tensor_stats", "memory",
	"device_memory", "device_interval", "gradient", "edge", "terminal",
}

// Enums of the C ABI: the spelling of value i is at index i.
var (
	SpanKinds      = []string{"function", "op", "module"}                                  // ct_span_kind
	MemoryActions  = []string{"alloc", "free"}                                             // ct_memory_action
	GradientStates = []string{"present", "zero", "missing", "non_finite"}                  // ct_gradient_state
	Categories     = []string{"other", "parameter", "activation", "gradient", "optimizer"} // ct_category
)

// Steps spells ct_step value i+1 at index i: CT_STEP_NONE (0) writes no
// "step" field at all.
var Steps = []string{"forward", "backward", "optimizer"}

// Enums of the meta record and the capture contract, which the ABI takes as
// JSON text.
var (
	Phases             = []string{"train", "infer"}
	TimingModes        = []string{"host", "device_synchronized"}
	MeasurementScopes  = []string{"unknown", "profiled_work", "production_equivalent"}
	Coverages          = []string{"none", "partial", "complete"}
	FamilyExpectations = []string{"active", "inactive", "data_conditional"}
	Outcomes           = []string{"complete", "failed"} // the terminal record
	EdgeKinds          = []string{"call", "data"}       // the edge record's edge_kind
)

// Index returns the position of s in values, or -1.
func Index(values []string, s string) int {
	for i, v := range values {
		if v == s {
			return i
		}
	}
	return -1
}
