package traces

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/candle-trace/candle-trace/internal/otlp"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// Export to a real OpenTelemetry Collector (tools/otelcol: otlp receiver,
// file exporter), read back from what its file exporter wrote: what a
// backend behind a collector would get.

// collectedSpans waits until the collector has written want spans and
// returns them with their resources.
func collectedSpans(t *testing.T, c *testutil.Collector, want int) []collectedSpan {
	t.Helper()
	var got []collectedSpan
	deadline := time.Now().Add(15 * time.Second)
	for {
		got = got[:0]
		var u ptrace.JSONUnmarshaler
		for _, line := range c.Lines(c.TracesOut) {
			td, err := u.UnmarshalTraces(line)
			require.NoError(t, err, "the file exporter wrote a line that is not OTLP JSON: %s", line)
			for i := 0; i < td.ResourceSpans().Len(); i++ {
				rs := td.ResourceSpans().At(i)
				for j := 0; j < rs.ScopeSpans().Len(); j++ {
					ss := rs.ScopeSpans().At(j)
					for k := 0; k < ss.Spans().Len(); k++ {
						got = append(got, collectedSpan{Span: ss.Spans().At(k), Resource: rs.Resource(), Scope: ss.Scope()})
					}
				}
			}
		}
		if len(got) >= want || time.Now().After(deadline) {
			require.Len(t, got, want, "spans in the collector's output; its log:\n%s", c.Log())
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type collectedSpan struct {
	ptrace.Span
	Resource pcommon.Resource
	Scope    pcommon.InstrumentationScope
}

func attr(m pcommon.Map, k string) any {
	v, ok := m.Get(k)
	if !ok {
		return nil
	}
	return v.AsRaw()
}

// rankedDemo is the demo trace as rank 3 of 4 wrote it.
func rankedDemo(t *testing.T) string {
	data, err := os.ReadFile(filepath.Join("testdata", "demo.jsonl"))
	require.NoError(t, err)
	ranked := strings.Replace(string(data), `"process":{"pid":9375,"hostname":"vm"}`, `"process":{"pid":9375,"hostname":"vm","rank":3,"world_size":4}`, 1)
	require.NotEqual(t, string(data), ranked)
	path := filepath.Join(t.TempDir(), "demo-rank3.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(ranked), 0o644))
	return path
}

func TestCollectorReceivesTheDemoTrace(t *testing.T) {
	col := testutil.StartCollector(t)
	c, err := otlp.NewClient(col.Endpoint(), otlp.ClientOptions{})
	require.NoError(t, err)
	res, err := ExportFile(context.Background(), rankedDemo(t), c, Options{ServiceName: "demo-test"})
	require.NoError(t, err)
	// 5 spans, 4 ops, no device intervals.
	assert.Equal(t, []int{9, 4, 0, 0, 1}, []int{res.Spans, res.Ops, res.DeviceIntervals, res.OpenSpans, res.Requests})
	assert.Equal(t, AnchorWallClock, res.Anchor)

	got := collectedSpans(t, col, 9)
	const wall = 1796145237194390758 // meta.clock.wall_unix_ns_at_open
	byName := map[string]collectedSpan{}
	for _, s := range got {
		byName[s.Name()] = s
		assert.Equal(t, res.TraceID, s.TraceID().String(), "one trace")
	}
	// Spans: name, parent, start (session clock + wall clock at open), duration.
	for _, tc := range []struct {
		name, parent string
		start, dur   uint64
	}{
		{"demo::train_step", "", 0, 410199},
		{"train/update", "demo::train_step", 263083, 144078},
		{"mlp/forward", "train/update", 264079, 80151},
		{"mlp/backward", "train/update", 352409, 14261},
		{"sgd/step", "train/update", 397460, 9665},
		{"matmul_relu", "mlp/forward", 264321, 8781},
		{"matmul", "mlp/forward", 326405, 1979},
		{"matmul_backward", "mlp/backward", 352482, 9415},
	} {
		s, ok := byName[tc.name]
		require.True(t, ok, tc.name)
		if tc.parent == "" {
			assert.True(t, s.ParentSpanID().IsEmpty(), "%s is a root", tc.name)
		} else {
			assert.Equal(t, byName[tc.parent].SpanID(), s.ParentSpanID(), "%s's parent is %s", tc.name, tc.parent)
		}
		assert.Equal(t, uint64(wall+tc.start), uint64(s.StartTimestamp()), tc.name)
		assert.Equal(t, tc.dur, uint64(s.EndTimestamp()-s.StartTimestamp()), tc.name)
	}
	// Attributes.
	fwd := byName["mlp/forward"].Attributes()
	assert.Equal(t, map[string]any{"candle.record": "span", "candle.span.id": "s3", "candle.span.kind": "module", "candle.step": "forward", "thread.id": int64(9375)}, fwd.AsRaw())
	upd := byName["train/update"].Attributes()
	assert.Equal(t, true, attr(upd, attrMeasured))
	assert.Equal(t, int64(0), attr(upd, attrTracerNS))
	root := byName["demo::train_step"]
	assert.Equal(t, "complete", attr(root.Attributes(), attrOutcome))
	assert.Equal(t, ptrace.StatusCodeUnset, root.Status().Code())
	op := byName["matmul"].Attributes()
	assert.Equal(t, "op", attr(op, attrRecord))
	assert.Equal(t, "f32", attr(op, attrDType))
	assert.Equal(t, int64(512), attr(op, attrOutputBytes))
	// Resource: service, run, rank, world size, host, device.
	r := root.Resource.Attributes()
	for k, v := range map[string]any{
		"service.name": "demo-test", "candle.run_id": "run-9375-1796145237194390758", "candle.rank": int64(3), "candle.world_size": int64(4),
		"host.name": "vm", "process.pid": int64(9375), "candle.device": "cpu", "candle.phase": "train", "candle.entrypoint": "demo::train_step",
		"candle.capture_step": int64(3), "candle.tag.example": "c",
	} {
		assert.Equal(t, v, attr(r, k), k)
	}
	assert.Equal(t, "candle-trace", root.Scope.Name())
	assert.Equal(t, "0.1.0", root.Scope.Version())
}
