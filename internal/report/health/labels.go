package health

import (
	"fmt"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// checkLabels applies the capture contract's semantic-label rules: each
// required label names exactly one span, and when GPU-expected / CPU-only
// classes are declared they partition the required labels. On a failed or
// incomplete capture these are warnings.
func (a *Checker) checkLabels(failed bool) {
	report := func(code, msg string) {
		if failed {
			a.warnAt(0, code, msg)
		} else {
			a.errorAt(0, code, msg)
		}
	}
	c := &a.Meta.CaptureContract
	required := map[string]bool{}
	for _, l := range c.RequiredSemanticLabels {
		if strings.TrimSpace(l) == "" {
			report(trace.CodeEmptyRequiredLabel, "required semantic labels must not be empty")
		}
		if required[l] {
			report(trace.CodeDuplicateRequiredLabel, fmt.Sprintf("required semantic label `%s` is declared more than once", l))
		}
		required[l] = true
		if n := a.requiredLabels[l]; n != 1 {
			report(trace.CodeRequiredLabelCardinality, fmt.Sprintf("required semantic label `%s` must occur exactly once; observed %d", l, n))
		}
	}
	if len(c.GPUExpectedSemanticLabels) == 0 && len(c.CPUOnlySemanticLabels) == 0 {
		return
	}
	classified := map[string]bool{}
	for _, class := range []struct {
		name   string
		labels []string
	}{{"GPU-expected", c.GPUExpectedSemanticLabels}, {"CPU-only", c.CPUOnlySemanticLabels}} {
		inClass := map[string]bool{}
		for _, l := range class.labels {
			if strings.TrimSpace(l) == "" {
				report(trace.CodeEmptyLabelClassification, class.name+" semantic labels must not be empty")
			}
			if inClass[l] {
				report(trace.CodeDuplicateLabelClassification, fmt.Sprintf("%s semantic label `%s` is declared more than once", class.name, l))
			}
			inClass[l] = true
			if !required[l] {
				report(trace.CodeUnrequiredLabelClassification, fmt.Sprintf("%s semantic label `%s` is not a required application label", class.name, l))
			}
			if classified[l] {
				report(trace.CodeOverlappingLabelClassification, fmt.Sprintf("semantic label `%s` is classified as both GPU-expected and CPU-only", l))
			}
			classified[l] = true
		}
	}
	if len(classified) != len(required) || !sameKeys(classified, required) {
		report(trace.CodeIncompleteLabelPartition, "GPU-expected and CPU-only semantic labels must partition all required application labels")
	}
}

func sameKeys(a, b map[string]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return len(a) == len(b)
}

// checkAbsent emits candle-graph's evidence-gap warnings.
func (a *Checker) checkAbsent() {
	train := a.Meta.Phase == "train"
	cv := &a.coverage
	for _, g := range []struct {
		absent bool
		code   string
		msg    string
	}{
		{cv.Operations == 0, trace.CodeOperationsAbsent, "no operation evidence was captured"},
		{cv.Tensors == 0, trace.CodeTensorsAbsent, "no tensor checkpoints were captured"},
		{cv.MemoryEvents == 0, trace.CodeLogicalMemoryAbsent, "no logical storage events were captured"},
		{cv.DeviceMemorySamples == 0, trace.CodePhysicalMemoryAbsent, "no physical device-memory samples were captured"},
		{cv.DeviceIntervals == 0, trace.CodeDeviceTimingAbsent, "no device timing intervals were captured"},
		{train && cv.Gradients == 0, trace.CodeGradientsAbsent, "no gradient facts were captured for this training run"},
		{train && cv.ForwardSpans == 0, trace.CodeForwardAbsent, "no forward span was tagged"},
		{train && cv.BackwardSpans == 0, trace.CodeBackwardAbsent, "no backward span was tagged"},
		{train && cv.OptimizerSpans == 0, trace.CodeOptimizerAbsent, "no optimizer span was tagged"},
	} {
		if g.absent {
			a.warnAt(0, g.code, g.msg)
		}
	}
}
