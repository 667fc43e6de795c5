package events

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func FuzzParseRun(f *testing.F) {
	for _, s := range []string{
		`{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu"}`,
		`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":500,"binding":"python"}`,
		`{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","otlp_endpoint":"http://127.0.0.1:4318"}`,
		`{"entrypoint":"e","phase":"infer","capture_step":9,"device":"cpu","tags":{"a":"\u0000\"x"},"candle_version":null}`,
		fullRunJSON,
		e2eRunJSON,
		`{"entrypoint":"e","phase":"train","capture_step":2.0,"device":"cpu"}`,
		`{"entrypoint":"e","entrypoint":"f"}`,
		`[]`, `null`, `{`, "{\"entrypoint\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRun(data)
		if err != nil {
			require.Nil(t, r)
			require.True(t, strings.HasPrefix(err.Error(), "run JSON: "), err.Error())
			return
		}
		require.NotNil(t, r.Tags)
		line := r.AppendMeta(nil, MetaExtras{RunID: "r", Timestamp: "t", Rank: -1, WorldSize: -1})
		require.True(t, json.Valid(line), "meta is not JSON: %s", line)
		require.True(t, strings.HasSuffix(string(line), "}\n"))
		require.Equal(t, 1, strings.Count(string(line), "\n"))
		// What was accepted must survive the trip through the wire and back unchanged.
		back, err := ParseRun(runJSONFromMeta(t, line, r.MeasuredRoot))
		require.NoError(t, err, "meta does not re-parse: %s", line)
		// Session settings that are not meta fields do not round-trip.
		back.Binding, back.Mode, back.AggregateIntervalMs, back.OTLPEndpoint = r.Binding, r.Mode, r.AggregateIntervalMs, r.OTLPEndpoint
		// Nor whether warmup_steps and correlation_id were given or defaulted: meta states both.
		back.warmupGiven, back.correlationGiven = r.warmupGiven, r.correlationGiven
		require.Equal(t, r, back)
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `"\`, "a\nb\x00\x1f\x7f", "héllo 世界 🚀", "\u2028\u2029", "\xff\xfe", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := appendString([]byte("x"), s)
		require.Equal(t, byte('x'), out[0], "appends, never overwrites")
		out = out[1:]
		require.True(t, json.Valid(out), "not valid JSON: %q -> %q", s, out)
		require.True(t, utf8.Valid(out), "output must be valid UTF-8")
		var got string
		require.NoError(t, json.Unmarshal(out, &got))
		if utf8.ValidString(s) {
			require.Equal(t, s, got)
		}
	})
}

func FuzzSpanLinesFromPieces(f *testing.F) {
	f.Add(uint64(2), uint64(1), "layer/forward", uint64(15485207), uint64(430), uint32(0), false, uint32(0), int64(21557))
	f.Add(uint64(1), uint64(0), "\xff\"", uint64(0), uint64(1)<<63, uint32(2), true, uint32(3), int64(-1))
	f.Fuzz(func(t *testing.T, id, parent uint64, name string, start, dur uint64, kind uint32, measured bool, step uint32, tid int64) {
		ref := RefOf(id)
		var p *SpanRef
		if parent != 0 {
			r := RefOf(parent)
			p = &r
		}
		var tail StartTail
		want := AppendSpanStart(nil, id, parent, name, start, SpanKind(kind), measured, Step(step), tid)
		got := AppendSpanStartRef(nil, &ref, p, AppendName(nil, []byte(name)), start, tail.For(SpanKind(kind), measured, Step(step), tid))
		require.Equal(t, string(want), string(got))
		require.Equal(t, string(AppendSpanEnd(nil, id, dur)), string(AppendSpanEndRef(nil, &ref, dur)))
	})
}
