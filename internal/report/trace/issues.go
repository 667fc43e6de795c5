package trace

import "fmt"

// Severity of a health issue, as in candle-graph's HealthSeverity.
type Severity string

const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Issue is one problem found in a trace. Line is the 1-based line of the
// record that shows the problem (0 when it is a property of the whole trace);
// Count is how many records showed it when they were folded into one issue.
type Issue struct {
	Severity Severity `json:"severity"`
	Code     string   `json:"code"`
	Message  string   `json:"message"`
	Line     int      `json:"line,omitempty"`
	Count    int      `json:"count,omitempty"`
	// Parse is true for problems that make candle-graph reject the file
	// before any health analysis (it produces no document at all).
	Parse bool `json:"parse,omitempty"`
}

func (i Issue) String() string {
	loc := ""
	if i.Line > 0 {
		loc = fmt.Sprintf("line %d: ", i.Line)
	}
	return fmt.Sprintf("%s%s %s: %s", loc, i.Severity, i.Code, i.Message)
}

// Parse-level codes are ours: candle-graph reports these as one anyhow error
// without a code. Each names one rule of its parser.
const (
	CodeInvalidUTF8              = "invalid_utf8"
	CodeLineTooLong              = "line_too_long"
	CodeInvalidJSON              = "invalid_json"
	CodeMissingKind              = "missing_kind"
	CodeUnknownKind              = "unknown_kind"
	CodeMissingField             = "missing_field"
	CodeWrongType                = "wrong_type"
	CodeNullField                = "null_field"
	CodeDuplicateKey             = "duplicate_key"
	CodeUnknownVariant           = "unknown_variant"
	CodeMissingMeta              = "missing_meta"
	CodeMetaNotFirst             = "meta_not_first"
	CodeEventAfterTerminal       = "event_after_terminal"
	CodeDuplicateSpanStart       = "duplicate_span_start"
	CodeSpanEndUnknown           = "span_end_unknown"
	CodeDuplicateSpanEnd         = "duplicate_span_end"
	CodeUnsupportedSchema        = "unsupported_schema"
	CodeTensorStatsOldSchema     = "tensor_stats_previous_schema"
	CodeInvalidTensorStats       = "invalid_tensor_stats"
	CodeCompleteWithReason       = "complete_with_failure_reason"
	CodeFailedWithoutReason      = "failed_without_reason"
	CodeTerminalPrecedesEvidence = "terminal_precedes_evidence"
)

// Codes that are ours alone.
const (
	// CodeTraceIncomplete: no terminal line (a killed writer); the trace was
	// read to its end or to a cut last line. candle-graph refuses such a file.
	CodeTraceIncomplete = "trace_incomplete"
	// CodeGraphNodeIDCollision mirrors the error `candle-graph summary` raises
	// while building its graph when a span id equals a synthesized node id
	// (`<span>/op/<n>` or `tensor/<id>`).
	CodeGraphNodeIDCollision = "graph_node_id_collision"
	// CodeDeviceIntervalOutsideSession: a host-clock device interval that
	// ends after the terminal timestamp (candle-graph does not place
	// intervals in time at all).
	CodeDeviceIntervalOutsideSession = "device_interval_outside_session"
)

// candle-graph analyze_health codes.
const (
	CodeRunProvenanceInvalid            = "run_provenance_invalid"
	CodeCaptureFailed                   = "capture_failed"
	CodeDuplicateSpanID                 = "duplicate_span_id"
	CodeRootCount                       = "root_count"
	CodeMeasurementCount                = "measurement_count"
	CodeOpenSpan                        = "open_span"
	CodeUnknownParent                   = "unknown_parent"
	CodeChildOutsideParent              = "child_outside_parent"
	CodeSpanCycle                       = "span_cycle"
	CodeUnknownSpan                     = "unknown_span"
	CodeEmptyDeviceInterval             = "empty_device_interval"
	CodeOperationOutsideSpan            = "operation_outside_span"
	CodeMemoryOutsideSpan               = "memory_outside_span"
	CodeEmptyDeviceMemorySample         = "empty_device_memory_sample"
	CodeUnknownCallEdgeSpan             = "unknown_call_edge_span"
	CodeCallEdgeHierarchyMismatch       = "call_edge_hierarchy_mismatch"
	CodeCallEdgeDurationMismatch        = "call_edge_duration_mismatch"
	CodeEmptyDataEdgeEndpoint           = "empty_data_edge_endpoint"
	CodeUnknownDataEdgeTensor           = "unknown_data_edge_tensor"
	CodeAllocationSizeMismatch          = "allocation_size_mismatch"
	CodeDuplicateAllocation             = "duplicate_allocation"
	CodeUnpairedFree                    = "unpaired_free"
	CodeRetainedAllocations             = "retained_allocations"
	CodeEmptyGradientEventID            = "empty_gradient_event_id"
	CodeEmptyGradientParameterKey       = "empty_gradient_parameter_key"
	CodeDuplicateGradientEventID        = "duplicate_gradient_event_id"
	CodeGradientStateNormInconsistent   = "gradient_state_norm_inconsistent"
	CodeGradientContractMissing         = "gradient_contract_missing"
	CodeGradientContractWithoutComplete = "gradient_contract_without_complete_coverage"
	CodeGradientContractInvalid         = "gradient_contract_invalid"
	CodeGradientManifestDuplicateKey    = "gradient_manifest_duplicate_key"
	CodeGradientManifestUndeclaredKey   = "gradient_manifest_undeclared_key"
	CodeGradientManifestMissingKey      = "gradient_manifest_missing_key"
	CodeGradientFamilyNonFinite         = "gradient_family_non_finite"
	CodeGradientActiveBelowMinimum      = "gradient_active_family_below_minimum"
	CodeGradientInactiveLeakage         = "gradient_inactive_family_leakage"
	CodeGradientConditionalBelowMinimum = "gradient_conditional_family_below_minimum"
	CodeOperationsAbsent                = "operations_absent"
	CodeTensorsAbsent                   = "tensors_absent"
	CodeLogicalMemoryAbsent             = "logical_memory_absent"
	CodePhysicalMemoryAbsent            = "physical_memory_absent"
	CodeDeviceTimingAbsent              = "device_timing_absent"
	CodeGradientsAbsent                 = "gradients_absent"
	CodeForwardAbsent                   = "forward_absent"
	CodeBackwardAbsent                  = "backward_absent"
	CodeOptimizerAbsent                 = "optimizer_absent"
	CodeEmptyRequiredLabel              = "empty_required_semantic_label"
	CodeDuplicateRequiredLabel          = "duplicate_required_semantic_label"
	CodeRequiredLabelCardinality        = "required_semantic_label_cardinality"
	CodeEmptyLabelClassification        = "empty_semantic_label_classification"
	CodeDuplicateLabelClassification    = "duplicate_semantic_label_classification"
	CodeUnrequiredLabelClassification   = "unrequired_semantic_label_classification"
	CodeOverlappingLabelClassification  = "overlapping_semantic_label_classification"
	CodeIncompleteLabelPartition        = "incomplete_semantic_label_partition"
)

// errorCodes lists every code that can be an error; some of them
// (open_span, gradient_manifest_missing_key, the semantic-label codes) are
// warnings on a failed or incomplete capture.
var ErrorCodes = []string{
	CodeInvalidUTF8, CodeLineTooLong, CodeInvalidJSON, CodeMissingKind, CodeUnknownKind, CodeMissingField,
	CodeWrongType, CodeNullField, CodeDuplicateKey, CodeUnknownVariant, CodeMissingMeta, CodeMetaNotFirst,
	CodeEventAfterTerminal, CodeDuplicateSpanStart, CodeSpanEndUnknown, CodeDuplicateSpanEnd,
	CodeUnsupportedSchema, CodeTensorStatsOldSchema, CodeInvalidTensorStats, CodeCompleteWithReason,
	CodeFailedWithoutReason, CodeTerminalPrecedesEvidence, CodeGraphNodeIDCollision,
	CodeRunProvenanceInvalid, CodeDuplicateSpanID, CodeRootCount, CodeMeasurementCount, CodeOpenSpan,
	CodeUnknownParent, CodeChildOutsideParent, CodeSpanCycle, CodeUnknownSpan, CodeEmptyDeviceInterval,
	CodeOperationOutsideSpan, CodeMemoryOutsideSpan, CodeEmptyDeviceMemorySample, CodeUnknownCallEdgeSpan,
	CodeCallEdgeHierarchyMismatch, CodeCallEdgeDurationMismatch, CodeEmptyDataEdgeEndpoint,
	CodeUnknownDataEdgeTensor, CodeAllocationSizeMismatch, CodeDuplicateAllocation, CodeUnpairedFree,
	CodeEmptyGradientEventID, CodeEmptyGradientParameterKey, CodeDuplicateGradientEventID,
	CodeGradientStateNormInconsistent, CodeGradientContractMissing, CodeGradientContractWithoutComplete,
	CodeGradientContractInvalid, CodeGradientManifestDuplicateKey, CodeGradientManifestUndeclaredKey,
	CodeGradientManifestMissingKey, CodeGradientFamilyNonFinite, CodeGradientActiveBelowMinimum,
	CodeGradientInactiveLeakage, CodeGradientConditionalBelowMinimum, CodeEmptyRequiredLabel,
	CodeDuplicateRequiredLabel, CodeRequiredLabelCardinality, CodeEmptyLabelClassification,
	CodeDuplicateLabelClassification, CodeUnrequiredLabelClassification, CodeOverlappingLabelClassification,
	CodeIncompleteLabelPartition,
}
