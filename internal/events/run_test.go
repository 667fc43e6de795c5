package events

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRunMinimalDefaults(t *testing.T) {
	r, err := ParseRun([]byte(`{"entrypoint":"demo::train","phase":"train","capture_step":3,"device":"cuda:0"}`))
	require.NoError(t, err)
	assert.Equal(t, "demo::train", r.Entrypoint)
	assert.Equal(t, "train", r.Phase)
	assert.Equal(t, uint64(3), r.CaptureStep)
	assert.Equal(t, "cuda:0", r.Device)
	// Defaults of trace-format.md.
	assert.Equal(t, uint64(2), r.WarmupSteps, "warmup defaults to capture_step-1")
	assert.Equal(t, "demo::train/update-3", r.CorrelationID)
	assert.Equal(t, "host", r.TimingMode)
	assert.False(t, r.MeasuredRegionDeviceSynchronized)
	assert.False(t, r.MeasuredRoot)
	assert.NotNil(t, r.Tags)
	assert.Empty(t, r.Tags)
	assert.Equal(t, "", r.CandleVersion)
	assert.Nil(t, r.Identity)
	// CaptureContract::default(): scope unknown, every level none, no labels.
	assert.Equal(t, CaptureContract{}, r.Contract)
	assert.Equal(t, ScopeUnknown, r.Contract.MeasurementScope)
	assert.Equal(t, CoverageNone, r.Contract.Operations)
	assert.Nil(t, r.Contract.GradientContract)
	assert.Nil(t, r.ExpectedGradients())
	assert.Empty(t, r.RequiredLabels())
}

func TestParseRunInferCorrelationDefault(t *testing.T) {
	r, err := ParseRun([]byte(`{"entrypoint":"m::f","phase":"infer","capture_step":1,"device":"cpu"}`))
	require.NoError(t, err)
	assert.Equal(t, "m::f/inference-1", r.CorrelationID)
	assert.Equal(t, uint64(0), r.WarmupSteps)
}

const fullRunJSON = `{
 "entrypoint":"demo::train","phase":"train","capture_step":5,"warmup_steps":4,"device":"cuda:0",
 "correlation_id":"corr-1","timing_mode":"device_synchronized","measured_region_device_synchronized":true,
 "measured_root":true,"candle_version":"0.9.1","tags":{"b":"2","a":"1"},
 "capture_contract":{"measurement_scope":"production_equivalent","operations":"complete","activations":"complete",
  "tensors":"partial","gradients":"complete","logical_memory":"complete","physical_memory":"partial","device_timing":"none",
  "required_semantic_labels":["fwd","opt"],"gpu_expected_semantic_labels":["fwd"],"cpu_only_semantic_labels":["opt"],
  "gradient_contract":{"expected":[{"root":"vb","key":"encoder.weight","family":"encoder"},{"root":"vb","key":"head.weight","family":"head"}],
   "families":[{"family":"encoder","expectation":"active","min_present":1},{"family":"head","expectation":"inactive","min_present":0}]}},
 "comparison_identity":{"workload_id":"w","model_id":"m","config_id":"c","data_id":"d","seed_policy":"fixed","precision":"bf16",
  "device_state":"idle","physical_batch":8,"accumulation_steps":2,"implementation_id":"impl-a","pair_id":"p1"}
}`

func TestParseRunFull(t *testing.T) {
	r, err := ParseRun([]byte(fullRunJSON))
	require.NoError(t, err)
	assert.Equal(t, uint64(4), r.WarmupSteps)
	assert.Equal(t, "corr-1", r.CorrelationID)
	assert.Equal(t, "device_synchronized", r.TimingMode)
	assert.True(t, r.MeasuredRegionDeviceSynchronized)
	assert.True(t, r.MeasuredRoot)
	assert.Equal(t, "0.9.1", r.CandleVersion)
	assert.Equal(t, map[string]string{"a": "1", "b": "2"}, r.Tags)
	c := r.Contract
	assert.Equal(t, ScopeProductionEquivalent, c.MeasurementScope)
	assert.Equal(t, []Coverage{CoverageComplete, CoverageComplete, CoveragePartial, CoverageComplete, CoverageComplete, CoveragePartial, CoverageNone},
		[]Coverage{c.Operations, c.Activations, c.Tensors, c.Gradients, c.LogicalMemory, c.PhysicalMemory, c.DeviceTiming})
	assert.Equal(t, []string{"fwd", "opt"}, r.RequiredLabels())
	assert.Equal(t, []string{"fwd"}, c.GPUExpectedSemanticLabels)
	assert.Equal(t, []string{"opt"}, c.CPUOnlySemanticLabels)
	require.NotNil(t, c.GradientContract)
	assert.Equal(t, "sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f", c.GradientContract.ManifestSHA256,
		"the test vector of trace-format.md, computed by ParseRun")
	assert.Equal(t, []ExpectedGradient{{"vb", "encoder.weight", "encoder"}, {"vb", "head.weight", "head"}}, r.ExpectedGradients())
	assert.Equal(t, []GradientFamily{{"encoder", FamilyActive, 1}, {"head", FamilyInactive, 0}}, c.GradientContract.Families)
	require.NotNil(t, r.Identity)
	assert.Equal(t, "w", r.Identity.WorkloadID)
	assert.Equal(t, uint64(8), r.Identity.PhysicalBatch)
	assert.Equal(t, uint64(2), r.Identity.AccumulationSteps)
	require.NotNil(t, r.Identity.ImplementationID)
	assert.Equal(t, "impl-a", *r.Identity.ImplementationID)
	require.NotNil(t, r.Identity.PairID)
	assert.Equal(t, "p1", *r.Identity.PairID)

	// The accessors hand out copies: the session cannot corrupt the run through them.
	r.RequiredLabels()[0] = "x"
	r.ExpectedGradients()[0].Key = "x"
	assert.Equal(t, "fwd", r.Contract.RequiredSemanticLabels[0])
	assert.Equal(t, "encoder.weight", r.Contract.GradientContract.Expected[0].Key)
}

func TestParseRunOptionNulls(t *testing.T) {
	// null means absent for candle-graph's Option fields.
	r, err := ParseRun([]byte(`{"entrypoint":"e","phase":"infer","capture_step":1,"device":"cpu","candle_version":null,"comparison_identity":null,"capture_contract":{"gradient_contract":null}}`))
	require.NoError(t, err)
	assert.Nil(t, r.Identity)
	assert.Equal(t, "", r.CandleVersion)
	assert.Nil(t, r.Contract.GradientContract)
}

func TestParseRunManifestDigestGiven(t *testing.T) {
	base := `{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","capture_contract":{"gradients":"complete","gradient_contract":{%s"expected":[{"root":"vb","key":"encoder.weight","family":"encoder"},{"root":"vb","key":"head.weight","family":"head"}],"families":[{"family":"encoder","expectation":"active","min_present":1},{"family":"head","expectation":"active","min_present":1}]}}}`
	good := `"manifest_sha256":"sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f",`
	_, err := ParseRun([]byte(strings.Replace(base, "%s", good, 1)))
	assert.NoError(t, err, "a correct digest is accepted")
	bad := `"manifest_sha256":"sha256:00",`
	_, err = ParseRun([]byte(strings.Replace(base, "%s", bad, 1)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"capture_contract.gradient_contract.manifest_sha256" is "sha256:00"`)
}

func TestParseRunErrors(t *testing.T) {
	const ok = `"entrypoint":"e","phase":"train","capture_step":2,"device":"cpu"`
	withContract := func(c string) string { return `{` + ok + `,"capture_contract":{` + c + `}}` }
	gc := func(expected, families string) string {
		return withContract(`"gradients":"complete","gradient_contract":{"expected":[` + expected + `],"families":[` + families + `]}`)
	}
	identity := func(extra string) string {
		return `{` + ok + `,"comparison_identity":{"workload_id":"w","model_id":"m","config_id":"c","data_id":"d","seed_policy":"s","precision":"p","device_state":"x","physical_batch":1,"accumulation_steps":1` + extra + `}}`
	}
	const enc = `{"root":"vb","key":"a","family":"enc"}`
	const encActive = `{"family":"enc","expectation":"active","min_present":1}`
	tests := []struct {
		name, in, want string
	}{
		{"missing entrypoint", `{"phase":"train","capture_step":1,"device":"cpu"}`, `"entrypoint" is required`},
		{"blank entrypoint", `{"entrypoint":"  ","phase":"train","capture_step":1,"device":"cpu"}`, `"entrypoint" must not be empty`},
		{"missing device", `{"entrypoint":"e","phase":"train","capture_step":1}`, `"device" is required`},
		{"blank device", `{"entrypoint":"e","phase":"train","capture_step":1,"device":"\t"}`, `"device" must not be empty`},
		{"blank correlation", `{` + ok + `,"correlation_id":" "}`, `"correlation_id" must not be empty`},
		{"missing phase", `{"entrypoint":"e","capture_step":1,"device":"cpu"}`, `"phase" is required`},
		{"bad phase", `{"entrypoint":"e","phase":"training","capture_step":1,"device":"cpu"}`, `"phase" must be one of train|infer, got "training"`},
		{"missing capture_step", `{"entrypoint":"e","phase":"train","device":"cpu"}`, `"capture_step" is required`},
		{"capture_step 0", `{"entrypoint":"e","phase":"train","capture_step":0,"device":"cpu"}`, `run JSON: "capture_step" must be >= 1, got 0`},
		{"capture_step 2.0", `{"entrypoint":"e","phase":"train","capture_step":2.0,"device":"cpu"}`, `"capture_step" must be an integer literal (no fraction or exponent), got 2.0`},
		{"capture_step 2e0", `{"entrypoint":"e","phase":"train","capture_step":2e0,"device":"cpu"}`, `"capture_step" must be an integer literal`},
		{"capture_step string", `{"entrypoint":"e","phase":"train","capture_step":"2","device":"cpu"}`, `"capture_step" must be a non-negative integer, got string "2"`},
		{"capture_step negative", `{"entrypoint":"e","phase":"train","capture_step":-1,"device":"cpu"}`, `"capture_step" must be a non-negative integer, got -1`},
		{"capture_step overflow", `{"entrypoint":"e","phase":"train","capture_step":18446744073709551616,"device":"cpu"}`, `"capture_step" must fit in a u64`},
		{"warmup equal", `{` + ok + `,"warmup_steps":2}`, `"warmup_steps" (2) must be less than "capture_step" (2)`},
		{"warmup greater", `{` + ok + `,"warmup_steps":7}`, `"warmup_steps" (7) must be less than`},
		{"warmup null", `{` + ok + `,"warmup_steps":null}`, `"warmup_steps" must be a non-negative integer, got null`},
		{"bad timing mode", `{` + ok + `,"timing_mode":"device"}`, `"timing_mode" must be one of host|device_synchronized`},
		{"bool as string", `{` + ok + `,"measured_root":"true"}`, `"measured_root" must be true or false, got string "true"`},
		{"duplicate key", `{` + ok + `,"device":"cuda"}`, `duplicate key "device"`},
		{"nested duplicate key", withContract(`"operations":"none","operations":"partial"`), `duplicate key "operations"`},
		{"unknown key", `{` + ok + `,"run_id":"x"}`, `unknown key "run_id"`},
		{"unknown nested key", withContract(`"operation":"complete"`), `unknown key "capture_contract.operation"`},
		{"null tags", `{` + ok + `,"tags":null}`, `"tags" must be an object of string values, got null`},
		{"tag not string", `{` + ok + `,"tags":{"batch":32}}`, `"tags.batch" must be a string, got number 32`},
		{"blank candle_version", `{` + ok + `,"candle_version":""}`, `"candle_version" must not be empty when present`},
		{"not an object", `[1]`, `run JSON: must be a JSON object, got an array`},
		{"invalid JSON", `{"entrypoint":`, `run JSON: invalid JSON`},
		{"trailing data", `{` + ok + `} {}`, `unexpected data after the top-level value`},
		{"empty input", ``, `invalid JSON`},
		{"invalid UTF-8", "{\"entrypoint\":\"e\xff\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", `not valid UTF-8`},
		{"too deep", `{"tags":` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `}`, `nested deeper than 32`},
		{"contract null", `{` + ok + `,"capture_contract":null}`, `"capture_contract" must be an object, got null`},
		{"bad coverage level", withContract(`"operations":"full"`), `"capture_contract.operations" must be one of none|partial|complete, got "full"`},
		{"coverage wrong type", withContract(`"tensors":1`), `"capture_contract.tensors" must be a string, got number 1`},
		{"bad scope", withContract(`"measurement_scope":"all"`), `"capture_contract.measurement_scope" must be one of unknown|profiled_work|production_equivalent`},
		{"labels null", withContract(`"required_semantic_labels":null`), `"capture_contract.required_semantic_labels" must be an array, got null`},
		{"label not string", withContract(`"required_semantic_labels":["a",1]`), `"capture_contract.required_semantic_labels[1]" must be a string`},
		{"blank required label", withContract(`"required_semantic_labels":["a"," "]`), `"required_semantic_labels[1]" must not be empty`},
		{"duplicate required label", withContract(`"required_semantic_labels":["a","a"]`), `required semantic label "a" is declared more than once`},
		{"gpu label not required", withContract(`"required_semantic_labels":["a"],"gpu_expected_semantic_labels":["b"]`), `label "b" is not in required_semantic_labels`},
		{"label in both classes", withContract(`"required_semantic_labels":["a"],"gpu_expected_semantic_labels":["a"],"cpu_only_semantic_labels":["a"]`), `classified as both GPU-expected and CPU-only`},
		{"incomplete partition", withContract(`"required_semantic_labels":["a","b"],"cpu_only_semantic_labels":["a"]`), `must together cover every required semantic label`},
		{"activations complete without operations", withContract(`"activations":"complete","operations":"partial","tensors":"partial"`), `activations complete requires operations complete`},
		{"activations complete without evidence", withContract(`"activations":"complete","operations":"complete"`), `activations complete requires tensors or logical_memory`},
		{"gradients complete without contract", withContract(`"gradients":"complete"`), `gradients complete requires a gradient_contract`},
		{"contract without complete gradients", withContract(`"gradients":"partial","gradient_contract":{"expected":[` + enc + `],"families":[` + encActive + `]}`), `a gradient_contract requires gradients complete, got partial`},
		{"empty manifest", gc(``, encActive), `"expected" must not be empty`},
		{"empty families", gc(enc, ``), `"families" must not be empty`},
		{"blank key", gc(`{"root":"vb","key":" ","family":"enc"}`, encActive), `"expected[0].key" must not be empty`},
		{"missing family field", gc(`{"root":"vb","key":"a"}`, encActive), `"capture_contract.gradient_contract.expected[0].family" is required`},
		{"duplicate root key", gc(enc+`,`+enc, `{"family":"enc","expectation":"active","min_present":1}`), `declares ("vb", "a") more than once`},
		{"duplicate family", gc(enc, encActive+`,`+encActive), `family "enc" is declared more than once`},
		{"family without members", gc(enc, encActive+`,{"family":"other","expectation":"inactive","min_present":0}`), `family "other" has no member`},
		{"undeclared family", gc(enc+`,{"root":"vb","key":"b","family":"head"}`, encActive), `family "head" of ("vb", "b") has no entry in "families"`},
		{"inactive min_present", gc(enc, `{"family":"enc","expectation":"inactive","min_present":1}`), `inactive family "enc" must have min_present 0, got 1`},
		{"active min_present 0", gc(enc, `{"family":"enc","expectation":"active","min_present":0}`), `active family "enc" needs min_present in 1..1`},
		{"conditional min_present above members", gc(enc, `{"family":"enc","expectation":"data_conditional","min_present":2}`), `data_conditional family "enc" needs min_present in 1..1 (its member count), got 2`},
		{"bad expectation", gc(enc, `{"family":"enc","expectation":"sometimes","min_present":1}`), `"capture_contract.gradient_contract.families[0].expectation" must be one of active|inactive|data_conditional`},
		{"min_present float", gc(enc, `{"family":"enc","expectation":"active","min_present":1.5}`), `"capture_contract.gradient_contract.families[0].min_present" must be an integer literal`},
		{"expected entry not object", gc(`"vb/a"`, encActive), `"capture_contract.gradient_contract.expected[0]" must be an object`},
		{"identity duplicate key", identity(`,"model_id":""`), `duplicate key "model_id"`},
		{"identity missing field", `{` + ok + `,"comparison_identity":{"workload_id":"w"}}`, `"comparison_identity.model_id" is required`},
		{"identity blank precision", strings.Replace(identity(``), `"precision":"p"`, `"precision":" "`, 1), `"comparison_identity.precision" must not be empty`},
		{"identity zero batch", strings.Replace(identity(``), `"physical_batch":1`, `"physical_batch":0`, 1), `"comparison_identity.physical_batch" must be > 0`},
		{"identity zero accumulation", strings.Replace(identity(``), `"accumulation_steps":1`, `"accumulation_steps":0`, 1), `"comparison_identity.accumulation_steps" must be > 0`},
		{"identity blank pair", identity(`,"pair_id":" "`), `"comparison_identity.pair_id" must not be empty when present`},
		{"identity blank implementation", identity(`,"implementation_id":""`), `"comparison_identity.implementation_id" must not be empty when present`},
		{"identity unknown key", identity(`,"seed":1`), `unknown key "comparison_identity.seed"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRun([]byte(tt.in))
			require.Error(t, err, "input: %s", tt.in)
			assert.Nil(t, r)
			assert.True(t, strings.HasPrefix(err.Error(), "run JSON: "), err.Error())
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestParseRunIdentityValid(t *testing.T) {
	// The helper used by the identity error cases must itself be valid, or those cases would
	// pass for the wrong reason.
	in := `{"entrypoint":"e","phase":"train","capture_step":2,"device":"cpu","comparison_identity":{"workload_id":"w","model_id":"m","config_id":"c","data_id":"d","seed_policy":"s","precision":"p","device_state":"x","physical_batch":1,"accumulation_steps":1}}`
	r, err := ParseRun([]byte(in))
	require.NoError(t, err)
	require.NotNil(t, r.Identity)
	assert.Nil(t, r.Identity.PairID)
	assert.Nil(t, r.Identity.ImplementationID)
}

func TestParseRunRefusesUnpairedSurrogates(t *testing.T) {
	for _, tc := range []struct {
		name, entrypoint string
		ok               bool
	}{
		{"lone high", `a\ud800b`, false},
		{"lone low", `a\udc00b`, false},
		{"high at end", `a\ud800`, false},
		{"high then non-surrogate", `\ud800\u0041`, false},
		{"valid pair", `\ud83d\ude00`, true},
		{"escaped backslash then u", `a\\ud800`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := `{"entrypoint":"` + tc.entrypoint + `","phase":"train","capture_step":1,"device":"cpu"}`
			r, err := ParseRun([]byte(run))
			if tc.ok {
				require.NoError(t, err)
				require.NotContains(t, r.Entrypoint, "\uFFFD")
				return
			}
			require.ErrorContains(t, err, "unpaired UTF-16 surrogate")
		})
	}
}

func TestParseRunModes(t *testing.T) {
	r, err := ParseRun([]byte(`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":250}`))
	require.NoError(t, err)
	require.Equal(t, "aggregate", r.Mode)
	require.Equal(t, uint64(1), r.CaptureStep, "an aggregate run needs no capture step")
	require.Equal(t, uint64(250), r.AggregateIntervalMs)
	require.Equal(t, "", r.OTLPEndpoint)

	r, err = ParseRun([]byte(`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","otlp_endpoint":"http://127.0.0.1:4318"}`))
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:4318", r.OTLPEndpoint)

	r, err = ParseRun([]byte(`{"entrypoint":"e","phase":"train","capture_step":2,"device":"cpu"}`))
	require.NoError(t, err)
	require.Equal(t, "trace", r.Mode)

	for _, tc := range []struct{ run, msg string }{
		{`{"entrypoint":"e","phase":"train","device":"cpu"}`, `"capture_step"`},
		{`{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","mode":"sampled"}`, `"mode" must be one of trace|aggregate`},
		{`{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","aggregate_interval_ms":5}`, `only for "mode": "aggregate"`},
		{`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":0}`, `"aggregate_interval_ms" must be >= 1`},
		{`{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","otlp_endpoint":"http://c:4318"}`, `"otlp_endpoint" is only for "mode": "aggregate"`},
		{`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","otlp_endpoint":" "}`, `"otlp_endpoint" must not be empty`},
		{`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","otlp_endpoint":4318}`, `"otlp_endpoint"`},
	} {
		_, err := ParseRun([]byte(tc.run))
		require.ErrorContains(t, err, tc.msg, tc.run)
	}
}

func TestParseRunBuffer(t *testing.T) {
	const base = `"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu"`
	tests := []struct {
		name, extra string
		want        *Buffer
		msg         string
	}{
		{"absent", ``, nil, ""},
		{"default size", `,"buffer":{}`, &Buffer{MaxBytes: DefaultBufferMaxBytes}, ""},
		{"given size", `,"buffer":{"max_bytes":4096}`, &Buffer{MaxBytes: 4096}, ""},
		{"one byte", `,"buffer":{"max_bytes":1}`, &Buffer{MaxBytes: 1}, ""},
		{"largest", `,"buffer":{"max_bytes":68719476736}`, &Buffer{MaxBytes: MaxBufferMaxBytes}, ""},
		{"zero", `,"buffer":{"max_bytes":0}`, nil, `"buffer.max_bytes" must be >= 1, got 0`},
		{"negative", `,"buffer":{"max_bytes":-1}`, nil, `"buffer.max_bytes" must be a non-negative integer, got -1`},
		{"fraction", `,"buffer":{"max_bytes":1.5}`, nil, `"buffer.max_bytes" must be an integer literal (no fraction or exponent), got 1.5`},
		{"exponent", `,"buffer":{"max_bytes":1e6}`, nil, `"buffer.max_bytes" must be an integer literal`},
		{"string", `,"buffer":{"max_bytes":"1"}`, nil, `"buffer.max_bytes" must be a non-negative integer, got string "1"`},
		{"too large", `,"buffer":{"max_bytes":68719476737}`, nil, `"buffer.max_bytes" must be at most 68719476736 (64 GiB)`},
		{"unknown key", `,"buffer":{"max_byte":10}`, nil, `unknown key "buffer.max_byte" (allowed: max_bytes)`},
		{"null", `,"buffer":null`, nil, `"buffer" must be an object, got null`},
		{"not an object", `,"buffer":4096`, nil, `"buffer" must be an object`},
		{"aggregate", `,"mode":"aggregate","buffer":{}`, nil, `"buffer" is only for "mode": "trace"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRun([]byte(`{` + base + tc.extra + `}`))
			if tc.msg != "" {
				require.ErrorContains(t, err, tc.msg)
				require.ErrorContains(t, err, "run JSON: ")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, r.Buffer)
		})
	}
}
