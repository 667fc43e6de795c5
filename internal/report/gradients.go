package report

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// gradientState keeps one entry per (root, key): gradients are facts about
// parameters, so this is bounded by the model's parameter count.
type gradientState struct {
	eventIDs map[string]int // event id -> first line
	byKey    map[gradKey]*gradEntry
	order    []gradKey
}

type gradKey struct{ root, key string }

type gradEntry struct {
	count   int
	state   int // of the first event, which candle-graph's family checks use
	norm    float64
	hasNorm bool
	line    int
}

func newGradientState() *gradientState {
	return &gradientState{eventIDs: map[string]int{}, byKey: map[gradKey]*gradEntry{}}
}

func (g *gradientState) add(e *gradientEvent, line int, a *analyzer) {
	if strings.TrimSpace(string(e.eventID)) == "" {
		a.errorAt(line, CodeEmptyGradientEventID, "gradient event ids must not be empty")
	}
	if strings.TrimSpace(string(e.root)) == "" || strings.TrimSpace(string(e.key)) == "" {
		a.errorAt(line, CodeEmptyGradientParameterKey, "gradient roots and parameter keys must not be empty")
	}
	if first, dup := g.eventIDs[string(e.eventID)]; dup {
		a.errorAt(line, CodeDuplicateGradientEventID, fmt.Sprintf("gradient event id %q occurs more than once (first at line %d)", e.eventID, first))
	} else {
		g.eventIDs[string(e.eventID)] = line
	}
	k := gradKey{string(e.root), string(e.key)}
	ent, ok := g.byKey[k]
	if !ok {
		ent = &gradEntry{state: e.state, norm: e.norm, hasNorm: e.hasNorm, line: line}
		g.byKey[k] = ent
		g.order = append(g.order, k)
	}
	ent.count++
	if !normValid(e.state, e.norm, e.hasNorm) {
		norm := "none"
		if e.hasNorm {
			norm = fmt.Sprint(e.norm)
		}
		a.errorAt(line, CodeGradientStateNormInconsistent, fmt.Sprintf("gradient (%q, %q) state `%s` is inconsistent with norm %s", e.root, e.key, gradStateNames[e.state], norm))
	}
}

// normValid: present needs a finite positive norm, zero exactly +0.0,
// missing and non_finite no norm.
func normValid(state int, norm float64, has bool) bool {
	switch state {
	case gradPresent:
		return has && !math.IsInf(norm, 0) && !math.IsNaN(norm) && norm > 0
	case gradZero:
		return has && norm == 0 && !math.Signbit(norm)
	default:
		return !has
	}
}

// finish runs candle-graph's manifest checks against the declared contract.
func (g *gradientState) finish(a *analyzer, failed bool) {
	c := &a.meta.CaptureContract
	contract := c.GradientContract
	switch {
	case c.Gradients == "complete" && contract == nil:
		a.errorAt(0, CodeGradientContractMissing, "complete gradient coverage requires an exact gradient contract")
		return
	case c.Gradients != "complete" && contract != nil:
		a.errorAt(0, CodeGradientContractWithoutComplete, "an exact gradient contract requires complete declared gradient coverage")
		return
	case contract == nil:
		return
	}
	if msg := contractProblem(contract); msg != "" {
		a.errorAt(0, CodeGradientContractInvalid, msg)
		return
	}
	expected := map[gradKey]bool{}
	for _, e := range contract.Expected {
		expected[gradKey{e.Root, e.Key}] = true
	}
	keys := append([]gradKey(nil), g.order...)
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].root != keys[j].root {
			return keys[i].root < keys[j].root
		}
		return keys[i].key < keys[j].key
	})
	for _, k := range keys {
		ent := g.byKey[k]
		if ent.count != 1 {
			a.errorAt(ent.line, CodeGradientManifestDuplicateKey, fmt.Sprintf("gradient (%q, %q) occurs %d times; expected exactly once", k.root, k.key, ent.count))
		}
		if !expected[k] {
			a.errorAt(ent.line, CodeGradientManifestUndeclaredKey, fmt.Sprintf("gradient (%q, %q) is absent from the manifest", k.root, k.key))
		}
	}
	for _, e := range contract.Expected {
		if _, ok := g.byKey[gradKey{e.Root, e.Key}]; !ok {
			msg := fmt.Sprintf("manifest gradient (%q, %q) was not captured", e.Root, e.Key)
			if failed {
				a.warnAt(0, CodeGradientManifestMissingKey, msg)
			} else {
				a.errorAt(0, CodeGradientManifestMissingKey, msg)
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
			ent, ok := g.byKey[gradKey{e.Root, e.Key}]
			if !ok {
				continue
			}
			captured++
			switch ent.state {
			case gradPresent:
				present++
			case gradNonFinite:
				nonFinite++
			}
			if ent.state != gradMissing {
				attached++
			}
		}
		familyComplete := captured == members
		if nonFinite > 0 {
			a.errorAt(0, CodeGradientFamilyNonFinite, fmt.Sprintf("gradient family %q contains %d non-finite gradients", fam.Family, nonFinite))
		}
		switch fam.Expectation {
		case "active":
			if (!failed || familyComplete) && present < fam.MinPresent {
				a.errorAt(0, CodeGradientActiveBelowMinimum, fmt.Sprintf("active gradient family %q has %d present gradients; requires at least %d", fam.Family, present, fam.MinPresent))
			}
		case "inactive":
			if attached > 0 {
				a.errorAt(0, CodeGradientInactiveLeakage, fmt.Sprintf("inactive gradient family %q has %d attached gradients", fam.Family, attached))
			}
		case "data_conditional":
			if (!failed || familyComplete) && present > 0 && present < fam.MinPresent {
				a.errorAt(0, CodeGradientConditionalBelowMinimum, fmt.Sprintf("data-conditional gradient family %q was attached but has %d present gradients; requires at least %d", fam.Family, present, fam.MinPresent))
			}
		}
	}
}
