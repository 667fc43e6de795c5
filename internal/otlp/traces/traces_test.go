package traces

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/candle-trace/candle-trace/internal/otlp"
)

// spanSink is an OTLP/HTTP endpoint that decodes every traces request.
type spanSink struct {
	mu       sync.Mutex
	requests int
	spans    []ptrace.Span
	refuse   bool
}

func (s *spanSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("\x08\x03\x12\x07refused")) // google.rpc.Status{code: 3, message: "refused"}
		return
	}
	var u ptrace.ProtoUnmarshaler
	body, err := io.ReadAll(r.Body)
	if err == nil {
		var td ptrace.Traces
		if td, err = u.UnmarshalTraces(body); err == nil {
			s.add(td)
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (s *spanSink) add(td ptrace.Traces) {
	s.requests++
	rs := td.ResourceSpans()
	for i := 0; i < rs.Len(); i++ {
		ss := rs.At(i).ScopeSpans()
		for j := 0; j < ss.Len(); j++ {
			for k := 0; k < ss.At(j).Spans().Len(); k++ {
				s.spans = append(s.spans, ss.At(j).Spans().At(k))
			}
		}
	}
}

func exportTo(t *testing.T, path string, opts Options) (*Result, *spanSink) {
	t.Helper()
	sink := &spanSink{}
	srv := httptest.NewServer(sink)
	t.Cleanup(srv.Close)
	c, err := otlp.NewClient(srv.URL, otlp.ClientOptions{})
	require.NoError(t, err)
	res, err := ExportFile(context.Background(), path, c, opts)
	require.NoError(t, err)
	return res, sink
}

func corpus(name string) string { return filepath.Join("..", "..", "report", "testdata", name) }

func byName(spans []ptrace.Span) map[string]ptrace.Span {
	m := map[string]ptrace.Span{}
	for _, s := range spans {
		m[s.Name()] = s
	}
	return m
}

func TestExportTraceBatches(t *testing.T) {
	for _, batch := range []int{1, 2, 4, 9, 100} {
		res, sink := exportTo(t, filepath.Join("testdata", "demo.jsonl"), Options{BatchSpans: batch})
		assert.Equal(t, 9, res.Spans)
		assert.Equal(t, (9+batch-1)/batch, res.Requests, "batch %d", batch)
		assert.Equal(t, res.Requests, sink.requests)
		ids := map[string]bool{}
		for _, s := range sink.spans {
			ids[s.SpanID().String()] = true
		}
		assert.Len(t, ids, 9, "every span once, with its own id (batch %d)", batch)
	}
}

func TestExportTraceIDsAreDerived(t *testing.T) {
	a, sa := exportTo(t, filepath.Join("testdata", "demo.jsonl"), Options{})
	b, sb := exportTo(t, filepath.Join("testdata", "demo.jsonl"), Options{BatchSpans: 2})
	assert.Equal(t, a.TraceID, b.TraceID)
	na, nb := byName(sa.spans), byName(sb.spans)
	for name, s := range na {
		assert.Equal(t, s.SpanID(), nb[name].SpanID(), "%s: the same id on every export", name)
	}
	// Another run: another trace.
	data, err := os.ReadFile(filepath.Join("testdata", "demo.jsonl"))
	require.NoError(t, err)
	other := filepath.Join(t.TempDir(), "other.jsonl")
	require.NoError(t, os.WriteFile(other, []byte(strings.Replace(string(data), "run-9375-", "run-9376-", 1)), 0o644))
	c, _ := exportTo(t, other, Options{})
	assert.NotEqual(t, a.TraceID, c.TraceID)
}

func TestExportTraceDeviceIntervals(t *testing.T) {
	res, sink := exportTo(t, corpus("valid-train.jsonl"), Options{})
	// 5 spans, 4 ops, 4 host-clock intervals.
	assert.Equal(t, []int{13, 4, 4, 0}, []int{res.Spans, res.Ops, res.DeviceIntervals, res.UnalignedIntervals})
	spans := byName(sink.spans)
	k := spans["sgemm"]
	assert.Equal(t, spans["train/forward"].SpanID(), k.ParentSpanID(), "a kernel is a child of its launching span")
	assert.Equal(t, uint64(980), uint64(k.EndTimestamp()-k.StartTimestamp()))
	assert.Equal(t, uint64(1786000000000000000+310), uint64(k.StartTimestamp()))
	a := k.Attributes().AsRaw()
	assert.Equal(t, map[string]any{"candle.record": "device_interval", "candle.device_interval.device": "cuda:0",
		"candle.device_interval.stream": "7", "candle.device_interval.backend": "cuda"}, a)
	// A device clock is not the host's: such intervals are left out.
	res, _ = exportTo(t, corpus("warn-device_interval_outside_session.jsonl"), Options{})
	assert.Equal(t, res.Spans, 5+res.Ops+res.DeviceIntervals)
}

func TestExportTraceFailedAndPartial(t *testing.T) {
	for _, tc := range []struct {
		file          string
		open, spans   int
		outcome, stat string
		incomplete    bool
	}{
		{"failed-capture_failed.jsonl", 3, 13, "failed", "capture failed: out of memory in optimizer", false},
		{"partial-no-terminal.jsonl", 3, 12, "incomplete", "not closed", true},
		{"partial-cut-line.jsonl", 3, 12, "incomplete", "not closed", true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			res, sink := exportTo(t, corpus(tc.file), Options{})
			assert.Equal(t, tc.open, res.OpenSpans)
			assert.Equal(t, tc.spans, res.Spans)
			assert.Equal(t, tc.incomplete, res.Stream.Incomplete)
			spans := byName(sink.spans)
			root := spans["demo::train"]
			outcome, _ := root.Attributes().Get(attrOutcome)
			assert.Equal(t, tc.outcome, outcome.Str())
			assert.Equal(t, ptrace.StatusCodeError, root.Status().Code())
			assert.Contains(t, root.Status().Message(), tc.stat)
			// An open span ends at the last timestamp of the trace.
			step := spans["train/step"]
			open, _ := step.Attributes().Get(attrOpen)
			assert.True(t, open.Bool())
			assert.Equal(t, ptrace.StatusCodeError, step.Status().Code())
			assert.Greater(t, step.EndTimestamp(), step.StartTimestamp())
			// Closed spans are plain.
			fwd := spans["train/forward"]
			_, isOpen := fwd.Attributes().Get(attrOpen)
			assert.False(t, isOpen)
			assert.Equal(t, ptrace.StatusCodeUnset, fwd.Status().Code())
		})
	}
}

func TestExportTraceAnchors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "demo.jsonl"))
	require.NoError(t, err)
	noClock := filepath.Join(t.TempDir(), "no-clock.jsonl")
	require.NoError(t, os.WriteFile(noClock, []byte(strings.Replace(string(data), `"clock":{"host":"monotonic","wall_unix_ns_at_open":1796145237194390758},`, "", 1)), 0o644))
	res, sink := exportTo(t, noClock, Options{})
	assert.Equal(t, AnchorTimestamp, res.Anchor)
	// meta.timestamp 2026-12-01T17:13:57.194Z, plus the root's start 0.
	assert.Equal(t, uint64(1796145237194000000), uint64(byName(sink.spans)["demo::train_step"].StartTimestamp()))
}

func TestExportTraceStopsAtTheFirstRefusal(t *testing.T) {
	sink := &spanSink{refuse: true}
	srv := httptest.NewServer(sink)
	defer srv.Close()
	c, err := otlp.NewClient(srv.URL, otlp.ClientOptions{})
	require.NoError(t, err)
	_, err = ExportFile(context.Background(), filepath.Join("testdata", "demo.jsonl"), c, Options{BatchSpans: 1})
	assert.EqualError(t, err, "POST "+srv.URL+"/v1/traces: the collector answered 400 Bad Request: refused")

	_, err = Export(context.Background(), strings.NewReader(`{"kind":"span_end","id":"s1","duration_ns":1}`+"\n"), c, Options{})
	assert.ErrorContains(t, err, "a trace starts with a meta record")
}

// jobTraces writes a 2-rank synthetic job whose ranks carry jobID (none
// when "") and returns the traces.
func jobTraces(t *testing.T, jobID string) []string {
	t.Helper()
	m := jobtest.Even(2)
	m.JobID = jobID
	paths, err := m.Write(t.TempDir())
	require.NoError(t, err)
	return paths
}

func TestExportTraceJobIDIsTheTraceID(t *testing.T) {
	for _, tc := range []struct {
		name, job string
		shared    bool
	}{
		{"no job id: a trace per rank", "", false},
		{"a job id: one trace", "a1b2-job", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			paths := jobTraces(t, tc.job)
			var results []*Result
			var sinks []*spanSink
			for _, p := range paths {
				res, sink := exportTo(t, p, Options{})
				results, sinks = append(results, res), append(sinks, sink)
			}
			assert.Equal(t, tc.job, results[0].JobID)
			if tc.shared {
				sum := sha256.Sum256([]byte("job\x00" + tc.job + "\x00m::train/update-3"))
				assert.Equal(t, hex.EncodeToString(sum[:16]), results[0].TraceID)
				assert.Equal(t, results[0].TraceID, results[1].TraceID)
			} else {
				assert.NotEqual(t, results[0].TraceID, results[1].TraceID)
			}
			// The ranks' span ids repeat (s1, s2, ...); their OTLP ids never do,
			// and each rank's parent links stay within the rank.
			ids := map[pcommon.SpanID]int{}
			for rank, sink := range sinks {
				for _, s := range sink.spans {
					_, dup := ids[s.SpanID()]
					assert.False(t, dup, "rank %d: span %s has another rank's id", rank, s.Name())
					ids[s.SpanID()] = rank
				}
			}
			for rank, sink := range sinks {
				roots := 0
				for _, s := range sink.spans {
					if s.ParentSpanID().IsEmpty() {
						roots++
						assert.Equal(t, "m::train", s.Name())
						continue
					}
					owner, ok := ids[s.ParentSpanID()]
					assert.True(t, ok && owner == rank, "rank %d: %s's parent is rank %d's", rank, s.Name(), owner)
				}
				assert.Equal(t, 1, roots, "rank %d: one root, a child of nothing", rank)
			}
		})
	}
	// Another job, or another update of the same job: another trace.
	a, _ := exportTo(t, jobTraces(t, "a1b2-job")[0], Options{})
	b, _ := exportTo(t, jobTraces(t, "c3d4-job")[0], Options{})
	assert.NotEqual(t, a.TraceID, b.TraceID)
}
