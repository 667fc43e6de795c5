package aggregate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/events"
)

// MaxSummaryBytes caps what Read accepts: a summary at the default caps is
// well under 4 MiB.
const MaxSummaryBytes = 64 << 20

// The reader is strict, because a summary is compared and recomputed
// from: encoding/json alone would take duplicate keys (last wins), null for
// anything, a bucket pair of three numbers, and missing fields as zeros.
// So the document is first walked token by token (duplicates, nulls,
// depth, required keys, pair lengths), then decoded with unknown fields
// refused, then checked for internal consistency.

// required lists the keys each object must carry, by path ("[]" stands for
// any array element), when it is present: of the top-level keys only
// "triggers" and "otlp" may be absent. Objects not listed (run.tags) are free-form.
var required = map[string][]string{
	"":                 {"schema", "run", "producer", "sequence", "final", "window", "enabled", "histogram", "spans", "scalars", "overflow", "dropped"},
	"run":              {"entrypoint", "phase", "device", "tags"},
	"producer":         {"name", "version", "pid", "hostname"},
	"window":           {"start_unix_ns", "end_unix_ns", "duration_ns"},
	"enabled":          {"now", "periods", "enabled_ns", "recent"},
	"enabled.recent[]": {"start_unix_ns", "end_unix_ns", "open"},
	"histogram":        {"layout", "sub_bucket_bits", "buckets"},
	"spans[]":          {"name", "count", "total_ns", "min_ns", "max_ns", "mean_ns", "p50_ns", "p95_ns", "p99_ns", "buckets"},
	"scalars[]":        {"label", "count", "mean", "min", "max", "last", "non_finite"},
	"overflow":         {"max_keys", "keys_refused", "max_scalars", "scalars_refused"},
	"dropped":          {"invalid_key", "producer"},
	"otlp":             {"endpoint", "pushed", "dropped", "last_error"},
	"triggers":         {"max", "refused", "fired"},
	"triggers.fired[]": {"update", "trigger", "value", "threshold", "detail", "trace", "no_trace"},
}

// maxDepth: the deepest valid path is spans[].buckets[] (4 levels).
const maxDepth = 8

// ReadFile reads and checks the summary at path.
func ReadFile(path string) (*Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

// Read reads and checks one summary.
func Read(r io.Reader) (*Summary, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSummaryBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSummaryBytes {
		return nil, fmt.Errorf("summary: larger than %d bytes", MaxSummaryBytes)
	}
	return Parse(data)
}

// Parse checks data and returns the summary. Errors start with "summary: ".
func Parse(data []byte) (*Summary, error) {
	s, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("summary: %w", err)
	}
	return s, nil
}

func parse(data []byte) (*Summary, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	if !IsSummary(data) {
		return nil, fmt.Errorf("not a %s document (its first key must be \"schema\" with that value)", Schema)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := walk(dec, "", 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the document")
	}
	var s Summary
	dec = json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &s, nil
}

func walk(dec *json.Decoder, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	if tok == nil {
		return fmt.Errorf("%s: null is not allowed", where(path))
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if depth >= maxDepth {
		return fmt.Errorf("%s: nested deeper than %d levels", where(path), maxDepth)
	}
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return fmt.Errorf("invalid JSON: %w", err)
			}
			k := kt.(string)
			if seen[k] {
				return fmt.Errorf("%s: duplicate key %q", where(path), k)
			}
			seen[k] = true
			child := k
			if path != "" {
				child = path + "." + k
			}
			if err := walk(dec, child, depth+1); err != nil {
				return err
			}
		}
		for _, k := range required[path] {
			if !seen[k] {
				return fmt.Errorf("%s: missing %q", where(path), k)
			}
		}
	case '[':
		n := 0
		for dec.More() {
			if err := walk(dec, path+"[]", depth+1); err != nil {
				return err
			}
			n++
		}
		if path == "spans[].buckets[]" && n != 2 {
			return fmt.Errorf("spans[].buckets: a bucket is [index, count], got %d numbers", n)
		}
	}
	_, err = dec.Token() // the closing delimiter
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return nil
}

func where(path string) string {
	if path == "" {
		return "document"
	}
	return path
}

// IsSummary tells a summary from anything else (a JSONL trace starts with
// {"kind":"meta",...}) by its first bytes: a JSON object whose first key is
// "schema" with the value Schema. A prefix of the file is enough.
func IsSummary(prefix []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	if t, err := dec.Token(); err != nil || t != "schema" {
		return false
	}
	t, err := dec.Token()
	return err == nil && t == Schema
}

// OwnFile tells the library's own output, a summary or a trace, from any
// other file by its first bytes: only those are ever overwritten.
func OwnFile(prefix []byte) bool { return IsSummary(prefix) || events.IsTrace(prefix) }

// Check verifies that a summary is consistent: the layout is this
// package's, counts agree with their histograms, min and max lie in the
// first and last buckets, totals lie between count·min and count·max, and
// the stored percentiles and means are what the buckets give. Read calls
// it; a summary built in Go can be checked with it too.
func (s *Summary) Check() error {
	if s.Schema != Schema {
		return fmt.Errorf("schema %q, want %q", s.Schema, Schema)
	}
	if err := s.Run.Validate(); err != nil {
		return err
	}
	if s.Histogram != CurrentLayout {
		return fmt.Errorf("histogram layout %+v, this reader knows only %+v", s.Histogram, CurrentLayout)
	}
	w := s.Window
	if w.EndUnixNS < w.StartUnixNS || w.EndUnixNS-w.StartUnixNS != w.DurationNS {
		return fmt.Errorf("window: end_unix_ns − start_unix_ns must equal duration_ns (%d − %d ≠ %d)", w.EndUnixNS, w.StartUnixNS, w.DurationNS)
	}
	if err := s.Enabled.check(w); err != nil {
		return err
	}
	keys := map[keyName]bool{}
	for i := range s.Spans {
		sp := &s.Spans[i]
		if err := sp.check(); err != nil {
			return fmt.Errorf("spans[%d] (%q): %w", i, sp.Name, err)
		}
		st, _ := parseStep(sp.Step)
		kn := keyName{sp.Name, st}
		if keys[kn] {
			return fmt.Errorf("spans[%d]: %q step %q appears twice", i, sp.Name, sp.Step)
		}
		keys[kn] = true
	}
	labels := map[string]bool{}
	for i := range s.Scalars {
		sc := &s.Scalars[i]
		if err := sc.check(); err != nil {
			return fmt.Errorf("scalars[%d] (%q): %w", i, sc.Label, err)
		}
		if labels[sc.Label] {
			return fmt.Errorf("scalars[%d]: label %q appears twice", i, sc.Label)
		}
		labels[sc.Label] = true
	}
	if s.Overflow.MaxKeys < 0 || s.Overflow.MaxScalars < 0 {
		return errors.New("overflow: negative cap")
	}
	if s.Triggers != nil {
		return s.Triggers.check()
	}
	return nil
}

func (e *Enabled) check(w Window) error {
	if uint64(len(e.Recent)) > e.Periods {
		return fmt.Errorf("enabled: %d recent periods but %d in all", len(e.Recent), e.Periods)
	}
	if e.EnabledNS > w.DurationNS {
		return fmt.Errorf("enabled: enabled_ns %d exceeds the window's %d", e.EnabledNS, w.DurationNS)
	}
	prevEnd := w.StartUnixNS
	for i, p := range e.Recent {
		if p.StartUnixNS < prevEnd || p.EndUnixNS < p.StartUnixNS || p.EndUnixNS > w.EndUnixNS {
			return fmt.Errorf("enabled.recent[%d]: periods must be ordered, disjoint and inside the window", i)
		}
		if p.Open && (i != len(e.Recent)-1 || !e.Now || p.EndUnixNS != w.EndUnixNS) {
			return fmt.Errorf("enabled.recent[%d]: only the last period can be open, while enabled, ending at the window's end", i)
		}
		prevEnd = p.EndUnixNS
	}
	if e.Now && (len(e.Recent) == 0 || !e.Recent[len(e.Recent)-1].Open) {
		return errors.New("enabled: now is true but no period is open")
	}
	return nil
}

func parseStep(name string) (events.Step, bool) {
	for _, st := range []events.Step{events.StepForward, events.StepBackward, events.StepOptimizer} {
		if name == st.String() {
			return st, true
		}
	}
	return events.StepNone, name == ""
}

func (sp *SpanStats) check() error {
	if strings.TrimSpace(sp.Name) == "" {
		return errors.New("blank name")
	}
	if _, ok := parseStep(sp.Step); !ok {
		return fmt.Errorf("step %q is not forward, backward or optimizer", sp.Step)
	}
	if sp.Count == 0 {
		return errors.New("count is 0 (a span without observations is left out)")
	}
	if sp.MinNS > sp.MaxNS {
		return fmt.Errorf("min_ns %d > max_ns %d", sp.MinNS, sp.MaxNS)
	}
	if len(sp.Buckets) == 0 {
		return errors.New("no buckets")
	}
	var sum uint64
	prev := -1
	for _, b := range sp.Buckets {
		if b[0] >= NumBuckets || int(b[0]) <= prev {
			return fmt.Errorf("bucket index %d: indices must increase and be below %d", b[0], NumBuckets)
		}
		if b[1] == 0 {
			return fmt.Errorf("bucket %d is empty (empty buckets are left out)", b[0])
		}
		var carry uint64
		if sum, carry = bits.Add64(sum, b[1], 0); carry != 0 {
			return errors.New("bucket counts overflow")
		}
		prev = int(b[0])
	}
	if sum != sp.Count {
		return fmt.Errorf("bucket counts sum to %d, count is %d", sum, sp.Count)
	}
	if first, last := int(sp.Buckets[0][0]), prev; BucketIndex(sp.MinNS) != first || BucketIndex(sp.MaxNS) != last {
		return fmt.Errorf("min_ns %d and max_ns %d must lie in the first (%d) and last (%d) buckets", sp.MinNS, sp.MaxNS, first, last)
	}
	if sp.Count == 1 && sp.MinNS != sp.MaxNS {
		return errors.New("one observation but min_ns ≠ max_ns")
	}
	if hi, lo := bits.Mul64(sp.Count, sp.MinNS); hi != 0 || lo > sp.TotalNS {
		return fmt.Errorf("total_ns %d is less than count × min_ns", sp.TotalNS)
	}
	// A saturated total (math.MaxUint64) has lost its upper bound.
	if hi, lo := bits.Mul64(sp.Count, sp.MaxNS); sp.TotalNS != math.MaxUint64 && hi == 0 && lo < sp.TotalNS {
		return fmt.Errorf("total_ns %d exceeds count × max_ns", sp.TotalNS)
	}
	if want := float64(sp.TotalNS) / float64(sp.Count); !closeTo(sp.MeanNS, want) {
		return fmt.Errorf("mean_ns %v, total_ns / count is %v", sp.MeanNS, want)
	}
	hb := sp.HistBuckets()
	for _, p := range []struct {
		name string
		pct  float64
		got  uint64
	}{{"p50_ns", 50, sp.P50NS}, {"p95_ns", 95, sp.P95NS}, {"p99_ns", 99, sp.P99NS}} {
		if want := Percentile(hb, sp.Count, sp.MinNS, sp.MaxNS, p.pct); p.got != want {
			return fmt.Errorf("%s %d, the buckets give %d", p.name, p.got, want)
		}
	}
	return nil
}

func closeTo(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

func (sc *ScalarStats) check() error {
	if strings.TrimSpace(sc.Label) == "" {
		return errors.New("blank label")
	}
	if sc.Count == 0 {
		if sc.Mean != 0 || sc.Min != 0 || sc.Max != 0 || sc.Last != 0 {
			return errors.New("count is 0 but mean, min, max or last is not")
		}
		if sc.NonFinite == 0 {
			return errors.New("no values at all (such a label is left out)")
		}
		return nil
	}
	if !(sc.Min <= sc.Mean && sc.Mean <= sc.Max && sc.Min <= sc.Last && sc.Last <= sc.Max) {
		return fmt.Errorf("need min ≤ mean, last ≤ max: min %v, mean %v, last %v, max %v", sc.Min, sc.Mean, sc.Last, sc.Max)
	}
	return nil
}

// SortedSpans returns the spans sorted by total time (descending), then
// name and step: the order Snapshot writes.
func (s *Summary) SortedSpans() []SpanStats {
	out := slices.Clone(s.Spans)
	sort.SliceStable(out, func(i, j int) bool {
		x, y := &out[i], &out[j]
		if x.TotalNS != y.TotalNS {
			return x.TotalNS > y.TotalNS
		}
		if x.Name != y.Name {
			return x.Name < y.Name
		}
		return x.Step < y.Step
	})
	return out
}
