package events

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Coverage is a capture contract's coverage level for one kind of evidence.
type Coverage uint8

const (
	CoverageNone Coverage = iota
	CoveragePartial
	CoverageComplete
)

func (c Coverage) String() string { return spell(traceformat.Coverages, uint64(c), "Coverage") }

// Valid reports whether c is a defined level.
func (c Coverage) Valid() bool { return c <= CoverageComplete }

func parseCoverage(s string) (Coverage, bool) {
	i := traceformat.Index(traceformat.Coverages, s)
	return Coverage(max(i, 0)), i >= 0
}

// MeasurementScope says what the measured region stands for.
type MeasurementScope uint8

const (
	ScopeUnknown MeasurementScope = iota
	ScopeProfiledWork
	ScopeProductionEquivalent
)

func (m MeasurementScope) String() string {
	return spell(traceformat.MeasurementScopes, uint64(m), "MeasurementScope")
}

// Valid reports whether m is a defined scope.
func (m MeasurementScope) Valid() bool { return m <= ScopeProductionEquivalent }

// FamilyExpectation is the expected runtime state of a gradient family.
type FamilyExpectation uint8

const (
	FamilyActive FamilyExpectation = iota
	FamilyInactive
	// FamilyDataConditional: the data decides whether the family is attached; if any
	// member is present, at least MinPresent must be.
	FamilyDataConditional
)

func (e FamilyExpectation) String() string {
	return spell(traceformat.FamilyExpectations, uint64(e), "FamilyExpectation")
}

// Valid reports whether e is a defined expectation.
func (e FamilyExpectation) Valid() bool { return e <= FamilyDataConditional }

// ExpectedGradient is one parameter a complete gradient capture must report.
type ExpectedGradient struct {
	Root   string `json:"root"`
	Key    string `json:"key"`
	Family string `json:"family"`
}

// GradientFamily is the expectation for one family of the manifest.
type GradientFamily struct {
	Family      string
	Expectation FamilyExpectation
	MinPresent  uint64
}

// GradientContract is the exact, digest-bound parameter manifest of a complete gradient
// capture.
type GradientContract struct {
	ManifestSHA256 string // always ManifestDigest(Expected); set by ParseRun / NewGradientContract
	Expected       []ExpectedGradient
	Families       []GradientFamily
}

// CaptureContract is what a capture promises to contain. The zero value is candle-graph's
// CaptureContract::default(): scope unknown, every level none, no labels.
type CaptureContract struct {
	MeasurementScope MeasurementScope
	Operations       Coverage
	Activations      Coverage
	Tensors          Coverage
	Gradients        Coverage
	GradientContract *GradientContract // present iff Gradients == CoverageComplete
	LogicalMemory    Coverage
	PhysicalMemory   Coverage
	DeviceTiming     Coverage
	// RequiredSemanticLabels are span names that must occur exactly once in a complete
	// capture.
	RequiredSemanticLabels []string
	// GPUExpectedSemanticLabels and CPUOnlySemanticLabels, when either is non-empty, must
	// partition RequiredSemanticLabels.
	GPUExpectedSemanticLabels []string
	CPUOnlySemanticLabels     []string
}

// gradientManifestSchema is candle-graph's domain separator for the manifest digest.
const gradientManifestSchema = "candle-graph/gradient-manifest/1"

// ManifestDigest is candle-graph's ordered gradient-manifest digest:
// "sha256:" + hex(SHA-256(schema ‖ 0x00 ‖ for each entry, for root, key, family:
// u64le(len) ‖ bytes)). Order matters: the manifest is a sequence, not a set.
func ManifestDigest(expected []ExpectedGradient) string {
	h := sha256.New()
	h.Write([]byte(gradientManifestSchema))
	h.Write([]byte{0})
	var n [8]byte
	for _, e := range expected {
		for _, v := range [3]string{e.Root, e.Key, e.Family} {
			binary.LittleEndian.PutUint64(n[:], uint64(len(v)))
			h.Write(n[:])
			h.Write([]byte(v))
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// NewGradientContract builds a contract with its digest computed, and validates it.
func NewGradientContract(expected []ExpectedGradient, families []GradientFamily) (*GradientContract, error) {
	g := &GradientContract{ManifestSHA256: ManifestDigest(expected), Expected: expected, Families: families}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g, nil
}

// Validate applies candle-graph's GradientContract::validate rules; a contract that fails
// them makes every trace that declares it structurally invalid (gradient_contract_invalid).
func (g *GradientContract) Validate() error {
	const p = "gradient_contract"
	if len(g.Expected) == 0 {
		return fmt.Errorf("%s: %q must not be empty", p, "expected")
	}
	if len(g.Families) == 0 {
		return fmt.Errorf("%s: %q must not be empty", p, "families")
	}
	if want := ManifestDigest(g.Expected); g.ManifestSHA256 != want {
		return fmt.Errorf("%s: %q is %q but the ordered expected list digests to %q (omit it and it is computed)", p, "manifest_sha256", g.ManifestSHA256, want)
	}
	type rk struct{ root, key string }
	seen := make(map[rk]bool, len(g.Expected))
	members := map[string]uint64{}
	for i, e := range g.Expected {
		for _, f := range [3]struct{ name, v string }{{"root", e.Root}, {"key", e.Key}, {"family", e.Family}} {
			if strings.TrimSpace(f.v) == "" {
				return fmt.Errorf("%s: %q must not be empty", p, fmt.Sprintf("expected[%d].%s", i, f.name))
			}
		}
		k := rk{e.Root, e.Key}
		if seen[k] {
			return fmt.Errorf("%s: expected[%d] declares (%q, %q) more than once", p, i, e.Root, e.Key)
		}
		seen[k] = true
		members[e.Family]++
	}
	declared := make(map[string]bool, len(g.Families))
	for i, f := range g.Families {
		if strings.TrimSpace(f.Family) == "" {
			return fmt.Errorf("%s: %q must not be empty", p, fmt.Sprintf("families[%d].family", i))
		}
		if declared[f.Family] {
			return fmt.Errorf("%s: family %q is declared more than once", p, f.Family)
		}
		declared[f.Family] = true
		n := members[f.Family]
		if n == 0 {
			return fmt.Errorf("%s: family %q has no member in %q", p, f.Family, "expected")
		}
		switch f.Expectation {
		case FamilyInactive:
			if f.MinPresent != 0 {
				return fmt.Errorf("%s: inactive family %q must have min_present 0, got %d", p, f.Family, f.MinPresent)
			}
		case FamilyActive, FamilyDataConditional:
			if f.MinPresent < 1 || f.MinPresent > n {
				return fmt.Errorf("%s: %s family %q needs min_present in 1..%d (its member count), got %d", p, f.Expectation, f.Family, n, f.MinPresent)
			}
		default:
			return fmt.Errorf("%s: family %q has an invalid expectation %d", p, f.Family, uint8(f.Expectation))
		}
	}
	for _, e := range g.Expected {
		if !declared[e.Family] {
			return fmt.Errorf("%s: family %q of (%q, %q) has no entry in %q", p, e.Family, e.Root, e.Key, "families")
		}
	}
	return nil
}

// Validate applies candle-graph's CaptureContract::validate (what its own producer checks
// before capture) plus the enum ranges.
func (c *CaptureContract) Validate() error {
	const p = "capture_contract"
	if !c.MeasurementScope.Valid() {
		return fmt.Errorf("%s: invalid measurement_scope %d", p, uint8(c.MeasurementScope))
	}
	for _, l := range [...]struct {
		name string
		v    Coverage
	}{
		{"operations", c.Operations}, {"activations", c.Activations}, {"tensors", c.Tensors},
		{"gradients", c.Gradients}, {"logical_memory", c.LogicalMemory},
		{"physical_memory", c.PhysicalMemory}, {"device_timing", c.DeviceTiming},
	} {
		if !l.v.Valid() {
			return fmt.Errorf("%s: invalid %s level %d", p, l.name, uint8(l.v))
		}
	}
	required := make(map[string]bool, len(c.RequiredSemanticLabels))
	for i, l := range c.RequiredSemanticLabels {
		if strings.TrimSpace(l) == "" {
			return fmt.Errorf("%s: %q must not be empty", p, fmt.Sprintf("required_semantic_labels[%d]", i))
		}
		if required[l] {
			return fmt.Errorf("%s: required semantic label %q is declared more than once", p, l)
		}
		required[l] = true
	}
	if len(c.GPUExpectedSemanticLabels) > 0 || len(c.CPUOnlySemanticLabels) > 0 {
		classified := map[string]bool{}
		for _, class := range [...]struct {
			name   string
			labels []string
		}{
			{"gpu_expected_semantic_labels", c.GPUExpectedSemanticLabels},
			{"cpu_only_semantic_labels", c.CPUOnlySemanticLabels},
		} {
			inClass := map[string]bool{}
			for i, l := range class.labels {
				if strings.TrimSpace(l) == "" {
					return fmt.Errorf("%s: %q must not be empty", p, fmt.Sprintf("%s[%d]", class.name, i))
				}
				if inClass[l] {
					return fmt.Errorf("%s: %s: label %q is declared more than once", p, class.name, l)
				}
				inClass[l] = true
				if !required[l] {
					return fmt.Errorf("%s: %s: label %q is not in required_semantic_labels", p, class.name, l)
				}
				if classified[l] {
					return fmt.Errorf("%s: label %q is classified as both GPU-expected and CPU-only", p, l)
				}
				classified[l] = true
			}
		}
		if len(classified) != len(required) {
			return fmt.Errorf("%s: gpu_expected_semantic_labels and cpu_only_semantic_labels must together cover every required semantic label (%d of %d classified)", p, len(classified), len(required))
		}
	}
	if c.Activations == CoverageComplete {
		if c.Operations != CoverageComplete {
			return fmt.Errorf("%s: activations complete requires operations complete", p)
		}
		if c.Tensors == CoverageNone && c.LogicalMemory == CoverageNone {
			return fmt.Errorf("%s: activations complete requires tensors or logical_memory coverage above none", p)
		}
	}
	switch {
	case c.Gradients == CoverageComplete && c.GradientContract == nil:
		return fmt.Errorf("%s: gradients complete requires a gradient_contract", p)
	case c.Gradients != CoverageComplete && c.GradientContract != nil:
		return fmt.Errorf("%s: a gradient_contract requires gradients complete, got %s", p, c.Gradients)
	case c.GradientContract != nil:
		if err := c.GradientContract.Validate(); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// parseContract reads capture_contract from the run JSON. Every field may be absent and
// then takes CaptureContract::default()'s value; manifest_sha256 may be given, and is then
// checked against the digest computed here.
func parseContract(f fields) (CaptureContract, error) {
	var c CaptureContract
	if err := f.checkKeys("measurement_scope", "operations", "activations", "tensors", "gradients",
		"gradient_contract", "logical_memory", "physical_memory", "device_timing",
		"required_semantic_labels", "gpu_expected_semantic_labels", "cpu_only_semantic_labels"); err != nil {
		return c, err
	}
	scope, err := f.enum("measurement_scope", false, "unknown", traceformat.MeasurementScopes...)
	if err != nil {
		return c, err
	}
	c.MeasurementScope = MeasurementScope(traceformat.Index(traceformat.MeasurementScopes, scope))
	for _, l := range [...]struct {
		key string
		dst *Coverage
	}{
		{"operations", &c.Operations}, {"activations", &c.Activations}, {"tensors", &c.Tensors},
		{"gradients", &c.Gradients}, {"logical_memory", &c.LogicalMemory},
		{"physical_memory", &c.PhysicalMemory}, {"device_timing", &c.DeviceTiming},
	} {
		s, err := f.enum(l.key, false, "none", "none", "partial", "complete")
		if err != nil {
			return c, err
		}
		*l.dst, _ = parseCoverage(s)
	}
	if c.RequiredSemanticLabels, err = f.strings("required_semantic_labels"); err != nil {
		return c, err
	}
	if c.GPUExpectedSemanticLabels, err = f.strings("gpu_expected_semantic_labels"); err != nil {
		return c, err
	}
	if c.CPUOnlySemanticLabels, err = f.strings("cpu_only_semantic_labels"); err != nil {
		return c, err
	}
	gf, ok, err := f.object("gradient_contract", true)
	if err != nil {
		return c, err
	}
	if ok {
		g, err := parseGradientContract(gf)
		if err != nil {
			return c, err
		}
		c.GradientContract = g
	}
	return c, nil
}

func parseGradientContract(f fields) (*GradientContract, error) {
	if err := f.checkKeys("manifest_sha256", "expected", "families"); err != nil {
		return nil, err
	}
	g := &GradientContract{Expected: []ExpectedGradient{}, Families: []GradientFamily{}}
	given, hasDigest, err := f.str("manifest_sha256", false, true)
	if err != nil {
		return nil, err
	}
	exp, _, err := f.array("expected")
	if err != nil {
		return nil, err
	}
	for i, v := range exp {
		o, ok := v.(*jsonObject)
		if !ok {
			return nil, fmt.Errorf("%s must be an object {root, key, family}, got %s", f.elem("expected", i), describe(v))
		}
		ef := fields{path: fmt.Sprintf("%s.expected[%d]", f.path, i), obj: o}
		if err := ef.checkKeys("root", "key", "family"); err != nil {
			return nil, err
		}
		var e ExpectedGradient
		for _, k := range [3]struct {
			key string
			dst *string
		}{{"root", &e.Root}, {"key", &e.Key}, {"family", &e.Family}} {
			if *k.dst, _, err = ef.str(k.key, true, false); err != nil {
				return nil, err
			}
		}
		g.Expected = append(g.Expected, e)
	}
	fams, _, err := f.array("families")
	if err != nil {
		return nil, err
	}
	for i, v := range fams {
		o, ok := v.(*jsonObject)
		if !ok {
			return nil, fmt.Errorf("%s must be an object {family, expectation, min_present}, got %s", f.elem("families", i), describe(v))
		}
		ff := fields{path: fmt.Sprintf("%s.families[%d]", f.path, i), obj: o}
		if err := ff.checkKeys("family", "expectation", "min_present"); err != nil {
			return nil, err
		}
		var fam GradientFamily
		if fam.Family, _, err = ff.str("family", true, false); err != nil {
			return nil, err
		}
		exp, err := ff.enum("expectation", true, "", traceformat.FamilyExpectations...)
		if err != nil {
			return nil, err
		}
		fam.Expectation = FamilyExpectation(traceformat.Index(traceformat.FamilyExpectations, exp))
		if fam.MinPresent, _, err = ff.uint("min_present", true); err != nil {
			return nil, err
		}
		g.Families = append(g.Families, fam)
	}
	g.ManifestSHA256 = ManifestDigest(g.Expected)
	if hasDigest && given != g.ManifestSHA256 {
		return nil, fmt.Errorf("%s is %q but the ordered expected list digests to %q; omit it and the library computes it",
			f.name("manifest_sha256"), given, g.ManifestSHA256)
	}
	return g, nil
}
