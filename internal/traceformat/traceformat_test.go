package traceformat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(t), rel))
	require.NoError(t, err, "the copy this test holds to traceformat is missing")
	return string(b)
}

// schemaAt walks the JSON schema along keys and returns the node found.
func schemaAt(t *testing.T, node any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		m, ok := node.(map[string]any)
		require.True(t, ok, "schema: %v is not an object at %q", keys, k)
		node, ok = m[k]
		require.True(t, ok, "schema: no %q along %v", k, keys)
	}
	return node
}

func schemaEnum(t *testing.T, root any, keys ...string) []string {
	t.Helper()
	raw, ok := schemaAt(t, root, keys...).([]any)
	require.True(t, ok, "schema: %v is not an array", keys)
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		out = append(out, v.(string))
	}
	return out
}

func schemaConst(t *testing.T, root any, keys ...string) string {
	t.Helper()
	s, ok := schemaAt(t, root, keys...).(string)
	require.True(t, ok, "schema: %v is not a string", keys)
	return s
}

// TestSchemaSpellsLikeTraceformat: every enum of docs/trace-format.schema.json
// holds exactly our spellings (the schema's order is free, so as sets).
func TestSchemaSpellsLikeTraceformat(t *testing.T) {
	var root any
	require.NoError(t, json.Unmarshal([]byte(readRepoFile(t, "docs/trace-format.schema.json")), &root))
	defs := func(k ...string) []string { return append([]string{"$defs"}, k...) }
	var stepEnum []string
	for _, alt := range schemaAt(t, root, defs("span_start", "properties", "step", "oneOf")...).([]any) {
		if e, ok := alt.(map[string]any)["enum"]; ok {
			for _, v := range e.([]any) {
				stepEnum = append(stepEnum, v.(string))
			}
		}
	}
	tests := []struct {
		name   string
		schema []string
		want   []string
	}{
		{"kind", schemaEnum(t, root, "properties", "kind", "enum"), Kinds},
		{"span_kind", schemaEnum(t, root, defs("span_start", "properties", "span_kind", "enum")...), SpanKinds},
		{"step", stepEnum, Steps},
		{"memory action", schemaEnum(t, root, defs("memory", "properties", "action", "enum")...), MemoryActions},
		{"gradient state", schemaEnum(t, root, defs("gradient", "properties", "state", "enum")...), GradientStates},
		{"category", schemaEnum(t, root, defs("category", "enum")...), Categories},
		{"phase", schemaEnum(t, root, defs("meta", "properties", "phase", "enum")...), Phases},
		{"timing_mode", schemaEnum(t, root, defs("meta", "properties", "timing_mode", "enum")...), TimingModes},
		{"measurement_scope", schemaEnum(t, root, defs("capture_contract", "properties", "measurement_scope", "enum")...), MeasurementScopes},
		{"coverage", schemaEnum(t, root, defs("coverage", "enum")...), Coverages},
		{"outcome", schemaEnum(t, root, defs("terminal", "properties", "outcome", "enum")...), Outcomes},
		{"edge_kind", []string{
			schemaConst(t, root, defs("edge_call", "properties", "edge_kind", "const")...),
			schemaConst(t, root, defs("edge_data", "properties", "edge_kind", "const")...),
		}, EdgeKinds},
		{"schema", []string{schemaConst(t, root, defs("meta", "properties", "schema", "const")...)}, []string{Schema}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ElementsMatch(t, tc.want, tc.schema)
		})
	}
	// The family expectation sits inside an array item of the contract.
	fam := readRepoFile(t, "docs/trace-format.schema.json")
	assert.Contains(t, fam, `"expectation": { "enum": ["`+strings.Join(FamilyExpectations, `", "`)+`"] }`)
}

// abiMembers reads `CT_PREFIX_NAME = N` lines (Python's IntEnum classes and
// Rust's ffi enums both spell the header's constants so) into spelling by
// value: the name after the prefix, lower-cased, is the wire spelling.
func abiMembers(t *testing.T, src, prefix string) map[int]string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s*` + prefix + `([A-Z_]+)\s*=\s*(\d+)`)
	out := map[int]string{}
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		v, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		out[v] = strings.ToLower(m[1])
	}
	require.NotEmpty(t, out, "no %s constants found", prefix)
	return out
}

// byValue lays values out as the ABI does: spelling i at value i+offset.
func byValue(values []string, offset int) map[int]string {
	out := map[int]string{}
	for i, v := range values {
		out[i+offset] = v
	}
	return out
}

// TestBindingsSpellLikeTraceformat: the Python and Rust bindings name the C
// ABI's enum values; lower-cased, those names must be our spellings at the
// same values, and the literal spellings each binding writes must be ours.
func TestBindingsSpellLikeTraceformat(t *testing.T) {
	sources := map[string]string{
		"python": readRepoFile(t, "bindings/python/candle_trace/_lib.py"),
		"rust":   readRepoFile(t, "bindings/rust/src/ffi.rs"),
	}
	steps := byValue(Steps, 1)
	steps[0] = "none" // CT_STEP_NONE: no step field
	abi := []struct {
		prefix string
		want   map[int]string
	}{
		{"CT_SPAN_", byValue(SpanKinds, 0)},
		{"CT_STEP_", steps},
		{"CT_MEMORY_", byValue(MemoryActions, 0)},
		{"CT_GRADIENT_", byValue(GradientStates, 0)},
		{"CT_CATEGORY_", byValue(Categories, 0)},
	}
	for lang, src := range sources {
		for _, e := range abi {
			t.Run(lang+"/"+e.prefix, func(t *testing.T) {
				assert.Equal(t, e.want, abiMembers(t, src, e.prefix))
			})
		}
	}

	t.Run("python/torch span tables", func(t *testing.T) {
		src := readRepoFile(t, "bindings/python/candle_trace/torch/_spans.py")
		dict := func(name string) map[int]string {
			m := regexp.MustCompile(`(?m)^` + name + ` = \{([^}]*)\}`).FindStringSubmatch(src)
			require.NotNil(t, m, "%s not found", name)
			out := map[int]string{}
			for _, kv := range regexp.MustCompile(`"([a-z_]+)":\s*(\d+)`).FindAllStringSubmatch(m[1], -1) {
				v, _ := strconv.Atoi(kv[2])
				out[v] = kv[1]
			}
			return out
		}
		assert.Equal(t, byValue(SpanKinds, 0), dict("_KIND"))
		assert.Equal(t, byValue(Steps, 1), dict("_STEP"), "None is value 0")
	})
	t.Run("python/gradient expectations", func(t *testing.T) {
		src := readRepoFile(t, "bindings/python/candle_trace/torch/_gradients.py")
		m := regexp.MustCompile(`(?m)^EXPECTATIONS = \(([^)]*)\)`).FindStringSubmatch(src)
		require.NotNil(t, m)
		var got []string
		for _, q := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(m[1], -1) {
			got = append(got, q[1])
		}
		assert.Equal(t, FamilyExpectations, got)
	})
	t.Run("rust/gradient state names", func(t *testing.T) {
		src := readRepoFile(t, "bindings/rust/src/session.rs")
		var got []string
		for _, m := range regexp.MustCompile(`Gradient::\w+(?:\(_\))? => "([a-z_]+)"`).FindAllStringSubmatch(src, -1) {
			got = append(got, m[1])
		}
		assert.ElementsMatch(t, GradientStates, got)
	})
}

func TestIndex(t *testing.T) {
	assert.Equal(t, 3, Index(GradientStates, "non_finite"))
	assert.Equal(t, 0, Index(Categories, "other"))
	assert.Equal(t, -1, Index(Categories, "Other"), "spellings are exact")
}
