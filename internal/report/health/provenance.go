package health

import (
	"fmt"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// provenanceProblem returns why the run metadata is out of its domain
// (candle-graph's TraceRunMeta::validate), or "" when it is fine.
func provenanceProblem(m *trace.Meta) string {
	for _, f := range []struct{ name, value string }{
		{"run_id", m.RunID}, {"correlation_id", m.CorrelationID}, {"entrypoint", m.Entrypoint},
		{"timestamp", m.Timestamp}, {"device", m.Device},
	} {
		if strings.TrimSpace(f.value) == "" {
			return fmt.Sprintf("run provenance %s must not be empty", f.name)
		}
	}
	if m.CaptureStep == 0 {
		return "capture_step must be one-based and greater than zero"
	}
	if m.WarmupSteps >= m.CaptureStep {
		return fmt.Sprintf("warmup_steps (%d) must be fewer than the one-based capture_step (%d)", m.WarmupSteps, m.CaptureStep)
	}
	if id := m.ComparisonIdentity; id != nil {
		for _, f := range []struct{ name, value string }{
			{"workload_id", id.WorkloadID}, {"model_id", id.ModelID}, {"config_id", id.ConfigID},
			{"data_id", id.DataID}, {"seed_policy", id.SeedPolicy}, {"precision", id.Precision},
			{"device_state", id.DeviceState},
		} {
			if strings.TrimSpace(f.value) == "" {
				return fmt.Sprintf("comparison identity %s must not be empty", f.name)
			}
		}
		if id.HasImplementationID && strings.TrimSpace(id.ImplementationID) == "" {
			return "comparison identity implementation_id must not be empty when declared"
		}
		if id.HasPairID && strings.TrimSpace(id.PairID) == "" {
			return "comparison identity pair_id must not be empty when declared"
		}
		if id.PhysicalBatch == 0 {
			return "comparison identity physical_batch must be greater than zero"
		}
		if id.AccumulationSteps == 0 {
			return "comparison identity accumulation_steps must be greater than zero"
		}
	}
	return ""
}

// contractProblem returns why a gradient contract is invalid
// (candle-graph's GradientContract::validate), or "".
func contractProblem(c *trace.GradientContract) string {
	if len(c.Expected) == 0 {
		return "gradient manifest must not be empty"
	}
	if len(c.Families) == 0 {
		return "gradient families must not be empty"
	}
	if c.ManifestSHA256 != trace.ManifestDigest(c.Expected) {
		return "gradient manifest SHA-256 does not match its ordered parameter manifest"
	}
	type key struct{ root, key string }
	keys := map[key]bool{}
	members := map[string]uint64{}
	for _, e := range c.Expected {
		if strings.TrimSpace(e.Root) == "" || strings.TrimSpace(e.Key) == "" || strings.TrimSpace(e.Family) == "" {
			return "gradient manifest root, key, and family must not be empty"
		}
		k := key{e.Root, e.Key}
		if keys[k] {
			return fmt.Sprintf("gradient manifest declares (%q, %q) more than once", e.Root, e.Key)
		}
		keys[k] = true
		members[e.Family]++
	}
	declared := map[string]bool{}
	for _, f := range c.Families {
		if strings.TrimSpace(f.Family) == "" {
			return "gradient family name must not be empty"
		}
		if declared[f.Family] {
			return fmt.Sprintf("gradient family %q is declared more than once", f.Family)
		}
		declared[f.Family] = true
		n := members[f.Family]
		if n == 0 {
			return fmt.Sprintf("gradient family %q has no manifest members", f.Family)
		}
		if f.Expectation == "inactive" {
			if f.MinPresent != 0 {
				return fmt.Sprintf("inactive gradient family %q must have min_present=0", f.Family)
			}
		} else if f.MinPresent == 0 || f.MinPresent > n {
			return fmt.Sprintf("active or data-conditional gradient family %q needs min_present in 1..=%d", f.Family, n)
		}
	}
	for fam := range members {
		if !declared[fam] {
			return fmt.Sprintf("gradient manifest family %q has no family contract", fam)
		}
	}
	return ""
}
