package trace

import (
	"strconv"

	"github.com/candle-trace/candle-trace/internal/traceformat"

	"github.com/candle-trace/candle-trace/internal/events"
)

// Supported schemas: the current one, and the previous one candle-graph
// still reads (without tensor_stats).
const (
	Schema         = traceformat.Schema
	PreviousSchema = traceformat.PreviousSchema
)

// Meta is the run's provenance: the first line of a trace.
type Meta struct {
	Schema                           string              `json:"schema"`
	RunID                            string              `json:"run_id"`
	CorrelationID                    string              `json:"correlation_id"`
	Entrypoint                       string              `json:"entrypoint"`
	Phase                            string              `json:"phase"`
	Timestamp                        string              `json:"timestamp"`
	CaptureStep                      uint64              `json:"capture_step"`
	WarmupSteps                      uint64              `json:"warmup_steps"`
	Device                           string              `json:"device"`
	MeasuredRegionDeviceSynchronized bool                `json:"measured_region_device_synchronized"`
	TimingMode                       string              `json:"timing_mode"`
	CaptureContract                  CaptureContract     `json:"capture_contract"`
	ComparisonIdentity               *ComparisonIdentity `json:"comparison_identity,omitempty"`
	Tags                             map[string]string   `json:"tags"`
	CandleVersion                    string              `json:"candle_version,omitempty"`
	// Ours, read best effort: candle-graph ignores them, so a malformed one
	// is not an error.
	Producer map[string]string `json:"producer,omitempty"`
	Clock    map[string]string `json:"clock,omitempty"`
	Process  map[string]string `json:"process,omitempty"`
}

// CaptureContract is what the capture promises to contain.
type CaptureContract struct {
	MeasurementScope          string            `json:"measurement_scope"`
	Operations                string            `json:"operations"`
	Activations               string            `json:"activations"`
	Tensors                   string            `json:"tensors"`
	Gradients                 string            `json:"gradients"`
	GradientContract          *GradientContract `json:"gradient_contract,omitempty"`
	LogicalMemory             string            `json:"logical_memory"`
	PhysicalMemory            string            `json:"physical_memory"`
	DeviceTiming              string            `json:"device_timing"`
	RequiredSemanticLabels    []string          `json:"required_semantic_labels"`
	GPUExpectedSemanticLabels []string          `json:"gpu_expected_semantic_labels,omitempty"`
	CPUOnlySemanticLabels     []string          `json:"cpu_only_semantic_labels,omitempty"`
}

// GradientContract is the exact, digest-bound gradient manifest.
type GradientContract struct {
	ManifestSHA256 string             `json:"manifest_sha256"`
	Expected       []ExpectedGradient `json:"expected"`
	Families       []GradientFamily   `json:"families"`
}

// ExpectedGradient is one manifest entry, shared with the writer.
type ExpectedGradient = events.ExpectedGradient

type GradientFamily struct {
	Family      string `json:"family"`
	Expectation string `json:"expectation"`
	MinPresent  uint64 `json:"min_present"`
}

// ComparisonIdentity says which runs may be compared with this one.
type ComparisonIdentity struct {
	ImplementationID  string `json:"implementation_id,omitempty"`
	WorkloadID        string `json:"workload_id"`
	ModelID           string `json:"model_id"`
	ConfigID          string `json:"config_id"`
	DataID            string `json:"data_id"`
	SeedPolicy        string `json:"seed_policy"`
	PhysicalBatch     uint64 `json:"physical_batch"`
	AccumulationSteps uint64 `json:"accumulation_steps"`
	Precision         string `json:"precision"`
	DeviceState       string `json:"device_state"`
	PairID            string `json:"pair_id,omitempty"`
	// Declared* record presence: an empty declared id is a provenance error.
	HasImplementationID bool `json:"-"`
	HasPairID           bool `json:"-"`
}

// decodeMeta decodes a meta event: "schema" plus the flattened run fields.
func decodeMeta(sc *jsonScanner, ms []jsonMember) (*Meta, error) {
	m := &Meta{}
	f := fields{obj: "meta"}
	var err error
	str := func(bit uint, k string, v jsonValue, dst *string) {
		if err = f.first(bit, k); err == nil {
			var b []byte
			b, err = getStr(f.obj, k, v)
			*dst = string(b)
		}
	}
	enum := func(bit uint, k string, v jsonValue, names []string, dst *string) {
		if err = f.first(bit, k); err == nil {
			var i int
			i, err = sc.getEnum(f.obj, k, v, names)
			if err == nil {
				*dst = names[i]
			}
		}
	}
	for _, mem := range ms {
		k, v := string(mem.key), mem.val
		switch k {
		case "schema":
			str(0, k, v, &m.Schema)
		case "run_id":
			str(1, k, v, &m.RunID)
		case "correlation_id":
			str(2, k, v, &m.CorrelationID)
		case "entrypoint":
			str(3, k, v, &m.Entrypoint)
		case "phase":
			enum(4, k, v, traceformat.Phases, &m.Phase)
		case "timestamp":
			str(5, k, v, &m.Timestamp)
		case "capture_step":
			if err = f.first(6, k); err == nil {
				m.CaptureStep, err = getU64(f.obj, k, v)
			}
		case "warmup_steps":
			if err = f.first(7, k); err == nil {
				m.WarmupSteps, err = getU64(f.obj, k, v)
			}
		case "device":
			str(8, k, v, &m.Device)
		case "timing_mode":
			enum(9, k, v, traceformat.TimingModes, &m.TimingMode)
		case "capture_contract":
			if err = f.first(10, k); err == nil {
				err = decodeContract(sc, v, &m.CaptureContract)
			}
		case "tags":
			if err = f.first(11, k); err == nil {
				m.Tags, err = decodeStrMap(sc, "meta", k, v)
			}
		case "measured_region_device_synchronized":
			if err = f.first(12, k); err == nil {
				m.MeasuredRegionDeviceSynchronized, err = getBool(f.obj, k, v)
			}
		case "comparison_identity":
			if err = f.first(13, k); err == nil && v.kind != jNull {
				m.ComparisonIdentity, err = decodeIdentity(sc, v)
			}
		case "candle_version":
			if err = f.first(14, k); err == nil {
				var b []byte
				b, _, err = getOptStr(f.obj, k, v)
				m.CandleVersion = string(b)
			}
		case "producer":
			m.Producer = lenientMap(sc, v)
		case "clock":
			m.Clock = lenientMap(sc, v)
		case "process":
			m.Process = lenientMap(sc, v)
		}
		if err != nil {
			return nil, err
		}
	}
	err = f.require("schema", "run_id", "correlation_id", "entrypoint", "phase", "timestamp",
		"capture_step", "warmup_steps", "device", "timing_mode", "capture_contract", "tags")
	return m, err
}

// decodeStrMap decodes a BTreeMap<String, String>. serde lets a later
// duplicate key overwrite an earlier one, so we do too.
func decodeStrMap(sc *jsonScanner, obj, key string, v jsonValue) (map[string]string, error) {
	if v.kind != jObject {
		return nil, typeErr(obj, key, v, "an object of strings")
	}
	out := map[string]string{}
	for _, m := range sc.members(v) {
		if m.val.kind != jString {
			return nil, typeErr(obj, key+"."+string(m.key), m.val, "a string")
		}
		out[string(m.key)] = string(m.val.raw)
	}
	return out, nil
}

// lenientMap renders an object's scalar members as strings and ignores
// anything else.
func lenientMap(sc *jsonScanner, v jsonValue) map[string]string {
	if v.kind != jObject {
		return nil
	}
	out := map[string]string{}
	for _, m := range sc.members(v) {
		switch m.val.kind {
		case jString, jNumber, jBool:
			out[string(m.key)] = string(m.val.raw)
		}
	}
	return out
}

func decodeContract(sc *jsonScanner, v jsonValue, c *CaptureContract) error {
	if v.kind != jObject {
		return typeErr("meta", "capture_contract", v, "an object")
	}
	*c = CaptureContract{Activations: "none", Tensors: "none", Gradients: "none", RequiredSemanticLabels: []string{}}
	f := fields{obj: "capture_contract"}
	var err error
	cov := func(bit uint, k string, v jsonValue, dst *string) {
		if err = f.first(bit, k); err == nil {
			var i int
			i, err = sc.getEnum(f.obj, k, v, traceformat.Coverages)
			if err == nil {
				*dst = traceformat.Coverages[i]
			}
		}
	}
	list := func(bit uint, k string, v jsonValue, dst *[]string) {
		if err = f.first(bit, k); err == nil {
			var bs [][]byte
			bs, err = sc.getStrList(f.obj, k, v, nil)
			*dst = make([]string, len(bs))
			for i, b := range bs {
				(*dst)[i] = string(b)
			}
		}
	}
	for _, m := range sc.members(v) {
		switch k := string(m.key); k {
		case "measurement_scope":
			if err = f.first(0, k); err == nil {
				var i int
				i, err = sc.getEnum(f.obj, k, m.val, traceformat.MeasurementScopes)
				c.MeasurementScope = traceformat.MeasurementScopes[i]
			}
		case "operations":
			cov(1, k, m.val, &c.Operations)
		case "logical_memory":
			cov(2, k, m.val, &c.LogicalMemory)
		case "physical_memory":
			cov(3, k, m.val, &c.PhysicalMemory)
		case "device_timing":
			cov(4, k, m.val, &c.DeviceTiming)
		case "activations":
			cov(5, k, m.val, &c.Activations)
		case "tensors":
			cov(6, k, m.val, &c.Tensors)
		case "gradients":
			cov(7, k, m.val, &c.Gradients)
		case "gradient_contract":
			if err = f.first(8, k); err == nil && m.val.kind != jNull {
				c.GradientContract, err = decodeGradientContract(sc, m.val)
			}
		case "required_semantic_labels":
			list(9, k, m.val, &c.RequiredSemanticLabels)
		case "gpu_expected_semantic_labels":
			list(10, k, m.val, &c.GPUExpectedSemanticLabels)
		case "cpu_only_semantic_labels":
			list(11, k, m.val, &c.CPUOnlySemanticLabels)
		}
		if err != nil {
			return err
		}
	}
	return f.require("measurement_scope", "operations", "logical_memory", "physical_memory", "device_timing")
}

func decodeGradientContract(sc *jsonScanner, v jsonValue) (*GradientContract, error) {
	if v.kind != jObject {
		return nil, typeErr("capture_contract", "gradient_contract", v, "an object")
	}
	gc := &GradientContract{}
	f := fields{obj: "gradient_contract"}
	var err error
	for _, m := range sc.members(v) {
		switch k := string(m.key); k {
		case "manifest_sha256":
			if err = f.first(0, k); err == nil {
				var b []byte
				b, err = getStr(f.obj, k, m.val)
				gc.ManifestSHA256 = string(b)
			}
		case "expected":
			if err = f.first(1, k); err == nil {
				gc.Expected, err = decodeExpected(sc, m.val)
			}
		case "families":
			if err = f.first(2, k); err == nil {
				gc.Families, err = decodeFamilies(sc, m.val)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return gc, f.require("manifest_sha256", "expected", "families")
}

func decodeExpected(sc *jsonScanner, v jsonValue) ([]ExpectedGradient, error) {
	if v.kind != jArray {
		return nil, typeErr("gradient_contract", "expected", v, "an array")
	}
	out := []ExpectedGradient{}
	for i, e := range sc.elements(v) {
		obj := "gradient_contract.expected[" + strconv.Itoa(i) + "]"
		if e.kind != jObject {
			return nil, typeErr(obj, "", e, "an object")
		}
		var g ExpectedGradient
		f := fields{obj: obj}
		var err error
		for _, m := range sc.members(e) {
			var dst *string
			var bit uint
			switch string(m.key) {
			case "root":
				dst, bit = &g.Root, 0
			case "key":
				dst, bit = &g.Key, 1
			case "family":
				dst, bit = &g.Family, 2
			default:
				continue
			}
			if err = f.first(bit, string(m.key)); err == nil {
				var b []byte
				b, err = getStr(obj, string(m.key), m.val)
				*dst = string(b)
			}
			if err != nil {
				return nil, err
			}
		}
		if err = f.require("root", "key", "family"); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

func decodeFamilies(sc *jsonScanner, v jsonValue) ([]GradientFamily, error) {
	if v.kind != jArray {
		return nil, typeErr("gradient_contract", "families", v, "an array")
	}
	out := []GradientFamily{}
	for i, e := range sc.elements(v) {
		obj := "gradient_contract.families[" + strconv.Itoa(i) + "]"
		if e.kind != jObject {
			return nil, typeErr(obj, "", e, "an object")
		}
		var g GradientFamily
		f := fields{obj: obj}
		var err error
		for _, m := range sc.members(e) {
			switch k := string(m.key); k {
			case "family":
				if err = f.first(0, k); err == nil {
					var b []byte
					b, err = getStr(obj, k, m.val)
					g.Family = string(b)
				}
			case "expectation":
				if err = f.first(1, k); err == nil {
					var j int
					j, err = sc.getEnum(obj, k, m.val, traceformat.FamilyExpectations)
					g.Expectation = traceformat.FamilyExpectations[j]
				}
			case "min_present":
				if err = f.first(2, k); err == nil {
					g.MinPresent, err = getU64(obj, k, m.val)
				}
			}
			if err != nil {
				return nil, err
			}
		}
		if err = f.require("family", "expectation", "min_present"); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

func decodeIdentity(sc *jsonScanner, v jsonValue) (*ComparisonIdentity, error) {
	if v.kind != jObject {
		return nil, typeErr("meta", "comparison_identity", v, "an object")
	}
	id := &ComparisonIdentity{}
	f := fields{obj: "comparison_identity"}
	var err error
	for _, m := range sc.members(v) {
		k := string(m.key)
		var dst *string
		var bit uint
		switch k {
		case "workload_id":
			dst, bit = &id.WorkloadID, 0
		case "model_id":
			dst, bit = &id.ModelID, 1
		case "config_id":
			dst, bit = &id.ConfigID, 2
		case "data_id":
			dst, bit = &id.DataID, 3
		case "seed_policy":
			dst, bit = &id.SeedPolicy, 4
		case "precision":
			dst, bit = &id.Precision, 5
		case "device_state":
			dst, bit = &id.DeviceState, 6
		case "physical_batch":
			if err = f.first(7, k); err == nil {
				id.PhysicalBatch, err = getU64(f.obj, k, m.val)
			}
		case "accumulation_steps":
			if err = f.first(8, k); err == nil {
				id.AccumulationSteps, err = getU64(f.obj, k, m.val)
			}
		case "implementation_id":
			if err = f.first(9, k); err == nil {
				var b []byte
				b, id.HasImplementationID, err = getOptStr(f.obj, k, m.val)
				id.ImplementationID = string(b)
			}
		case "pair_id":
			if err = f.first(10, k); err == nil {
				var b []byte
				b, id.HasPairID, err = getOptStr(f.obj, k, m.val)
				id.PairID = string(b)
			}
		}
		if dst != nil {
			if err = f.first(bit, k); err == nil {
				var b []byte
				b, err = getStr(f.obj, k, m.val)
				*dst = string(b)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return id, f.require("workload_id", "model_id", "config_id", "data_id", "seed_policy",
		"precision", "device_state", "physical_batch", "accumulation_steps")
}

// ManifestDigest is the digest every gradient contract must carry; one
// implementation serves the writer and the reader.
func ManifestDigest(expected []ExpectedGradient) string { return events.ManifestDigest(expected) }
