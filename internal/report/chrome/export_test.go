package chrome

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromeEvent is one decoded Chrome trace event.
type chromeEvent struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int64          `json:"pid"`
	TID  uint64         `json:"tid"`
	ID   uint64         `json:"id"`
	BP   string         `json:"bp"`
	Args map[string]any `json:"args"`
}

type chromeDoc struct {
	TraceEvents     []chromeEvent     `json:"traceEvents"`
	DisplayTimeUnit string            `json:"displayTimeUnit"`
	OtherData       map[string]string `json:"otherData"`
}

func (d *chromeDoc) phases() map[string]int {
	out := map[string]int{}
	for _, e := range d.TraceEvents {
		out[e.Ph]++
	}
	return out
}

func (d *chromeDoc) find(ph, name string) []chromeEvent {
	var out []chromeEvent
	for _, e := range d.TraceEvents {
		if e.Ph == ph && e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// metaName is the process_name or thread_name given to pid (and tid).
func (d *chromeDoc) metaName(kind string, pid int64, tid uint64) string {
	for _, e := range d.TraceEvents {
		if e.Ph == "M" && e.Name == kind && e.PID == pid && (kind == "process_name" || e.TID == tid) {
			return e.Args["name"].(string)
		}
	}
	return ""
}

func exportBytes(t *testing.T, data []byte, opts ChromeOptions) (*chromeDoc, *ExportResult) {
	t.Helper()
	var out bytes.Buffer
	w := NewChromeWriter(&out)
	res, err := ExportChrome(bytes.NewReader(data), w, opts)
	require.NoError(t, err)
	require.NoError(t, w.Close(map[string]string{"source": "test"}))
	var doc chromeDoc
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), out.String())
	assert.Equal(t, w.Events(), len(doc.TraceEvents))
	assert.Equal(t, w.Phases(), doc.phases())
	return &doc, res
}

func TestExportChromeGolden(t *testing.T) {
	doc, res := exportBytes(t, testutil.Corpus(t, "valid-train.jsonl"), ChromeOptions{})
	assert.Equal(t, "ns", doc.DisplayTimeUnit)
	assert.Equal(t, "test", doc.OtherData["source"])
	// 5 spans + 4 ops + 4 device intervals; 6 live-bytes changes (the alias
	// at 1350 changes nothing) + 3 device-memory values; 4 call edges and
	// the one data edge whose tensors both have a producing op (t0 has
	// none); host and device process names and sort indexes, thread 100,
	// streams 7 and 8.
	assert.Equal(t, map[string]int{"X": 13, "C": 9, "s": 5, "f": 5, "M": 7}, doc.phases())
	assert.Equal(t, 1, res.DroppedFlows)
	assert.Equal(t, 0, res.OpenSpans)
	assert.False(t, res.Incomplete)
	assert.Equal(t, 5, res.Spans)
	assert.Equal(t, uint64(10000), res.LastNS)

	const host, device = int64(4242), int64(DefaultDevicePIDBase)
	assert.Equal(t, "demo::train (pid 4242 on box)", doc.metaName("process_name", host, 0))
	assert.Equal(t, "device cuda:0", doc.metaName("process_name", device, 0))
	assert.Equal(t, "thread 100", doc.metaName("thread_name", host, 100))
	assert.Equal(t, "stream 7 (cuda)", doc.metaName("thread_name", device, 1))
	assert.Equal(t, "stream 8 (cuda)", doc.metaName("thread_name", device, 2))

	fwd := doc.find("X", "train/forward")
	require.Len(t, fwd, 1)
	assert.Equal(t, 0.2, fwd[0].TS, "200 ns is 0.2 µs")
	assert.Equal(t, 3.0, fwd[0].Dur)
	assert.Equal(t, host, fwd[0].PID)
	assert.Equal(t, uint64(100), fwd[0].TID)
	assert.Equal(t, map[string]any{"id": "s3", "span_kind": "module", "step": "forward"}, fwd[0].Args)
	step := doc.find("X", "train/step")
	require.Len(t, step, 1)
	assert.Equal(t, true, step[0].Args["measured"])

	relu := doc.find("X", "relu")
	require.Len(t, relu, 1)
	assert.Equal(t, "op", relu[0].Cat)
	assert.Equal(t, 1.4, relu[0].TS)
	assert.Equal(t, 0.5, relu[0].Dur)
	assert.Equal(t, 512.0, relu[0].Args["output_dense_bytes"])

	bwd := doc.find("X", "sgemm_bwd")
	require.Len(t, bwd, 1)
	assert.Equal(t, device, bwd[0].PID)
	assert.Equal(t, uint64(2), bwd[0].TID, "stream 8 is the device's second thread")
	assert.Equal(t, 3.41, bwd[0].TS)
	assert.Equal(t, 1.99, bwd[0].Dur)

	var live []float64
	var liveTS []float64
	for _, e := range doc.find("C", "live logical bytes") {
		assert.Equal(t, device, e.PID)
		live = append(live, e.Args["bytes"].(float64))
		liveTS = append(liveTS, e.TS)
	}
	assert.Equal(t, []float64{512, 1024, 512, 1536, 1024, 0}, live)
	assert.Equal(t, []float64{1.3, 1.9, 3.4, 5.4, 7.4, 9}, liveTS)
	var used []float64
	for _, e := range doc.find("C", "device used bytes") {
		used = append(used, e.Args["bytes"].(float64))
	}
	assert.Equal(t, []float64{1048576, 2097152}, used)
	reserved := doc.find("C", "device reserved bytes")
	require.Len(t, reserved, 1)
	assert.Equal(t, 2.0, reserved[0].TS)
	assert.Equal(t, 2097152.0, reserved[0].Args["bytes"])

	// Flows pair by id: the call edge s2 -> s4 starts on the caller at its
	// start and ends on the callee, bound to its enclosing slice.
	ends := map[uint64][]chromeEvent{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "s" || e.Ph == "f" {
			ends[e.ID] = append(ends[e.ID], e)
		}
	}
	require.Len(t, ends, 5)
	var found bool
	for _, pair := range ends {
		require.Len(t, pair, 2)
		assert.Equal(t, "s", pair[0].Ph)
		assert.Equal(t, "f", pair[1].Ph)
		assert.Equal(t, "e", pair[1].BP)
		if pair[0].Cat == "call_edge" && pair[1].TS == 3.3 {
			found = true
			assert.Equal(t, 0.1, pair[0].TS)
		}
		if pair[0].Cat == "data_edge" {
			assert.Equal(t, 0.3, pair[0].TS, "from matmul, which wrote t2")
			assert.Equal(t, 1.4, pair[1].TS, "to relu, which wrote t3")
		}
	}
	assert.True(t, found, "the call edge s2 -> s4")
}

func TestExportPartialTrace(t *testing.T) {
	doc, res := exportBytes(t, testutil.Corpus(t, "partial-no-terminal.jsonl"), ChromeOptions{})
	assert.True(t, res.Incomplete)
	assert.Equal(t, 3, res.OpenSpans)
	assert.Equal(t, uint64(9000), res.LastNS, "the end of the adam op")
	for name, want := range map[string]struct{ ts, dur float64 }{
		"demo::train": {0, 9}, "train/step": {0.1, 8.9}, "train/optimizer": {7.4, 1.6},
	} {
		ev := doc.find("X", name)
		require.Len(t, ev, 1, name)
		assert.Equal(t, want.ts, ev[0].TS, name)
		assert.Equal(t, want.dur, ev[0].Dur, name)
		assert.Equal(t, true, ev[0].Args["open"], name)
	}
	closed := doc.find("X", "train/forward")
	require.Len(t, closed, 1)
	assert.Nil(t, closed[0].Args["open"])

	cut, res := exportBytes(t, testutil.Corpus(t, "partial-cut-line.jsonl"), ChromeOptions{})
	assert.Equal(t, 34, res.CutLine)
	assert.NotEmpty(t, cut.find("X", "train/forward"))
}

func TestExportEdgeCases(t *testing.T) {
	meta := `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"c","entrypoint":"e","phase":"infer","timestamp":"t","capture_step":1,"warmup_steps":0,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"unknown","operations":"none","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":{}}`
	tests := []struct {
		name   string
		trace  string
		errMsg string
		check  func(t *testing.T, doc *chromeDoc, res *ExportResult)
	}{
		{"empty file", "", "no meta record", nil},
		{"binary junk", "\xff\xfe\x00\n", "line 1: invalid_utf8", nil},
		{"not JSON", "\x00\x01\n", "line 1: invalid_json", nil},
		{"meta not first", `{"kind":"span_end","id":"s1"}` + "\n", "line 1: the first record is span_end", nil},
		{"span without tid, ts with ns precision, escapes", meta + "\n" +
			`{"kind":"span_start","id":"s1","name":"a \"b\"\n\u0001","start_ns":1234567891,"span_kind":"function"}` + "\n" +
			`{"kind":"span_end","id":"s1","duration_ns":1001}` + "\n", "",
			func(t *testing.T, doc *chromeDoc, res *ExportResult) {
				ev := doc.find("X", "a \"b\"\n\x01")
				require.Len(t, ev, 1)
				assert.Equal(t, 1234567.891, ev[0].TS)
				assert.Equal(t, 1.001, ev[0].Dur)
				assert.Equal(t, uint64(UntrackedTID), ev[0].TID)
				assert.Equal(t, int64(1), ev[0].PID, "no meta.process.pid")
				assert.Equal(t, "spans without tid", doc.metaName("thread_name", 1, UntrackedTID))
				assert.True(t, res.Incomplete)
			}},
		{"kernels carry their correlation id when it is a number", meta + "\n" +
			`{"kind":"span_start","id":"s1","name":"a","start_ns":5,"span_kind":"function"}` + "\n" +
			`{"kind":"device_interval","span_id":"s1","device":"cuda:0","stream_id":"7","clock_id":"host-monotonic","backend":"cuda","start_ns":6,"duration_ns":2,"name":"k1","correlation_id":41}` + "\n" +
			`{"kind":"device_interval","span_id":"s1","device":"cuda:0","stream_id":"7","clock_id":"host-monotonic","backend":"cuda","start_ns":8,"duration_ns":2,"name":"k2","correlation_id":"x"}` + "\n" +
			`{"kind":"span_end","id":"s1","duration_ns":10}` + "\n", "",
			func(t *testing.T, doc *chromeDoc, res *ExportResult) {
				k1, k2 := doc.find("X", "k1"), doc.find("X", "k2")
				require.Len(t, k1, 1)
				require.Len(t, k2, 1)
				assert.Equal(t, 41.0, k1[0].Args["correlation_id"])
				assert.Equal(t, "s1", k1[0].Args["span_id"])
				assert.NotContains(t, k2[0].Args, "correlation_id", "not ours to judge: left out")
			}},
		{"stops at a broken line, keeps what came before", meta + "\n" +
			`{"kind":"span_start","id":"s1","name":"a","start_ns":5,"span_kind":"function"}` + "\n" +
			`{"kind":"op","span_id":"s1"}` + "\n" +
			`{"kind":"span_end","id":"s1","duration_ns":10}` + "\n", "",
			func(t *testing.T, doc *chromeDoc, res *ExportResult) {
				require.NotNil(t, res.Stop)
				assert.Equal(t, 3, res.Stop.Line)
				assert.Equal(t, trace.CodeMissingField, res.Stop.Code)
				ev := doc.find("X", "a")
				require.Len(t, ev, 1)
				assert.Equal(t, true, ev[0].Args["open"])
				assert.Equal(t, 0.0, ev[0].Dur, "nothing after the start was read")
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.errMsg != "" {
				var out bytes.Buffer
				_, err := ExportChrome(strings.NewReader(tc.trace), NewChromeWriter(&out), ChromeOptions{})
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errMsg)
				return
			}
			doc, res := exportBytes(t, []byte(tc.trace), ChromeOptions{})
			tc.check(t, doc, res)
		})
	}
}

func TestAppendMicros(t *testing.T) {
	for ns, want := range map[uint64]string{
		0: "0", 1: "0.001", 10: "0.01", 999: "0.999", 1000: "1", 1500: "1.5",
		18446744073709551615: "18446744073709551.615",
	} {
		assert.Equal(t, want, string(appendMicros(nil, ns)), "%d ns", ns)
	}
}

// withMeta rewrites a corpus trace's meta: its clock and process fields.
func withMeta(t *testing.T, name, extra string) []byte {
	t.Helper()
	data := testutil.Corpus(t, name)
	first := bytes.IndexByte(data, '\n')
	meta := bytes.TrimSuffix(data[:first], []byte("}"))
	return append(append(append([]byte{}, meta...), ","+extra+"}"...), data[first:]...)
}

func TestMergeAlignsRanksByWallClock(t *testing.T) {
	dir := t.TempDir()
	// Rank 1 opened 2.5 µs after rank 0, but comes first on the command line.
	r1 := withMeta(t, "valid-infer.jsonl", `"clock":{"host":"monotonic","wall_unix_ns_at_open":1700000000000002500},"process":{"pid":77,"hostname":"b","rank":1,"world_size":2}`)
	r0 := withMeta(t, "valid-infer.jsonl", `"clock":{"host":"monotonic","wall_unix_ns_at_open":1700000000000000000},"process":{"pid":77,"hostname":"a","rank":0,"world_size":2}`)
	p1, p0 := filepath.Join(dir, "rank1.jsonl"), filepath.Join(dir, "rank0.jsonl")
	require.NoError(t, os.WriteFile(p1, r1, 0o644))
	require.NoError(t, os.WriteFile(p0, r0, 0o644))

	var out bytes.Buffer
	w := NewChromeWriter(&out)
	res, err := Merge([]string{p1, p0}, w)
	require.NoError(t, err)
	require.NoError(t, w.Close(nil))
	var doc chromeDoc
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc))

	require.Len(t, res.Inputs, 2)
	assert.Equal(t, int64(0), res.Inputs[0].Rank)
	assert.Equal(t, p0, res.Inputs[0].Path)
	assert.Equal(t, uint64(0), res.Inputs[0].OffsetNS)
	assert.Equal(t, uint64(2500), res.Inputs[1].OffsetNS)
	assert.Equal(t, "meta.process.rank", res.Inputs[1].RankFrom)
	assert.Empty(t, res.Warnings)

	// Same pid on both hosts: merge gives each rank its own process.
	assert.Equal(t, "rank 0: demo::infer (pid 77 on a)", doc.metaName("process_name", 1, 0))
	assert.Equal(t, "rank 1: demo::infer (pid 77 on b)", doc.metaName("process_name", 2, 0))
	assert.Equal(t, "rank 1: device cpu", doc.metaName("process_name", DefaultDevicePIDBase+1<<8, 0))
	fwd := doc.find("X", "demo/forward")
	require.Len(t, fwd, 2)
	byPID := map[int64]float64{}
	for _, e := range fwd {
		byPID[e.PID] = e.TS
	}
	assert.Equal(t, map[int64]float64{1: 0.2, 2: 2.7}, byPID, "200 ns after open, rank 1 shifted by 2.5 µs")
	flowIDs := map[uint64]int{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "s" {
			flowIDs[e.ID]++
		}
	}
	for id, n := range flowIDs {
		assert.Equal(t, 1, n, "flow id %d is used by both ranks", id)
	}
}

func TestMergeRanksAndClocks(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	plain := write("plain.jsonl", testutil.Corpus(t, "valid-infer.jsonl"))
	clocked := write("clocked.jsonl", withMeta(t, "valid-infer.jsonl", `"clock":{"wall_unix_ns_at_open":5}`))
	rank0 := write("rank0.jsonl", withMeta(t, "valid-infer.jsonl", `"process":{"rank":0}`))

	inputs, warnings, err := PlanMerge([]string{clocked, plain})
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 1}, []int64{inputs[0].Rank, inputs[1].Rank}, "file order without meta.process.rank")
	assert.Equal(t, "file order", inputs[0].RankFrom)
	require.Len(t, warnings, 1)
	assert.Contains(t, warnings[0], "plain.jsonl has no meta.clock.wall_unix_ns_at_open")

	// plain is rank 0 by its place; rank0 says so in its meta.
	_, _, err = PlanMerge([]string{plain, rank0})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "both are rank")
}
