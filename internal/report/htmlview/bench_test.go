package htmlview

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// BenchmarkPageInChromium is the JavaScript's time budget (issue 16): the
// page of a generated trace of more than a million events (regionTrace:
// 5,000 layer spans of 50 ops, each op with a device interval and an
// alloc/free pair; the measured region is the middle fifth), loaded in
// headless Chromium. It reports the page's own figures: data-render-ms (from
// the script's start, the JSON parse included, to its end) and each view's
// data-ms-*, and the browser's wall time. A benchmark, not a test: `make
// bench-view` (or bench-core) runs it; `make test` does not.
func BenchmarkPageInChromium(b *testing.B) {
	chromium := testutil.Chromium(b)
	dir := b.TempDir()
	tracePath := filepath.Join(dir, "bench.jsonl")
	f, err := os.Create(tracePath)
	require.NoError(b, err)
	w := bufio.NewWriterSize(f, 1<<20)
	regionTrace(w, 2000, 1000, 2000, 50)
	require.NoError(b, w.Flush())
	require.NoError(b, f.Close())
	p, err := BuildFile(tracePath, Options{})
	require.NoError(b, err)
	events := p.Health.Lines
	require.GreaterOrEqual(b, events, 1_000_000)
	page := filepath.Join(dir, "bench.html")
	out, err := os.Create(page)
	require.NoError(b, err)
	require.NoError(b, p.WriteHTML(out))
	require.NoError(b, out.Close())
	st, err := os.Stat(page)
	require.NoError(b, err)
	b.Logf("trace: %d lines; page: %.1f MiB, %d spans, %d ops, %d device intervals (left out: %d ops, %d intervals; outside the measured region %d and %d)",
		events, float64(st.Size())/(1<<20), len(p.Timeline.Spans), len(p.Timeline.Ops), len(p.Timeline.Intervals),
		p.Timeline.Dropped.Ops, p.Timeline.Dropped.Intervals, p.Timeline.Dropped.OpsOutside, p.Timeline.Dropped.IntervalsOutside)

	attrs := regexp.MustCompile(`<html[^>]*>`)
	ms := regexp.MustCompile(`\s(data-render-ms|data-ms-[a-z-]+)="(\d+)"`)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		dom, err := runQuiet(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=60000",
			"--window-size=1400,2600", "--dump-dom", "file://"+page)
		wall := time.Since(start)
		require.NoError(b, err)
		html := attrs.FindString(dom)
		require.Contains(b, html, `data-rendered="ok"`, "the script ran to its end")
		for _, m := range ms.FindAllStringSubmatch(html, -1) {
			v, _ := strconv.Atoi(m[2])
			b.ReportMetric(float64(v), m[1])
		}
		b.ReportMetric(float64(wall.Milliseconds()), "browser-wall-ms")
	}
}
