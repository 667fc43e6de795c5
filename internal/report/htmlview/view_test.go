package htmlview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

func build(t *testing.T, data []byte, lim Limits) *Page {
	t.Helper()
	p, err := Build(bytes.NewReader(data), "t.jsonl", Options{Limits: lim})
	require.NoError(t, err)
	return p
}

// TestPageAgreesWithTheReport: on every readable corpus trace the page
// carries every span and op the checker counted, and its memory curve peaks
// where and as high as the report's peak.
func TestPageAgreesWithTheReport(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testutil.CorpusDir(t), "*.jsonl"))
	require.NoError(t, err)
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		res, err := analysis.Analyze(bytes.NewReader(data), analysis.Options{Report: true})
		require.NoError(t, err)
		if res.Report == nil {
			continue // not readable far enough for a report: the page has none either
		}
		checked++
		t.Run(filepath.Base(f), func(t *testing.T) {
			p := build(t, data, Limits{})
			cv := res.Health.Coverage
			assert.Len(t, p.Timeline.Spans, cv.Spans)
			assert.Len(t, p.Timeline.Ops, cv.Operations)
			assert.Equal(t, cv.DeviceIntervals, len(p.Timeline.Intervals)+p.Timeline.Dropped.OtherClockIntervals)
			if pk := res.Report.Memory.Peak; pk != nil {
				assert.Equal(t, pk.LiveBytes, p.Memory.PeakBytes)
				assert.Equal(t, pk.TimestampNS, p.Memory.PeakAtNS)
				var sum uint64
				for _, s := range p.Memory.PeakStorages {
					sum += s.Bytes
				}
				assert.Equal(t, pk.LiveBytes, sum, "the storages listed at the peak add up to it")
			}
			for _, s := range p.Timeline.Spans {
				assert.LessOrEqual(t, s[0]+s[1], p.Timeline.End, "open spans end at the last timestamp")
			}
		})
	}
	assert.Greater(t, checked, 10)
}

// onlyReader hides io.Seeker: the page must then keep the memory records.
type onlyReader struct{ io.Reader }

// TestOutOfOrderMemory: records out of timestamp order void the curve drawn
// as they streamed; re-read (a file) or kept (a pipe), they replay sorted to
// the same curve as the sorted trace's.
func TestOutOfOrderMemory(t *testing.T) {
	sorted := build(t, testutil.Corpus(t, "valid-infer.jsonl"), Limits{})
	shuffled := testutil.Corpus(t, "valid-memory-out-of-order.jsonl")
	for name, r := range map[string]io.Reader{
		"seekable (re-read)":  bytes.NewReader(shuffled),
		"not seekable (kept)": onlyReader{bytes.NewReader(shuffled)},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := Build(r, "t.jsonl", Options{})
			require.NoError(t, err)
			require.NotEmpty(t, sorted.Memory.Points)
			assert.Equal(t, sorted.Memory.Points, p.Memory.Points)
			assert.Equal(t, sorted.Memory.PeakStorages, p.Memory.PeakStorages)
		})
	}
}

func TestTrainPageNumbers(t *testing.T) {
	p := build(t, testutil.Corpus(t, "valid-train.jsonl"), Limits{})
	tl := p.Timeline
	require.Len(t, tl.Threads, 1, "every span and op of the trace is on tid 100")
	assert.Equal(t, uint64(100), tl.Threads[0])
	depth := map[string]uint64{}
	for _, s := range tl.Spans {
		depth[tl.Names[s[4]]] = s[3]
	}
	assert.Equal(t, map[string]uint64{"demo::train": 0, "train/step": 1, "train/forward": 2, "train/backward": 2, "train/optimizer": 2}, depth)
	for _, o := range tl.Ops {
		assert.Equal(t, uint64(3), o[3], "ops sit one row under their phase span")
	}
	assert.Equal(t, []string{"cuda:0 stream 7", "cuda:0 stream 8"}, tl.Streams)
	// From the trace: storage-1 (512 B, t2 and its alias t2v) is freed at
	// 3400, storage-2 (512 B, relu) and storage-3 (1 KiB, matmul_backward)
	// are live at 5400.
	assert.Equal(t, []PeakStorage{
		{Bytes: 1024, Category: "gradient", Device: "cuda:0", Storage: "cuda-storage-3", MadeBy: "matmul_backward"},
		{Bytes: 512, Category: "activation", Device: "cuda:0", Storage: "cuda-storage-2", MadeBy: "relu"},
	}, p.Memory.PeakStorages)
	// The trace's memory records: 1300 alloc storage-1 512 B activation,
	// 1350 the same storage again (an alias: nothing added), 1900 alloc
	// storage-2 512 B activation, 3400 free storage-1, 5400 alloc storage-3
	// 1 KiB gradient, 7400 free storage-2, 9000 free storage-3. Per point:
	// timestamp, total, then other, parameter, activation, gradient, optimizer.
	assert.Equal(t, []string{"other", "parameter", "activation", "gradient", "optimizer"}, p.Memory.Categories)
	assert.Equal(t, [][]uint64{
		{1300, 512, 0, 0, 512, 0, 0}, {1350, 512, 0, 0, 512, 0, 0}, {1900, 1024, 0, 0, 1024, 0, 0}, {3400, 512, 0, 0, 512, 0, 0},
		{5400, 1536, 0, 0, 512, 1024, 0}, {7400, 1024, 0, 0, 0, 1024, 0}, {9000, 0, 0, 0, 0, 0, 0},
	}, p.Memory.Points)
	// The two device_memory samples of the trace, at 2000 and 6000 ns.
	assert.Equal(t, []DeviceUsed{{Device: "cuda:0", Samples: 2, Points: [][]uint64{{2000, 1 << 20}, {6000, 2 << 20}}}}, p.Memory.Devices)
}

func TestLimitsDropAndSayHowMany(t *testing.T) {
	data := testutil.Corpus(t, "valid-train.jsonl")
	full := build(t, data, Limits{})
	lim := DefaultLimits
	lim.Ops, lim.Spans, lim.MemoryPoints = 1, 2, 2
	p := build(t, data, lim)
	assert.Len(t, p.Timeline.Ops, 1)
	assert.Equal(t, len(full.Timeline.Ops)-1, p.Timeline.Dropped.Ops)
	assert.Len(t, p.Timeline.Spans, 2)
	assert.Equal(t, len(full.Timeline.Spans)-2, p.Timeline.Dropped.Spans)
	assert.LessOrEqual(t, len(p.Memory.Points), 2)
	var top uint64
	for _, pt := range p.Memory.Points {
		top = max(top, pt[1])
	}
	assert.Equal(t, full.Memory.PeakBytes, top, "decimation keeps the peak")
}

func TestLongNamesAreCut(t *testing.T) {
	long := strings.Repeat("é", MaxNameBytes) // two bytes a rune: the cut falls inside one
	data := bytes.Replace(testutil.Corpus(t, "valid-train.jsonl"), []byte(`"name":"train/forward"`), []byte(`"name":"`+long+`"`), 1)
	p := build(t, data, Limits{})
	want := strings.Repeat("é", MaxNameBytes/2) + "…"
	assert.Contains(t, p.Timeline.Names, want)
}

func writeHTML(t *testing.T, p *Page) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, p.WriteHTML(&b))
	return b.String()
}

// TestHTMLIsSelfContained: nothing is fetched (the one URL is SVG's
// namespace, a name, not a request), and the data embedded is the page.
func TestHTMLIsSelfContained(t *testing.T) {
	p := build(t, testutil.Corpus(t, "valid-train.jsonl"), Limits{})
	html := writeHTML(t, p)
	urls := regexp.MustCompile(`https?://[^\s"'<>)]+`).FindAllString(html, -1)
	for _, u := range urls {
		assert.Equal(t, "http://www.w3.org/2000/svg", u)
	}
	assert.NotRegexp(t, `<link|<img|<iframe|\ssrc=|@import|url\(`, html)
	m := regexp.MustCompile(`(?s)<script id="trace-data" type="application/json">(.*?)</script>`).FindStringSubmatch(html)
	require.NotNil(t, m)
	var back Page
	require.NoError(t, json.Unmarshal([]byte(m[1]), &back))
	assert.Equal(t, p.Timeline.Spans, back.Timeline.Spans)
	assert.Equal(t, p.Health.Codes(), back.Health.Codes())
}

// TestNamesCannotCloseTheScript: a span named like markup stays data.
func TestNamesCannotCloseTheScript(t *testing.T) {
	data := bytes.Replace(testutil.Corpus(t, "valid-train.jsonl"), []byte(`"name":"train/forward"`), []byte(`"name":"</script><script>alert(1)</script>"`), 1)
	p := build(t, data, Limits{})
	html := writeHTML(t, p)
	assert.Equal(t, strings.Count(pageHTML, "</script>"), strings.Count(html, "</script>"))
	assert.Contains(t, p.Timeline.Names, "</script><script>alert(1)</script>")
}

// openInChromium writes the page, loads it in headless Chromium, checks
// that its script ran to the end without an error, saves a screenshot as
// build/view-test/SHOT.png and returns the DOM after the scripts ran.
func openInChromium(t *testing.T, shot string, html []byte) string {
	t.Helper()
	return openInChromiumAt(t, shot, html, "")
}

// openInChromiumAt is openInChromium with a #fragment on the page's URL.
func openInChromiumAt(t *testing.T, shot string, html []byte, fragment string) string {
	t.Helper()
	chromium := testutil.Chromium(t)
	out := filepath.Join(testutil.ModuleRoot(t), "build", "view-test")
	require.NoError(t, os.MkdirAll(out, 0o755))
	page := filepath.Join(t.TempDir(), "view.html")
	require.NoError(t, os.WriteFile(page, html, 0o644))
	dom := chromiumDOM(t, chromium, page+fragment, filepath.Join(out, shot+".png"))
	assert.Empty(t, attrHTML(t, dom, "data-js-error"), "a script error was written into the page")
	assert.False(t, strings.Contains(dom, `<pre id="js-error"`), "a script error was written into the page")
	require.Equal(t, "ok", attrHTML(t, dom, "data-rendered"), "the script ran to its end")
	return dom
}

// chromiumDOM loads the page in headless Chromium and returns the DOM after
// its scripts ran; it also saves a screenshot under build/view-test/.
func chromiumDOM(t *testing.T, chromium, page, shot string) string {
	t.Helper()
	url := "file://" + page
	common := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000", "--window-size=1400,2600"}
	dom, err := runQuiet(chromium, append(common, "--dump-dom", url)...)
	require.NoError(t, err, "chromium --dump-dom")
	_, err = runQuiet(chromium, append(common, "--screenshot="+shot, url)...)
	require.NoError(t, err, "chromium --screenshot")
	st, err := os.Stat(shot)
	require.NoError(t, err, "the screenshot was not written")
	assert.Greater(t, st.Size(), int64(10<<10), "a screenshot of a drawn page is more than a blank PNG")
	return dom
}

func attr(t *testing.T, dom, id, name string) string {
	t.Helper()
	m := regexp.MustCompile(`<[a-z]+ [^>]*id="` + regexp.QuoteMeta(id) + `"[^>]*>`).FindString(dom)
	require.NotEmpty(t, m, "element #%s is not in the DOM", id)
	v := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(m)
	require.NotNil(t, v, "#%s has no %s", id, name)
	return v[1]
}

// TestAggregatePageInChromium opens a whole-run summary's page.
func TestAggregatePageInChromium(t *testing.T) {
	s, err := aggregate.ReadFile(filepath.Join(testutil.CorpusDir(t), "aggregate-a.json"))
	require.NoError(t, err)
	p := Aggregate("aggregate-a.json", s)
	var buf bytes.Buffer
	require.NoError(t, p.WriteHTML(&buf))
	dom := openInChromium(t, "aggregate", buf.Bytes())

	r := p.Aggregate
	assert.Equal(t, r.Analysis.Verdict, attr(t, dom, "aggregate-analysis", "data-verdict"))
	assert.Equal(t, len(r.Spans), atoi(t, attr(t, dom, "aggregate-spans", "data-rows")))
	assert.Equal(t, min(len(r.Spans), 30), strings.Count(dom, `<g class="dist"`))
	for _, row := range r.Spans {
		assert.Regexp(t, `<g class="dist" data-name="`+regexp.QuoteMeta(row.Name)+`" data-p50="`+strconv.FormatUint(row.P50NS, 10)+`" data-p99="`+strconv.FormatUint(row.P99NS, 10)+`"`, dom)
	}
	nonFinite := 0
	for _, sc := range r.Scalars {
		if sc.NonFinite > 0 {
			nonFinite++
		}
	}
	require.Equal(t, 1, nonFinite, "the fixture's grad_norm saw one non-finite value")
	scalars := regexp.MustCompile(`(?s)<table id="aggregate-scalars".*?</table>`).FindString(dom)
	assert.Equal(t, nonFinite, strings.Count(scalars, `<tr class="flag">`))
	assert.Equal(t, len(r.Analysis.Categories), strings.Count(dom, `class="category"`))
	assert.NotContains(t, dom, `<table id="aggregate-triggers" class="stats" data-rows=`, "no watch, no triggers section")
}

// TestAggregateTriggersInChromium: the summary of a real watch run
// (testdata/aggregate-triggers.py) lists the triggers that fired, the NaN
// loss of non_finite highlighted.
func TestAggregateTriggersInChromium(t *testing.T) {
	s, err := aggregate.ReadFile(filepath.Join(testutil.CorpusDir(t), "aggregate-triggers.json"))
	require.NoError(t, err)
	p := Aggregate("aggregate-triggers.json", s)
	require.Len(t, p.Aggregate.Triggers, 3)
	var buf bytes.Buffer
	require.NoError(t, p.WriteHTML(&buf))
	dom := openInChromium(t, "aggregate-triggers", buf.Bytes())
	require.Contains(t, dom, `<table id="aggregate-triggers" class="stats" data-rows="3"`)
	assert.Equal(t, "4", attr(t, dom, "aggregate-triggers", "data-fired"), "slow once, user twice, non_finite once")
	tab := regexp.MustCompile(`(?s)<table id="aggregate-triggers".*?</table>`).FindString(dom)
	for _, name := range []string{"non_finite", "slow", "user"} {
		assert.Contains(t, tab, `<td class="text">`+name+`</td>`)
	}
	assert.Equal(t, 1, strings.Count(tab, `<tr class="flag">`), "the non-finite value is highlighted")
	assert.Contains(t, dom, `href="#aggregate-triggers-title"`, "the navigation leads to it")
	// each firing by itself: its update, value against threshold, and trace (or why none)
	require.Len(t, p.Aggregate.Fired, 4)
	require.Contains(t, dom, `<table id="aggregate-firings" class="stats" data-rows="4"`)
	firings := regexp.MustCompile(`(?s)<table id="aggregate-firings".*?</table>`).FindString(dom)
	assert.Contains(t, firings, `traces/update-000012-slow.jsonl`)
	assert.Contains(t, firings, html.EscapeString(p.Aggregate.Fired[0].Shown))
	assert.Equal(t, 2, strings.Count(firings, "none: the run's cap of 4 traces was reached"), "24 and 27 fired past the cap")
	assert.Equal(t, 2, strings.Count(firings, `<tr class="flag">`), "the firings without a trace are highlighted")
}

// TestComparisonPageInChromium opens B against A: the comparison's tables
// mark what compare marks, and both traces' views are drawn below it.
func TestComparisonPageInChromium(t *testing.T) {
	a := build(t, testutil.Corpus(t, "valid-train.jsonl"), Limits{})
	// B: the same run with a slower relu, so one op and its phase change.
	b := build(t, bytes.Replace(testutil.Corpus(t, "valid-train.jsonl"), []byte(`"duration_ns":500`), []byte(`"duration_ns":900`), 1), Limits{})
	c := Compare(a, b, 0.05)
	var buf bytes.Buffer
	require.NoError(t, c.WriteHTML(&buf))
	dom := openInChromium(t, "compare", buf.Bytes())

	assert.Equal(t, "true", attr(t, dom, "compare-identity", "data-comparable"))
	significant := 0
	for _, o := range c.Comparison.Ops {
		if o.Significant {
			significant++
		}
	}
	require.Equal(t, 1, significant, "relu's change is the one significant op")
	ops := regexp.MustCompile(`(?s)<table id="compare-ops".*?</table>`).FindString(dom)
	assert.Equal(t, significant, strings.Count(ops, `<tr class="flag">`))
	assert.Contains(t, ops, "relu")
	assert.Equal(t, len(c.Comparison.Ops), atoi(t, attr(t, dom, "compare-ops", "data-rows")))
	for side, p := range map[string]*Page{"a-": a, "b-": b} {
		assert.Equal(t, len(p.Timeline.Spans), atoi(t, attr(t, dom, side+"timeline-svg", "data-spans")))
		assert.Equal(t, p.Memory.PeakBytes, uint64(atoi(t, attr(t, dom, side+"memory-peak", "data-bytes"))))
	}
}

// TestGraphInChromium: the execution graph holds every span, op and
// tensor, a search finds a node, and selecting it marks the same op on the
// timeline.
func TestGraphInChromium(t *testing.T) {
	p := build(t, testutil.Corpus(t, "valid-train.jsonl"), Limits{})
	g := p.Graph
	produced := map[int]bool{}
	for _, o := range g.OpOut {
		if o >= 0 {
			produced[o] = true
		}
	}
	flows := len(g.Data)
	for _, in := range g.OpIn {
		flows += len(in)
	}
	dom := openInChromiumAt(t, "graph", []byte(writeHTML(t, p)), "#find=matmul_back")
	assert.Equal(t, len(p.Timeline.Spans)+len(p.Timeline.Ops)+len(g.Tensors)-len(produced), atoi(t, attr(t, dom, "graph-svg", "data-nodes")))
	assert.Equal(t, flows, atoi(t, attr(t, dom, "graph-svg", "data-flows")), "every op input and data edge is drawn")
	assert.Equal(t, "1", attr(t, dom, "graph-svg", "data-matches"))
	op := -1
	for i, o := range p.Timeline.Ops {
		if p.Timeline.Names[o[4]] == "matmul_backward" {
			op = i
		}
	}
	require.GreaterOrEqual(t, op, 0)
	assert.Equal(t, "op:"+strconv.Itoa(op), attr(t, dom, "graph-svg", "data-selected"))
	assert.Regexp(t, `<rect class="op selected"[^>]*data-i="`+strconv.Itoa(op)+`" data-t="op"`, dom, "the timeline marks the op the graph selected")
}

// TestPageInChromium opens the pages of a complete training trace and of a
// failed (out-of-memory) capture in a real headless browser: no script
// error, every view drawn, and the DOM shows the trace's own numbers.
func TestPageInChromium(t *testing.T) {
	for _, name := range []string{"valid-train.jsonl", "failed-capture_failed.jsonl"} {
		t.Run(name, func(t *testing.T) {
			p := build(t, testutil.Corpus(t, name), Limits{})
			dom := openInChromium(t, strings.TrimSuffix(name, ".jsonl"), []byte(writeHTML(t, p)))
			for _, id := range []string{"verdict", "identity", "overhead", "issues", "top-spans", "top-ops", "top-kernels",
				"timeline-svg", "tracer-time", "memory-svg", "memory-curve", "memory-peak", "peak-storages",
				"gradients-table", "tensor-stats-table"} {
				assert.True(t, strings.Contains(dom, `id="`+id+`"`), "#%s is not in the DOM", id)
			}
			ok := p.Health.StructurallyValid && p.Health.CaptureComplete
			assert.Equal(t, map[bool]string{true: "true", false: "false"}[ok], attr(t, dom, "verdict", "data-ok"))
			// The codes shown are the checker's, which are candle-graph's.
			var shown []string
			for _, m := range regexp.MustCompile(`<li data-code="([a-z_]+)"`).FindAllStringSubmatch(dom, -1) {
				shown = append(shown, m[1])
			}
			assert.ElementsMatch(t, p.Health.Codes(), distinct(shown))
			assert.Equal(t, len(p.Timeline.Spans), atoi(t, attr(t, dom, "timeline-svg", "data-spans")))
			assert.Equal(t, len(p.Timeline.Ops), atoi(t, attr(t, dom, "timeline-svg", "data-ops")))
			assert.Equal(t, len(p.Timeline.Intervals), atoi(t, attr(t, dom, "timeline-svg", "data-kernels")))
			assert.Equal(t, p.Memory.PeakBytes, uint64(atoi(t, attr(t, dom, "memory-peak", "data-bytes"))))
			assert.Equal(t, len(p.Memory.PeakStorages), atoi(t, attr(t, dom, "peak-storages", "data-rows")))
			flagged := regexp.MustCompile(`(?s)<table id="gradients-table".*?</table>`).FindString(dom)
			assert.Equal(t, len(p.Report.Gradients.Flagged), strings.Count(flagged, `<tr class="flag">`), "non-present gradients are highlighted")
			assert.Equal(t, p.Report.Overhead.Verdict, attr(t, dom, "overhead", "data-verdict"))
			bands := 0
			for k := range p.Memory.Categories {
				for _, pt := range p.Memory.Points {
					if pt[2+k] > 0 {
						bands++
						break
					}
				}
			}
			assert.Equal(t, bands, strings.Count(dom, `class="category-band"`), "one band per category that held bytes")
			for _, d := range p.Memory.Devices {
				assert.Regexp(t, `<path class="device-used"[^>]*data-device="`+regexp.QuoteMeta(d.Device)+`" data-samples="`+strconv.Itoa(d.Samples)+`"`, dom)
			}
			assert.Equal(t, len(p.Timeline.Intervals), strings.Count(dom, `<line class="launch"`), "every drawn kernel has a line to its span")
		})
	}
}

// attrHTML reads an attribute of the <html> element.
func attrHTML(t *testing.T, dom, name string) string {
	t.Helper()
	m := regexp.MustCompile(`<html[^>]*\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return m[1]
}

func distinct(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// runQuiet runs the browser; its stderr (D-Bus complaints of a headless
// machine) is only shown when it fails.
func runQuiet(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w\n%s", name, err, errb.String())
	}
	return out.String(), nil
}

// TestLimitsKeepTheMeasuredRegion: past a limit, the rows outside the
// measured region give way (thinned evenly over before and after it), the
// region keeps every span, op and interval, and Dropped says which were
// which.
func TestLimitsKeepTheMeasuredRegion(t *testing.T) {
	const before, inside, after, perLayer = 100, 20, 100, 10 // layers; ops per layer
	var buf bytes.Buffer
	regionTrace(&buf, before, inside, after, perLayer)
	full := build(t, buf.Bytes(), Limits{})
	require.True(t, full.Health.StructurallyValid && full.Health.CaptureComplete, "the generated trace is valid: %v", full.Health.Codes())
	allSpans, allOps := 2+before+inside+after, (before+inside+after)*perLayer
	require.Len(t, full.Timeline.Spans, allSpans)
	require.Len(t, full.Timeline.Ops, allOps)
	require.Equal(t, Dropped{MeasuredRegion: true}, full.Timeline.Dropped)

	count := func(p *Page, rows func() [][]uint64) map[string]int {
		n := map[string]int{}
		for _, r := range rows() {
			n[p.Timeline.Names[r[0]]]++
		}
		return n
	}
	for _, tc := range []struct {
		name                string
		lim                 Limits
		insideOps, insideIv int // of the region's, kept when there is room
	}{
		{"room for the region", Limits{Spans: 60, Ops: 600, Intervals: 500, GraphOps: 100}, inside * perLayer, inside * perLayer},
		{"the region over the limit", Limits{Spans: 60, Ops: 150, Intervals: 120, GraphOps: 100}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := DefaultLimits
			lim.Spans, lim.Ops, lim.Intervals, lim.GraphOps = tc.lim.Spans, tc.lim.Ops, tc.lim.Intervals, tc.lim.GraphOps
			p := build(t, buf.Bytes(), lim)
			tl := p.Timeline
			ops := count(p, func() [][]uint64 {
				var r [][]uint64
				for _, o := range tl.Ops {
					r = append(r, []uint64{o[4]})
				}
				return r
			})
			ivs := count(p, func() [][]uint64 {
				var r [][]uint64
				for _, o := range tl.Intervals {
					r = append(r, []uint64{o[3]})
				}
				return r
			})
			spans := count(p, func() [][]uint64 {
				var r [][]uint64
				for _, s := range tl.Spans {
					r = append(r, []uint64{s[4]})
				}
				return r
			})
			assert.LessOrEqual(t, len(tl.Ops), lim.Ops)
			assert.LessOrEqual(t, len(tl.Intervals), lim.Intervals)
			assert.LessOrEqual(t, len(tl.Spans), lim.Spans)
			if tc.insideOps == inside*perLayer {
				assert.Equal(t, tc.insideOps, ops["measured_op"], "the region's ops")
				assert.Equal(t, tc.insideIv, ivs["measured_kernel"], "the region's intervals")
			} else {
				// The region alone is over the limit: it takes all the room
				// but one outside row (the thinning pairs them).
				assert.Len(t, tl.Ops, lim.Ops)
				assert.LessOrEqual(t, ops["warmup_op"]+ops["after_op"], 1)
				assert.Len(t, tl.Intervals, lim.Intervals)
				assert.LessOrEqual(t, ivs["warmup_kernel"]+ivs["after_kernel"], 1)
			}
			assert.Equal(t, inside, spans["measured_layer"], "the region's spans")
			assert.Equal(t, 1, spans["region/step"], "the measured span")
			// What was left out adds up, and says how much was outside.
			assert.True(t, tl.Dropped.MeasuredRegion)
			assert.Equal(t, allOps-len(tl.Ops), tl.Dropped.Ops)
			assert.Equal(t, inside*perLayer-ops["measured_op"], tl.Dropped.Ops-tl.Dropped.OpsOutside, "of the region's ops, only those past the limit")
			assert.Equal(t, allOps-inside*perLayer-ops["warmup_op"]-ops["after_op"], tl.Dropped.OpsOutside)
			assert.Equal(t, allSpans-len(tl.Spans), tl.Dropped.Spans)
			assert.Equal(t, tl.Dropped.Spans, tl.Dropped.SpansOutside, "no span of the region left out")
			assert.Equal(t, (before+inside+after)*perLayer-len(tl.Intervals), tl.Dropped.Intervals)
			if tc.insideOps == inside*perLayer {
				// Thinned evenly: both sides of the region keep some.
				assert.Positive(t, ops["warmup_op"])
				assert.Positive(t, ops["after_op"])
				assert.Positive(t, spans["warmup_layer"])
				assert.Positive(t, spans["after_layer"])
			}
			// Indices still point at the right rows after the thinning.
			for i, s := range tl.Spans {
				par := p.Graph.SpanParent[i]
				if tl.Names[s[4]] == "measured_layer" {
					require.GreaterOrEqual(t, par, 0)
					assert.Equal(t, "region/step", tl.Names[tl.Spans[par][4]])
				}
			}
			for _, iv := range tl.Intervals {
				if iv[4] != 1<<53-1 {
					want := strings.TrimSuffix(tl.Names[iv[3]], "_kernel") + "_layer"
					assert.Equal(t, want, tl.Names[tl.Spans[iv[4]][4]], "an interval's launching span")
				}
			}
			assert.NotEmpty(t, p.Graph.Omitted, "thinned ops leave no graph to draw")
			dom := openInChromium(t, "region-"+strings.ReplaceAll(tc.name, " ", "-"), []byte(writeHTML(t, p)))
			assert.Equal(t, tl.Dropped.OpsOutside, atoi(t, attr(t, dom, "timeline-dropped", "data-ops-outside")))
			assert.Equal(t, tl.Dropped.Ops, atoi(t, attr(t, dom, "timeline-dropped", "data-ops")))
			assert.Contains(t, dom, "outside the measured region, thinned evenly")
		})
	}
}
