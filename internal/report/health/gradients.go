package health

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/candle-trace/candle-trace/internal/traceformat"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// gradientState keeps one entry per (root, key): gradients are facts about
// parameters, so this is bounded by the model's parameter count.
type GradientState struct {
	eventIDs map[string]int // event id -> first line
	ByKey    map[gradKey]*gradEntry
	Order    []gradKey
}

type gradKey struct{ Root, Key string }

type gradEntry struct {
	count   int
	State   int // of the first event, which candle-graph's family checks use
	Norm    float64
	HasNorm bool
	Line    int
}

func newGradientState() *GradientState {
	return &GradientState{eventIDs: map[string]int{}, ByKey: map[gradKey]*gradEntry{}}
}

func (g *GradientState) add(e *trace.GradientEvent, line int, a *Checker) {
	if strings.TrimSpace(string(e.EventID)) == "" {
		a.errorAt(line, trace.CodeEmptyGradientEventID, "gradient event ids must not be empty")
	}
	if strings.TrimSpace(string(e.Root)) == "" || strings.TrimSpace(string(e.Key)) == "" {
		a.errorAt(line, trace.CodeEmptyGradientParameterKey, "gradient roots and parameter keys must not be empty")
	}
	if first, dup := g.eventIDs[string(e.EventID)]; dup {
		a.errorAt(line, trace.CodeDuplicateGradientEventID, fmt.Sprintf("gradient event id %q occurs more than once (first at line %d)", e.EventID, first))
	} else {
		g.eventIDs[string(e.EventID)] = line
	}
	k := gradKey{string(e.Root), string(e.Key)}
	ent, ok := g.ByKey[k]
	if !ok {
		ent = &gradEntry{State: e.State, Norm: e.Norm, HasNorm: e.HasNorm, Line: line}
		g.ByKey[k] = ent
		g.Order = append(g.Order, k)
	}
	ent.count++
	if !normValid(e.State, e.Norm, e.HasNorm) {
		norm := "none"
		if e.HasNorm {
			norm = fmt.Sprint(e.Norm)
		}
		a.errorAt(line, trace.CodeGradientStateNormInconsistent, fmt.Sprintf("gradient (%q, %q) state `%s` is inconsistent with norm %s", e.Root, e.Key, traceformat.GradientStates[e.State], norm))
	}
}

// normValid: present needs a finite positive norm, zero exactly +0.0,
// missing and non_finite no norm.
func normValid(state int, norm float64, has bool) bool {
	switch state {
	case trace.GradPresent:
		return has && !math.IsInf(norm, 0) && !math.IsNaN(norm) && norm > 0
	case trace.GradZero:
		return has && norm == 0 && !math.Signbit(norm)
	default:
		return !has
	}
}

// finish runs candle-graph's manifest checks against the declared contract.
func (g *GradientState) finish(a *Checker, failed bool) {
	c := &a.Meta.CaptureContract
	contract := c.GradientContract
	switch {
	case c.Gradients == "complete" && contract == nil:
		a.errorAt(0, trace.CodeGradientContractMissing, "complete gradient coverage requires an exact gradient contract")
		return
	case c.Gradients != "complete" && contract != nil:
		a.errorAt(0, trace.CodeGradientContractWithoutComplete, "an exact gradient contract requires complete declared gradient coverage")
		return
	case contract == nil:
		return
	}
	if msg := contractProblem(contract); msg != "" {
		a.errorAt(0, trace.CodeGradientContractInvalid, msg)
		return
	}
	expected := map[gradKey]bool{}
	for _, e := range contract.Expected {
		expected[gradKey{e.Root, e.Key}] = true
	}
	keys := append([]gradKey(nil), g.Order...)
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Root != keys[j].Root {
			return keys[i].Root < keys[j].Root
		}
		return keys[i].Key < keys[j].Key
	})
	for _, k := range keys {
		ent := g.ByKey[k]
		if ent.count != 1 {
			a.errorAt(ent.Line, trace.CodeGradientManifestDuplicateKey, fmt.Sprintf("gradient (%q, %q) occurs %d times; expected exactly once", k.Root, k.Key, ent.count))
		}
		if !expected[k] {
			a.errorAt(ent.Line, trace.CodeGradientManifestUndeclaredKey, fmt.Sprintf("gradient (%q, %q) is absent from the manifest", k.Root, k.Key))
		}
	}
	for _, e := range contract.Expected {
		if _, ok := g.ByKey[gradKey{e.Root, e.Key}]; !ok {
			msg := fmt.Sprintf("manifest gradient (%q, %q) was not captured", e.Root, e.Key)
			if failed {
				a.warnAt(0, trace.CodeGradientManifestMissingKey, msg)
			} else {
				a.errorAt(0, trace.CodeGradientManifestMissingKey, msg)
			}
		}
	}
	for _, fam := range contract.Families {
		var members, captured, present, attached, nonFinite uint64
		for _, e := range contract.Expected {
			if e.Family != fam.Family {
				continue
			}
			members++
			ent, ok := g.ByKey[gradKey{e.Root, e.Key}]
			if !ok {
				continue
			}
			captured++
			switch ent.State {
			case trace.GradPresent:
				present++
			case trace.GradNonFinite:
				nonFinite++
			}
			if ent.State != trace.GradMissing {
				attached++
			}
		}
		familyComplete := captured == members
		if nonFinite > 0 {
			a.errorAt(0, trace.CodeGradientFamilyNonFinite, fmt.Sprintf("gradient family %q contains %d non-finite gradients", fam.Family, nonFinite))
		}
		switch fam.Expectation {
		case "active":
			if (!failed || familyComplete) && present < fam.MinPresent {
				a.errorAt(0, trace.CodeGradientActiveBelowMinimum, fmt.Sprintf("active gradient family %q has %d present gradients; requires at least %d", fam.Family, present, fam.MinPresent))
			}
		case "inactive":
			if attached > 0 {
				a.errorAt(0, trace.CodeGradientInactiveLeakage, fmt.Sprintf("inactive gradient family %q has %d attached gradients", fam.Family, attached))
			}
		case "data_conditional":
			if (!failed || familyComplete) && present > 0 && present < fam.MinPresent {
				a.errorAt(0, trace.CodeGradientConditionalBelowMinimum, fmt.Sprintf("data-conditional gradient family %q was attached but has %d present gradients; requires at least %d", fam.Family, present, fam.MinPresent))
			}
		}
	}
}
