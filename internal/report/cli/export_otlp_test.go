package cli

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

func TestExportOTLPCommand(t *testing.T) {
	col := testutil.StartCollector(t)
	down := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("\x08\x03\x12\x0bno tenant X")) // google.rpc.Status{code: 3, message: "no tenant X"}
	}))
	defer refusing.Close()
	demo := filepath.Join("..", "..", "otlp", "traces", "testdata", "demo.jsonl")
	tests := []struct {
		name   string
		args   []string
		want   int
		stderr []string
	}{
		{"trace", []string{"export", "--format", "otlp", "--endpoint", col.Endpoint(), demo}, ExitOK,
			[]string{col.Endpoint() + "/v1/traces: 9 spans (5 spans, 4 ops, 0 device intervals) in 1 request from 31 lines"}},
		{"summary", []string{"export", corpus("aggregate-a.json"), "--format=otlp", "--endpoint", col.Endpoint(), "--service-name", "svc"}, ExitOK,
			[]string{col.Endpoint() + "/v1/metrics: 13 metrics, 26 data points from summary 7 (7 span names, 2 scalars), run run-4242-1800000000000000000"}},
		{"partial trace", []string{"export", "--format", "otlp", "--endpoint", col.Endpoint(), corpus("partial-no-terminal.jsonl")}, ExitOK,
			[]string{"partial trace (no terminal record)", "3 open spans end at the last timestamp"}},
		{"collector down", []string{"export", "--format", "otlp", "--endpoint", down, "--timeout", "2s", demo}, ExitProblem,
			[]string{"candle-trace export: " + demo + ": POST " + down + "/v1/traces: no collector reachable (after 3 attempts): ", "connection refused"}},
		{"collector refuses", []string{"export", "--format", "otlp", "--endpoint", refusing.URL, corpus("aggregate-a.json")}, ExitProblem,
			[]string{"POST " + refusing.URL + "/v1/metrics: the collector answered 400 Bad Request: no tenant X"}},
		{"not a trace", []string{"export", "--format", "otlp", "--endpoint", col.Endpoint(), corpus("bad-invalid_utf8.jsonl")}, ExitProblem,
			[]string{"stopped at line"}},
		{"missing file", []string{"export", "--format", "otlp", "--endpoint", col.Endpoint(), "nope.jsonl"}, ExitProblem,
			[]string{"nope.jsonl: open nope.jsonl: no such file or directory"}},
		{"bad endpoint", []string{"export", "--format", "otlp", "--endpoint", "127.0.0.1:4318", demo}, ExitUsage,
			[]string{"want an http:// or https:// URL"}},
		{"-o with otlp", []string{"export", "--format", "otlp", "-o", "x.json", demo}, ExitUsage, []string{"-o is for --format chrome"}},
		{"bad header", []string{"export", "--format", "otlp", "--header", "novalue", demo}, ExitUsage, []string{`"novalue" is not KEY=VALUE`}},
		{"unknown format", []string{"export", "--format", "zipkin", demo}, ExitUsage, []string{"the formats are chrome and otlp"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, _, errOut := run(tc.args...)
			assert.Equal(t, tc.want, code, errOut)
			for _, s := range tc.stderr {
				assert.Contains(t, errOut, s)
			}
			assert.Less(t, time.Since(start), 10*time.Second, "a collector that is down is reported promptly")
		})
	}
	// What the collector wrote: the demo's 9 spans, the partial trace's
	// spans and ops (5 + 4 + 3 device intervals), the 3 open spans of the
	// trace that stops being readable at line 5; one metrics request.
	var traces, metrics int
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if traces, metrics = len(col.Lines(col.TracesOut)), len(col.Lines(col.MetricsOut)); traces >= 3 && metrics >= 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, []int{3, 1}, []int{traces, metrics}, "traces and metrics requests the collector wrote; its log:\n%s", col.Log())
}
