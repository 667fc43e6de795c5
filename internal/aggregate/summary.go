package aggregate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/candle-trace/candle-trace/internal/events"
)

// Schema names the summary format (docs/aggregate-format.md).
const Schema = "candle-trace/aggregate/1"

// LayoutName names the histogram layout of hist.go in the summary.
const LayoutName = "log-linear"

// Summary is the candle-trace/aggregate/1 document. It is one JSON object,
// never JSON lines and never with a "kind": it must not be mistaken for a
// candle-graph trace.
type Summary struct {
	Schema    string          `json:"schema"`
	Run       Run             `json:"run"`
	Producer  Producer        `json:"producer"`
	Sequence  uint64          `json:"sequence"`
	Final     bool            `json:"final"`
	Window    Window          `json:"window"`
	Enabled   Enabled         `json:"enabled"`
	Histogram HistogramLayout `json:"histogram"`
	Spans     []SpanStats     `json:"spans"`
	Scalars   []ScalarStats   `json:"scalars"`
	Overflow  Overflow        `json:"overflow"`
	Dropped   Dropped         `json:"dropped"`
	// Triggers is present once a trigger fired (triggers.go).
	Triggers *Triggers `json:"triggers,omitempty"`
	// OTLP is present when the summary is also pushed to an OpenTelemetry
	// collector: how those pushes went, up to this summary.
	OTLP *OTLPPush `json:"otlp,omitempty"`
}

// OTLPPush counts the pushes of a run's summaries to a collector. A push
// that fails is not retried (the next summary supersedes it): it is
// dropped and counted.
type OTLPPush struct {
	Endpoint string `json:"endpoint"`
	Pushed   uint64 `json:"pushed"`  // summaries the collector accepted
	Dropped  uint64 `json:"dropped"` // summaries not delivered
	// LastError is why the latest drop happened: the latest failed push's
	// error, which a summary superseded after it does not replace; "" when
	// none.
	LastError string `json:"last_error"`
}

// Run is the provenance of the run: the part of the run JSON of ct_open
// that means something for a whole run (no capture step).
type Run struct {
	Entrypoint    string            `json:"entrypoint"`
	Phase         string            `json:"phase"` // train | infer
	Device        string            `json:"device"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	Binding       string            `json:"binding,omitempty"`
	Tags          map[string]string `json:"tags"`
}

// RunFrom takes the provenance of a parsed run JSON.
func RunFrom(r *events.Run) Run {
	tags := make(map[string]string, len(r.Tags))
	for k, v := range r.Tags {
		tags[k] = v
	}
	return Run{Entrypoint: r.Entrypoint, Phase: r.Phase, Device: r.Device, CorrelationID: r.CorrelationID, Binding: r.Binding, Tags: tags}
}

// Validate checks the fields a summary requires.
func (r *Run) Validate() error {
	if r.Entrypoint == "" || r.Device == "" {
		return fmt.Errorf("run: entrypoint and device must not be empty")
	}
	if r.Phase != "train" && r.Phase != "infer" {
		return fmt.Errorf("run: phase must be train or infer, got %q", r.Phase)
	}
	return nil
}

// Producer names the writer.
type Producer struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	PID      int    `json:"pid"`
	Hostname string `json:"hostname"`
}

// Window is the wall-clock span the statistics cover: from the creation
// of the aggregator to the snapshot. End is Start plus the monotonic
// duration, so a wall-clock step during the run cannot make it negative.
type Window struct {
	StartUnixNS uint64 `json:"start_unix_ns"`
	EndUnixNS   uint64 `json:"end_unix_ns"`
	DurationNS  uint64 `json:"duration_ns"`
}

// Enabled describes when observations were folded.
type Enabled struct {
	Now       bool     `json:"now"`
	Periods   uint64   `json:"periods"`    // switches on, the open period included
	EnabledNS uint64   `json:"enabled_ns"` // total time enabled
	Recent    []Period `json:"recent"`     // the newest periods, oldest first
}

// Period is one enabled period; Open marks the one still running, whose
// end is the snapshot time.
type Period struct {
	StartUnixNS uint64 `json:"start_unix_ns"`
	EndUnixNS   uint64 `json:"end_unix_ns"`
	Open        bool   `json:"open"`
}

// HistogramLayout identifies the bucket layout (hist.go), so that a reader
// refuses buckets it would misinterpret.
type HistogramLayout struct {
	Layout        string `json:"layout"`
	SubBucketBits int    `json:"sub_bucket_bits"`
	Buckets       int    `json:"buckets"`
}

// CurrentLayout is the layout this package writes and reads.
var CurrentLayout = HistogramLayout{Layout: LayoutName, SubBucketBits: SubBucketBits, Buckets: NumBuckets}

// SpanStats is the statistics of one (name, step). Buckets lists the
// non-empty histogram buckets as [index, count] pairs in index order.
type SpanStats struct {
	Name    string      `json:"name"`
	Step    string      `json:"step,omitempty"` // forward | backward | optimizer; absent: none
	Count   uint64      `json:"count"`
	TotalNS uint64      `json:"total_ns"`
	MinNS   uint64      `json:"min_ns"`
	MaxNS   uint64      `json:"max_ns"`
	MeanNS  float64     `json:"mean_ns"`
	P50NS   uint64      `json:"p50_ns"`
	P95NS   uint64      `json:"p95_ns"`
	P99NS   uint64      `json:"p99_ns"`
	Buckets [][2]uint64 `json:"buckets"`
}

// HistBuckets returns Buckets as []Bucket.
func (s *SpanStats) HistBuckets() []Bucket {
	out := make([]Bucket, len(s.Buckets))
	for i, b := range s.Buckets {
		out[i] = Bucket{Index: int(b[0]), Count: b[1]}
	}
	return out
}

// Percentile recomputes the p-th percentile from the buckets.
func (s *SpanStats) Percentile(p float64) uint64 {
	return Percentile(s.HistBuckets(), s.Count, s.MinNS, s.MaxNS, p)
}

// ScalarStats is the statistics of one scalar label, over its finite
// values; NonFinite counts the NaN and infinite ones. All numbers are 0
// when Count is 0.
type ScalarStats struct {
	Label     string  `json:"label"`
	Count     uint64  `json:"count"`
	Mean      float64 `json:"mean"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	Last      float64 `json:"last"`
	NonFinite uint64  `json:"non_finite"`
}

// Overflow reports the caps and what they refused. Observations of refused
// keys are counted in the span named OverflowName (scalars likewise).
type Overflow struct {
	MaxKeys        int    `json:"max_keys"`
	KeysRefused    uint64 `json:"keys_refused"`
	MaxScalars     int    `json:"max_scalars"`
	ScalarsRefused uint64 `json:"scalars_refused"`
}

// Dropped counts observations that were not folded: keys no Intern issued
// (a producer bug) and drops a producer reported with AddDropped.
type Dropped struct {
	InvalidKey uint64 `json:"invalid_key"`
	Producer   uint64 `json:"producer"`
}

func stepName(s events.Step) string {
	if s == events.StepNone {
		return ""
	}
	return s.String()
}

func unixNS(t time.Time) uint64 { return uint64(max(t.UnixNano(), 0)) }

// Snapshot returns the statistics so far as a Summary without run,
// producer or sequence (the Writer fills those in). Keys that were interned
// but never observed are left out. Spans are sorted by total time, then
// name and step; scalars by label.
func (a *Aggregator) Snapshot() *Summary {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.cfg.clock.Now().Sub(a.start)
	now = max(now, 0)
	startNS := unixNS(a.start)
	at := func(d time.Duration) uint64 { return startNS + uint64(d) }
	s := &Summary{
		Schema:    Schema,
		Run:       Run{Tags: map[string]string{}},
		Window:    Window{StartUnixNS: startNS, EndUnixNS: at(now), DurationNS: uint64(now)},
		Histogram: CurrentLayout,
		Spans:     []SpanStats{},
		Scalars:   []ScalarStats{},
		Overflow:  Overflow{MaxKeys: a.cfg.maxKeys, KeysRefused: a.keysRefused, MaxScalars: a.cfg.maxScalars, ScalarsRefused: a.scalarsRefused},
		Dropped:   Dropped{InvalidKey: a.invalidKeys, Producer: a.producerDrops},
		Triggers:  a.triggersSnapshot(),
	}
	en := Enabled{Now: a.open, Periods: a.periods, EnabledNS: uint64(a.enabledDur), Recent: []Period{}}
	// The ring holds the newest closed periods; recentNext is the oldest
	// once it is full.
	for i := range a.recent {
		p := a.recent[(a.recentNext+i)%len(a.recent)]
		en.Recent = append(en.Recent, Period{StartUnixNS: at(p.start), EndUnixNS: at(p.end)})
	}
	if a.open {
		en.EnabledNS += uint64(now - a.openSince)
		if len(en.Recent) == a.cfg.maxPeriods {
			en.Recent = en.Recent[1:]
		}
		en.Recent = append(en.Recent, Period{StartUnixNS: at(a.openSince), EndUnixNS: at(now), Open: true})
	}
	s.Enabled = en
	var scratch []Bucket
	for _, st := range a.spans {
		if st.count == 0 {
			continue
		}
		scratch = st.hist.buckets(scratch[:0])
		pairs := make([][2]uint64, len(scratch))
		for i, b := range scratch {
			pairs[i] = [2]uint64{uint64(b.Index), b.Count}
		}
		s.Spans = append(s.Spans, SpanStats{
			Name: st.name, Step: stepName(st.step), Count: st.count, TotalNS: st.total, MinNS: st.min, MaxNS: st.max,
			MeanNS:  float64(st.total) / float64(st.count),
			P50NS:   Percentile(scratch, st.count, st.min, st.max, 50),
			P95NS:   Percentile(scratch, st.count, st.min, st.max, 95),
			P99NS:   Percentile(scratch, st.count, st.min, st.max, 99),
			Buckets: pairs,
		})
	}
	sort.Slice(s.Spans, func(i, j int) bool {
		x, y := &s.Spans[i], &s.Spans[j]
		if x.TotalNS != y.TotalNS {
			return x.TotalNS > y.TotalNS
		}
		if x.Name != y.Name {
			return x.Name < y.Name
		}
		return x.Step < y.Step
	})
	for _, sc := range a.scalars {
		if sc.count == 0 && sc.nonFinite == 0 {
			continue
		}
		out := ScalarStats{Label: sc.label, Count: sc.count, NonFinite: sc.nonFinite}
		if sc.count > 0 {
			out.Mean, out.Min, out.Max, out.Last = sc.sum/float64(sc.count), sc.min, sc.max, sc.last
			// A long sum may round the mean just outside [min, max].
			out.Mean = math.Min(math.Max(out.Mean, out.Min), out.Max)
		}
		s.Scalars = append(s.Scalars, out)
	}
	sort.Slice(s.Scalars, func(i, j int) bool { return s.Scalars[i].Label < s.Scalars[j].Label })
	return s
}

// Encode writes the summary as JSON: one top-level field per line, one
// span or scalar per line, so that it reads in a terminal and diffs well,
// and ends with a newline. The schema comes first, so that a reader can
// tell the format from the first bytes.
func (s *Summary) Encode(w io.Writer) error {
	// A nil map or slice would encode as null, which the reader refuses.
	run, en := s.Run, s.Enabled
	if run.Tags == nil {
		run.Tags = map[string]string{}
	}
	if en.Recent == nil {
		en.Recent = []Period{}
	}
	var buf bytes.Buffer
	buf.WriteString("{\n")
	field := func(name string, v any, last bool) error {
		fmt.Fprintf(&buf, " %q: ", name)
		if err := appendJSON(&buf, v); err != nil {
			return fmt.Errorf("aggregate: encoding %s: %w", name, err)
		}
		if !last {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
		return nil
	}
	list := func(name string, n int, elem func(i int) any, last bool) error {
		fmt.Fprintf(&buf, " %q: [", name)
		for i := range n {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString("\n  ")
			if err := appendJSON(&buf, elem(i)); err != nil {
				return fmt.Errorf("aggregate: encoding %s: %w", name, err)
			}
		}
		if n > 0 {
			buf.WriteString("\n ")
		}
		buf.WriteByte(']')
		if !last {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
		return nil
	}
	steps := []func() error{
		func() error { return field("schema", s.Schema, false) },
		func() error { return field("run", run, false) },
		func() error { return field("producer", s.Producer, false) },
		func() error { return field("sequence", s.Sequence, false) },
		func() error { return field("final", s.Final, false) },
		func() error { return field("window", s.Window, false) },
		func() error { return field("enabled", en, false) },
		func() error { return field("histogram", s.Histogram, false) },
		func() error { return list("spans", len(s.Spans), func(i int) any { return &s.Spans[i] }, false) },
		func() error { return list("scalars", len(s.Scalars), func(i int) any { return &s.Scalars[i] }, false) },
		func() error { return field("overflow", s.Overflow, false) },
		func() error { return field("dropped", s.Dropped, s.Triggers == nil && s.OTLP == nil) },
	}
	if s.Triggers != nil {
		// one firing per line, as the spans
		t := s.Triggers
		steps = append(steps, func() error {
			fmt.Fprintf(&buf, " \"triggers\": {\"max\":%d,\"refused\":%d,\"fired\":[", t.Max, t.Refused)
			for i := range t.Fired {
				if i > 0 {
					buf.WriteByte(',')
				}
				buf.WriteString("\n  ")
				if err := appendText(&buf, &t.Fired[i]); err != nil {
					return fmt.Errorf("aggregate: encoding triggers: %w", err)
				}
			}
			if len(t.Fired) > 0 {
				buf.WriteString("\n ")
			}
			buf.WriteString("]}")
			if s.OTLP != nil {
				buf.WriteByte(',')
			}
			buf.WriteByte('\n')
			return nil
		})
	}
	if s.OTLP != nil {
		steps = append(steps, func() error { return field("otlp", s.OTLP, true) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	buf.WriteString("}\n")
	_, err := w.Write(buf.Bytes())
	return err
}

func appendJSON(buf *bytes.Buffer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf.Write(data)
	return nil
}

// appendText is appendJSON without the HTML escapes ("68.5 ms > 52.1 ms"
// stays readable): for the firings' free text.
func appendText(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
	return nil
}
