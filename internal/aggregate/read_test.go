package aggregate

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
)

// sample builds a small summary with every section filled.
func sample(t testing.TB) *Summary {
	clock := newFakeClock()
	a := New(WithClock(clock))
	for i := range 100 {
		require.NoError(t, a.ObserveSpan("mlp/forward", events.StepForward, uint64(1000+i)))
		require.NoError(t, a.ObserveSpan("mlp/backward", events.StepBackward, uint64(2000+3*i)))
		require.NoError(t, a.ScalarByLabel("loss", 1/float64(i+1)))
	}
	require.NoError(t, a.ObserveSpan("data", events.StepNone, 12))
	clock.Advance(3 * time.Second)
	a.SetEnabled(false)
	clock.Advance(time.Second)
	s := a.Snapshot()
	s.Run = Run{Entrypoint: "mlp::train", Phase: "train", Device: "cpu", CorrelationID: "c", Tags: map[string]string{"k": "v"}}
	s.Producer = Producer{Name: "candle-trace", Version: "0.1.0", PID: 42, Hostname: "h"}
	s.Sequence, s.Final = 3, true
	return s
}

func encode(t testing.TB, s *Summary) []byte {
	var buf bytes.Buffer
	require.NoError(t, s.Encode(&buf))
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	s := sample(t)
	data := encode(t, s)
	got, err := Parse(data)
	require.NoError(t, err)
	assert.Equal(t, s, got)
	assert.True(t, bytes.HasPrefix(data, []byte("{\n \"schema\": \"candle-trace/aggregate/1\",\n")), "%s", data)
	assert.NotContains(t, string(data), `"kind"`)
	// One span per line.
	assert.Contains(t, string(data), "\n  {\"name\":\"mlp/backward\",\"step\":\"backward\",\"count\":100,")
	path := filepath.Join(t.TempDir(), "s.json")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	got, err = ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, s, got)
}

func TestIsSummary(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`{"schema":"candle-trace/aggregate/1","run":`, true},
		{" \n{ \"schema\" : \"candle-trace/aggregate/1\"", true},
		{`{"kind":"meta","schema":"candle-graph/trace/10"}`, false},
		{`{"schema":"candle-graph/trace/10"}`, false},
		{`{"run":{},"schema":"candle-trace/aggregate/1"}`, false},
		{`[]`, false},
		{``, false},
		{`{"sch`, false},
	} {
		assert.Equal(t, tc.want, IsSummary([]byte(tc.in)), tc.in)
	}
}

// Every way a document can be wrong, each refused with a message that
// says where.
func TestParseRefuses(t *testing.T) {
	good := string(encode(t, sample(t)))
	tests := []struct {
		name, old, new, err string
	}{
		{"not a summary", `"schema": "candle-trace/aggregate/1"`, `"schema": "candle-trace/aggregate/2"`, "not a candle-trace/aggregate/1 document"},
		{"duplicate key", `"final": true,`, `"final": true, "final": true,`, `duplicate key "final"`},
		{"null", `"final": true`, `"final": null`, "final: null is not allowed"},
		{"missing key", `"sequence": 3,`, ``, `missing "sequence"`},
		{"missing nested", `"duration_ns":4000000000`, `"x":1`, `window: missing "duration_ns"`},
		{"unknown key", `"final": true,`, `"final": true, "extra": 1,`, `unknown field "extra"`},
		{"bucket triple", `"buckets":[[12,1]]`, `"buckets":[[12,1,0]]`, "a bucket is [index, count], got 3"},
		{"fraction", `"sequence": 3`, `"sequence": 3.0`, "sequence"},
		{"negative", `"sequence": 3`, `"sequence": -3`, "sequence"},
		{"bad phase", `"phase":"train"`, `"phase":"eval"`, "phase must be train or infer"},
		{"layout", `"sub_bucket_bits":4`, `"sub_bucket_bits":3`, "histogram layout"},
		{"window", `"duration_ns":4000000000`, `"duration_ns":4000000001`, "window: end_unix_ns − start_unix_ns"},
		{"count mismatch", `"name":"data","count":1`, `"name":"data","count":2`, "bucket counts sum to 1, count is 2"},
		{"empty bucket", `"buckets":[[12,1]]`, `"buckets":[[11,0],[12,1]]`, "bucket 11 is empty"},
		{"unordered", `"buckets":[[12,1]]`, `"buckets":[[12,1],[12,1]]`, "indices must increase"},
		{"out of range", `"buckets":[[12,1]]`, `"buckets":[[976,1]]`, "below 976"},
		{"percentile", `"p50_ns":12`, `"p50_ns":13`, "p50_ns 13, the buckets give 12"},
		{"min outside", `"min_ns":12,"max_ns":12`, `"min_ns":11,"max_ns":12`, "must lie in the first"},
		{"mean", `"mean_ns":12,`, `"mean_ns":12.5,`, "mean_ns 12.5"},
		{"total", `"total_ns":12,`, `"total_ns":13,`, "exceeds count × max_ns"},
		{"bad step", `"step":"forward"`, `"step":"fwd"`, `step "fwd"`},
		{"scalar order", `"label":"loss","count":100,`, `"label":"loss","count":0,`, "count is 0 but"},
		{"open period", `"open":false`, `"open":true`, "only the last period can be open"},
		{"trailing", "\"producer\":0}\n}", "\"producer\":0}\n}\n{}", "unexpected data after the document"},
		{"cut", "\"producer\":0}\n}", "\"producer\":0}\n", "invalid JSON"},
		{"trace", `{` + "\n" + ` "schema"`, `{"kind":"meta", "schema"`, "first key must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, good, tc.old)
			_, err := Parse([]byte(strings.Replace(good, tc.old, tc.new, 1)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
			assert.True(t, strings.HasPrefix(err.Error(), "summary: "), err.Error())
		})
	}
	_, err := Parse([]byte("\xff"))
	assert.ErrorContains(t, err, "UTF-8")
	_, err = Read(bytes.NewReader(make([]byte, MaxSummaryBytes+1)))
	assert.ErrorContains(t, err, "larger than")
}

func TestRunFrom(t *testing.T) {
	r, err := events.ParseRun([]byte(`{"entrypoint":"mlp::train","phase":"train","capture_step":3,"device":"cpu","binding":"rust","tags":{"a":"b"}}`))
	require.NoError(t, err)
	got := RunFrom(r)
	assert.Equal(t, Run{Entrypoint: "mlp::train", Phase: "train", Device: "cpu", CorrelationID: "mlp::train/update-3", Binding: "rust", Tags: map[string]string{"a": "b"}}, got)
	got.Tags["a"] = "changed"
	assert.Equal(t, "b", r.Tags["a"], "tags are copied")
}

func TestOTLPBlock(t *testing.T) {
	s := sample(t)
	s.OTLP = &OTLPPush{Endpoint: "http://127.0.0.1:4318/v1/metrics", Pushed: 5, Dropped: 2, LastError: "POST …: no collector reachable"}
	data := encode(t, s)
	assert.True(t, bytes.HasSuffix(data, []byte(",\n \"otlp\": {\"endpoint\":\"http://127.0.0.1:4318/v1/metrics\",\"pushed\":5,\"dropped\":2,\"last_error\":\"POST …: no collector reachable\"}\n}\n")), "%s", data)
	got, err := Parse(data)
	require.NoError(t, err)
	assert.Equal(t, s, got)
	for _, tc := range []struct{ from, to, err string }{
		{`"otlp": {"endpoint"`, `"otlp": null, "x": {"endpoint"`, "otlp: null is not allowed"},
		{`,"last_error":"POST …: no collector reachable"`, ``, `otlp: missing "last_error"`},
		{`"pushed":5`, `"pushed":-5`, "cannot unmarshal"},
	} {
		_, err := Parse([]byte(strings.Replace(string(data), tc.from, tc.to, 1)))
		assert.ErrorContains(t, err, tc.err, tc.to)
	}
}

// fakePusher records what a Writer offers.
type fakePusher struct{ offered []*Summary }

func (p *fakePusher) Offer(s *Summary) { p.offered = append(p.offered, s) }
func (p *fakePusher) Stats() OTLPPush {
	return OTLPPush{Endpoint: "e", Pushed: uint64(len(p.offered))}
}

func TestWriterOffersEverySummary(t *testing.T) {
	p := &fakePusher{}
	path := filepath.Join(t.TempDir(), "s.json")
	w, err := NewWriter(path, New(), Run{Entrypoint: "e", Phase: "train", Device: "cpu"}, WithInterval(0), WithPush(p))
	require.NoError(t, err)
	require.NoError(t, w.Start())
	require.NoError(t, w.WriteNow())
	require.NoError(t, w.Finish())
	require.Len(t, p.offered, 3)
	assert.Equal(t, []uint64{1, 2, 3}, []uint64{p.offered[0].Sequence, p.offered[1].Sequence, p.offered[2].Sequence})
	assert.True(t, p.offered[2].Final)
	got, err := ReadFile(path)
	require.NoError(t, err)
	require.NotNil(t, got.OTLP)
	assert.Equal(t, OTLPPush{Endpoint: "e", Pushed: 2}, *got.OTLP, "the final summary states the pushes before it")
}
