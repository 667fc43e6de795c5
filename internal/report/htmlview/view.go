package htmlview

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/compare"
	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"
	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// The page: hand-written, no libraries, nothing fetched.
var (
	//go:embed assets/view.html
	pageHTML string
	//go:embed assets/view.css
	pageCSS string
	//go:embed assets/view.js
	pageJS string
)

// Page is everything the HTML view shows, embedded in the file as one JSON
// document. Durations and timestamps are nanoseconds on the session clock.
type Page struct {
	Name     string           `json:"name"`
	Health   health.Health    `json:"health"`
	Meta     *trace.Meta      `json:"meta,omitempty"`
	Report   *analysis.Report `json:"report,omitempty"`
	Timeline *Timeline        `json:"timeline"`
	Memory   *MemoryView      `json:"memory"`
	Graph    *Graph           `json:"graph"`
	// Spellings the page needs to decode the timeline's numbers.
	SpanKinds []string `json:"span_kinds"`
}

// Timeline is the update drawn in time. Rows are arrays of numbers, by
// index into Names, Threads and Streams, to keep the file small:
//
//	Spans:     [start, duration, thread, depth, name, flags (1 measured, 2 open)]
//	Ops:       [start, duration, thread, depth, name]
//	Intervals: [start, duration, stream, name, span index (2^53-1: none)]
type Timeline struct {
	Names     []string    `json:"names"`
	Threads   []uint64    `json:"threads"`
	Streams   []string    `json:"streams"`
	Spans     [][6]uint64 `json:"spans"`
	Ops       [][5]uint64 `json:"ops"`
	Intervals [][5]uint64 `json:"intervals"`
	End       uint64      `json:"end_ns"`
	Dropped   Dropped     `json:"dropped"`
}

// Dropped counts what a limit left out of the page (or, for intervals on a
// device clock, what cannot be placed on the host timeline). A limit takes
// rows outside the measured region first (evenly, the longer of neighbours
// staying); the ...Outside counts say how many of those left out were
// outside it, so the rest were the region's own, cut in file order.
type Dropped struct {
	Spans               int  `json:"spans,omitempty"`
	SpansOutside        int  `json:"spans_outside,omitempty"`
	Ops                 int  `json:"ops,omitempty"`
	OpsOutside          int  `json:"ops_outside,omitempty"`
	Intervals           int  `json:"intervals,omitempty"`
	IntervalsOutside    int  `json:"intervals_outside,omitempty"`
	MeasuredRegion      bool `json:"measured_region,omitempty"` // the trace has one, so outside means something
	OtherClockIntervals int  `json:"other_clock_intervals,omitempty"`
	MemoryEvents        int  `json:"memory_events,omitempty"`
	DeviceSamples       int  `json:"device_samples,omitempty"`
}

// Graph is the execution graph: the spans' call tree (SpanParent, by index
// into Timeline.Spans, -1 for a root), each op in its span (OpSpan) with the
// tensors it read (OpIn) and wrote (OpOut, -1: none), and the trace's data
// edges between tensors. Ops are Timeline.Ops by index. Omitted says why a
// trace too large for a graph has none (the call tree is kept).
type Graph struct {
	Tensors    []string `json:"tensors"`
	SpanParent []int    `json:"span_parent"`
	OpSpan     []int    `json:"op_span"`
	OpIn       [][]int  `json:"op_in"`
	OpOut      []int    `json:"op_out"`
	Data       [][2]int `json:"data"`
	Omitted    string   `json:"omitted,omitempty"`
}

// MemoryView is the logical live bytes over the update.
type MemoryView struct {
	Points       [][]uint64    `json:"points"` // [timestamp, live bytes, then bytes per category]
	Categories   []string      `json:"categories"`
	DrawnPoints  int           `json:"drawn_points"`
	AllPoints    int           `json:"all_points"`
	PeakBytes    uint64        `json:"peak_bytes"`
	PeakAtNS     uint64        `json:"peak_at_ns"`
	LiveAtPeak   int           `json:"live_at_peak"`
	PeakStorages []PeakStorage `json:"peak_storages"` // largest first
	Dropped      int           `json:"dropped_events,omitempty"`
	// Devices: the used bytes of each device's device_memory samples.
	Devices []DeviceUsed `json:"devices"`
}

// DeviceUsed is one device's sampled used bytes: [timestamp, used bytes].
type DeviceUsed struct {
	Device  string     `json:"device"`
	Samples int        `json:"samples"`
	Points  [][]uint64 `json:"points"`
}

// PeakStorage is one storage live at the memory peak.
type PeakStorage struct {
	Bytes    uint64 `json:"bytes"`
	Category string `json:"category"`
	Device   string `json:"device"`
	Storage  string `json:"storage"`
	MadeBy   string `json:"made_by,omitempty"` // the op, else the span, that allocated it
}

// Options tune Build.
type Options struct {
	MaxLineBytes int
	Progress     func(bytesRead int64)
	Limits       Limits // zero: DefaultLimits
}

// Build reads one trace in a single pass and gathers the page: the report's
// analysis plus the timeline and memory detail the report summarises away.
func Build(r io.Reader, name string, opts Options) (*Page, error) {
	lim := opts.Limits
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	c := newCollector(lim)
	// As the checker does: a reader that can seek is re-read for memory
	// records out of timestamp order; another one has them kept.
	seeker, origin := trace.Rewindable(r)
	c.buffer = seeker == nil
	res, err := analysis.Analyze(r, analysis.Options{MaxLineBytes: opts.MaxLineBytes, Report: true, Progress: opts.Progress, Observe: c.event})
	if err != nil {
		return nil, err
	}
	tl, mem, g, err := c.finish(seeker, origin, opts.MaxLineBytes)
	if err != nil {
		return nil, err
	}
	return &Page{Name: name, Health: res.Health, Meta: res.Meta, Report: res.Report, Timeline: tl, Memory: mem, Graph: g,
		SpanKinds: traceformat.SpanKinds}, nil
}

// BuildFile is Build on the trace at path.
func BuildFile(path string, opts Options) (*Page, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Build(f, path, opts)
}

// WriteHTML writes the page as one self-contained HTML file.
func (p *Page) WriteHTML(w io.Writer) error {
	return writePage(w, "candle-trace view: "+p.Name, p)
}

// ComparisonPage is the page of two traces: B against A as `compare` sets
// them side by side, and each trace's own views below.
type ComparisonPage struct {
	Comparison *compare.Comparison `json:"comparison"`
	A          *Page               `json:"a"`
	B          *Page               `json:"b"`
}

// Compare sets two pages side by side; threshold is compare's (a relative
// change, DefaultCompareThreshold when <= 0). It never refuses: the page
// shows whether the comparison identities allow the comparison.
func Compare(a, b *Page, threshold float64) *ComparisonPage {
	ra := &analysis.Result{Health: a.Health, Meta: a.Meta, Report: a.Report}
	rb := &analysis.Result{Health: b.Health, Meta: b.Meta, Report: b.Report}
	return &ComparisonPage{Comparison: compare.Compare(a.Name, ra, b.Name, rb, threshold), A: a, B: b}
}

// WriteHTML writes the comparison as one self-contained HTML file.
func (c *ComparisonPage) WriteHTML(w io.Writer) error {
	return writePage(w, "candle-trace view: "+c.B.Name+" against "+c.A.Name, c)
}

// writePage streams the page: the template's text, and the data encoded
// straight into w. Building the whole page as one string first held three
// copies of a page of tens of megabytes (the encoded data, its string, the
// replaced page) just when the trace's state was still live.
func writePage(w io.Writer, title string, data any) error {
	rest := pageHTML
	for rest != "" {
		i := strings.Index(rest, "{{")
		if i < 0 {
			_, err := io.WriteString(w, rest)
			return err
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return fmt.Errorf("view.html: an unclosed {{ placeholder")
		}
		if _, err := io.WriteString(w, rest[:i]); err != nil {
			return err
		}
		var err error
		switch key := rest[i+2 : i+j]; key {
		case "TITLE":
			_, err = io.WriteString(w, htmlEscape(title))
		case "CSS":
			_, err = io.WriteString(w, pageCSS)
		case "JS":
			_, err = io.WriteString(w, pageJS)
		case "DATA":
			// json's default escaping turns <, > and & into \u003c...: the
			// data can never close its <script> element. The encoder's
			// trailing newline is whitespace inside the element.
			if err = json.NewEncoder(w).Encode(data); err != nil {
				err = fmt.Errorf("encode the page data: %w", err)
			}
		default:
			err = fmt.Errorf("view.html: unknown placeholder {{%s}}", key)
		}
		if err != nil {
			return err
		}
		rest = rest[i+j+2:]
	}
	return nil
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
