package aggsummary

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"unicode"

	"github.com/candle-trace/candle-trace/internal/report/text"
	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// The aggregate side of `candle-trace report`: a candle-trace/aggregate/1
// summary (package aggregate) holds per-name totals and histograms for a
// whole run, not one step's spans, so its report is a table by total time
// and the overhead analysis the entrenar tracer made over its counters:
// the span names are put in categories, and the hypothesis "compute
// dominates" is tested against the measured share of compute.

// Categories with a meaning to the analysis. Any other category a rule
// names is an overhead category of its own.
const (
	CategoryCompute  = "compute"
	CategoryData     = "data"
	CategoryTransfer = "transfer"
	CategoryOther    = "other"
	// CategoryIgnore leaves a span out of the shares: a span that encloses
	// others (a whole training step) would otherwise count their time twice.
	CategoryIgnore = "ignore"
	// CategoryCompile is torch.compile's compilations ("train/compile"),
	// which run inside a forward or backward span: the analysis moves their
	// time out of compute into an overhead of its own, so that a run that
	// recompiled is not called compute-bound for its compiler's time.
	CategoryCompile = "compile"
)

// DefaultComputeThreshold is the compute share above which "compute
// dominates" is corroborated (the entrenar tracer's 50%).
const DefaultComputeThreshold = 0.5

// ComputeHypothesis is the claim the aggregate analysis tests.
const ComputeHypothesis = "compute dominates: compute spans take more than the threshold of the categorized span time"

// defaultWords maps the words of a span name to a category when no rule
// names it. A name's words are its lower-cased runs of letters and digits
// ("mlp/forward" → mlp, forward); the last word that is known decides, as
// the last path segment is usually the most specific ("forward/h2d" is a
// transfer).
var defaultWords = map[string]string{
	"forward": CategoryCompute, "fwd": CategoryCompute, "backward": CategoryCompute, "bwd": CategoryCompute,
	"optimizer": CategoryCompute, "optim": CategoryCompute,
	"data": CategoryData, "dataloader": CategoryData, "loader": CategoryData, "collate": CategoryData,
	"to": CategoryTransfer, "copy": CategoryTransfer, "transfer": CategoryTransfer, "h2d": CategoryTransfer,
	"d2h": CategoryTransfer, "memcpy": CategoryTransfer,
}

// enclosingWords name a span that encloses the others of an update (the
// whole step): such a span is ignored by default, as its time is already its
// children's. They decide only when no word of defaultWords does, so that
// "optimizer.step" stays compute while "train/step" is ignored.
var enclosingWords = map[string]bool{
	"step": true, "update": true, "iteration": true, "iter": true, "epoch": true,
}

// compileWord names torch.compile's compilations (CategoryCompile), under the
// same terms as enclosingWords: the last word, no step tag.
const compileWord = "compile"

// CategoryRule maps span names to a category: Pattern is a name, or a
// path.Match pattern when it contains * ? or [.
type CategoryRule struct {
	Pattern  string `json:"pattern"`
	Category string `json:"category"`
}

// ParseCategoryRule parses "NAME=CATEGORY" (split at the last "=", so a
// name may contain one).
func ParseCategoryRule(s string) (CategoryRule, error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 || i == len(s)-1 {
		return CategoryRule{}, fmt.Errorf("category rule %q: want NAME=CATEGORY", s)
	}
	r := CategoryRule{Pattern: s[:i], Category: strings.TrimSpace(s[i+1:])}
	if strings.ContainsAny(r.Pattern, "*?[") {
		if _, err := path.Match(r.Pattern, ""); err != nil {
			return CategoryRule{}, fmt.Errorf("category rule %q: bad pattern: %v", s, err)
		}
	}
	if r.Category == "" || strings.ContainsFunc(r.Category, unicode.IsSpace) {
		return CategoryRule{}, fmt.Errorf("category rule %q: the category must be one word", s)
	}
	return r, nil
}

// ReadCategoryRules reads a rules file: one NAME=CATEGORY per line; blank
// lines and lines starting with # are skipped.
func ReadCategoryRules(r io.Reader) ([]CategoryRule, error) {
	var rules []CategoryRule
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rule, err := ParseCategoryRule(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rules = append(rules, rule)
	}
	return rules, sc.Err()
}

// Categorizer puts span names in categories: the first matching rule (an
// exact name before any pattern), else the default words of the name, else
// the span's step tag (forward, backward and optimizer are compute), else
// other.
type Categorizer struct {
	exact map[string]string
	globs []CategoryRule
}

// NewCategorizer returns a Categorizer with rules on top of the defaults.
func NewCategorizer(rules []CategoryRule) *Categorizer {
	c := &Categorizer{exact: map[string]string{}}
	for _, r := range rules {
		if strings.ContainsAny(r.Pattern, "*?[") {
			c.globs = append(c.globs, r)
		} else if _, dup := c.exact[r.Pattern]; !dup {
			c.exact[r.Pattern] = r.Category
		}
	}
	return c
}

// Categorize returns the category of a span and what decided it: "rule",
// "name", "step" or "default".
func (c *Categorizer) Categorize(name, step string) (category, source string) {
	if cat, ok := c.exact[name]; ok {
		return cat, "rule"
	}
	for _, r := range c.globs {
		if ok, _ := path.Match(r.Pattern, name); ok {
			return r.Category, "rule"
		}
	}
	words := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for i := len(words) - 1; i >= 0; i-- {
		if cat, ok := defaultWords[words[i]]; ok {
			return cat, "name"
		}
	}
	if step == "" && len(words) > 0 {
		switch last := words[len(words)-1]; {
		case last == compileWord:
			return CategoryCompile, "name"
		case enclosingWords[last]:
			return CategoryIgnore, "name"
		}
	}
	if step != "" {
		return CategoryCompute, "step"
	}
	return CategoryOther, "default"
}

// AggregateReport is what `candle-trace report SUMMARY.json` shows.
type AggregateReport struct {
	Path     string                  `json:"path"`
	Schema   string                  `json:"schema"`
	Run      aggregate.Run           `json:"run"`
	Sequence uint64                  `json:"sequence"`
	Final    bool                    `json:"final"`
	Window   aggregate.Window        `json:"window"`
	Enabled  aggregate.Enabled       `json:"enabled"`
	TotalNS  uint64                  `json:"total_ns"` // sum of the totals of spans not ignored
	Spans    []AggregateRow          `json:"spans"`
	Scalars  []aggregate.ScalarStats `json:"scalars"`
	Triggers []Trigger               `json:"triggers"`
	// Fired is each trigger that fired, in order (the summary's "triggers"
	// block: ct_aggregate_trigger); FiredRefused the firings past its cap.
	Fired        []Firing           `json:"fired"`
	FiredRefused uint64             `json:"fired_refused"`
	Overflow     aggregate.Overflow `json:"overflow"`
	Dropped      aggregate.Dropped  `json:"dropped"`
	Analysis     AggregateAnalysis  `json:"overhead"`
}

// TriggerPrefix starts the label of the scalar under which
// candle_trace.torch.watch records each trigger that fired, with the
// value the trigger measured (an update's seconds for slow, the loss for
// non_finite); the scalar's counts are the trigger's firings.
const TriggerPrefix = "trigger/"

// Trigger is one trigger that fired during the run: how often, and the
// values it measured as the summary folded them (Mean, Min, Max and Last
// over the finite ones; a non-finite value, such as the NaN loss that fired
// non_finite, is only counted). Values is false when none was finite.
type Trigger struct {
	Name      string  `json:"name"`
	Fired     uint64  `json:"fired"`
	NonFinite uint64  `json:"non_finite"`
	Values    bool    `json:"values"`
	Mean      float64 `json:"mean"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	Last      float64 `json:"last"`
}

// triggers lists the trigger scalars that fired, by name (the summary's
// scalars are sorted by label).
func triggers(scalars []aggregate.ScalarStats) []Trigger {
	out := []Trigger{}
	for _, sc := range scalars {
		name, ok := strings.CutPrefix(sc.Label, TriggerPrefix)
		if !ok || name == "" || sc.Count+sc.NonFinite == 0 {
			continue
		}
		tr := Trigger{Name: name, Fired: sc.Count + sc.NonFinite, NonFinite: sc.NonFinite, Values: sc.Count > 0}
		if tr.Values {
			tr.Mean, tr.Min, tr.Max, tr.Last = sc.Mean, sc.Min, sc.Max, sc.Last
		}
		out = append(out, tr)
	}
	return out
}

// Firing is one trigger that fired, as the summary lists it, with its
// value against its threshold as the text shows it (FiringValue).
type Firing struct {
	aggregate.Firing
	Shown string `json:"shown"`
}

// AggregateRow is one (name, step) of the table. Share is of TotalNS; 0
// for an ignored span.
type AggregateRow struct {
	Name           string  `json:"name"`
	Step           string  `json:"step,omitempty"`
	Category       string  `json:"category"`
	CategorySource string  `json:"category_source"`
	Count          uint64  `json:"count"`
	TotalNS        uint64  `json:"total_ns"`
	MeanNS         float64 `json:"mean_ns"`
	MinNS          uint64  `json:"min_ns"`
	P50NS          uint64  `json:"p50_ns"`
	P95NS          uint64  `json:"p95_ns"`
	P99NS          uint64  `json:"p99_ns"`
	MaxNS          uint64  `json:"max_ns"`
	Share          float64 `json:"share"`
}

// CategoryShare is one category's part of the categorized time.
type CategoryShare struct {
	Category string  `json:"category"`
	TotalNS  uint64  `json:"total_ns"`
	Share    float64 `json:"share"`
	Spans    int     `json:"spans"`
}

// AggregateAnalysis states the hypothesis, the numbers, the threshold and
// the verdict: corroborated, falsified or inconclusive.
type AggregateAnalysis struct {
	Hypothesis    string          `json:"hypothesis"`
	Threshold     float64         `json:"threshold"`
	CategorizedNS uint64          `json:"categorized_ns"`
	ComputeNS     uint64          `json:"compute_ns"`
	ComputeShare  float64         `json:"compute_share"`
	OverheadNS    uint64          `json:"overhead_ns"`
	OverheadShare float64         `json:"overhead_share"`
	IgnoredNS     uint64          `json:"ignored_ns"`
	Categories    []CategoryShare `json:"categories"` // by time, largest first
	Verdict       string          `json:"verdict"`
	Explanation   string          `json:"explanation"`
}

// AnalyzeAggregate builds the report of a summary. threshold is the
// compute share above which the hypothesis holds (0: the default).
func AnalyzeAggregate(path string, s *aggregate.Summary, cats *Categorizer, threshold float64) *AggregateReport {
	if cats == nil {
		cats = NewCategorizer(nil)
	}
	if threshold <= 0 {
		threshold = DefaultComputeThreshold
	}
	r := &AggregateReport{Path: path, Schema: s.Schema, Run: s.Run, Sequence: s.Sequence, Final: s.Final, Window: s.Window,
		Enabled: s.Enabled, Scalars: s.Scalars, Overflow: s.Overflow, Dropped: s.Dropped, Spans: []AggregateRow{}}
	if r.Scalars == nil {
		r.Scalars = []aggregate.ScalarStats{}
	}
	r.Triggers = triggers(r.Scalars)
	r.Fired = []Firing{}
	if s.Triggers != nil {
		for _, f := range s.Triggers.Fired {
			r.Fired = append(r.Fired, Firing{Firing: f, Shown: FiringValue(f)})
		}
		r.FiredRefused = s.Triggers.Refused
	}
	byCat := map[string]*CategoryShare{}
	var ignored uint64
	for _, sp := range s.SortedSpans() {
		cat, src := cats.Categorize(sp.Name, sp.Step)
		r.Spans = append(r.Spans, AggregateRow{Name: sp.Name, Step: sp.Step, Category: cat, CategorySource: src, Count: sp.Count,
			TotalNS: sp.TotalNS, MeanNS: sp.MeanNS, MinNS: sp.MinNS, P50NS: sp.P50NS, P95NS: sp.P95NS, P99NS: sp.P99NS, MaxNS: sp.MaxNS})
		if cat == CategoryIgnore {
			ignored = trace.SatAdd(ignored, sp.TotalNS)
			continue
		}
		if cat != CategoryCompile { // already in the compute that encloses it
			r.TotalNS = trace.SatAdd(r.TotalNS, sp.TotalNS)
		}
		c := byCat[cat]
		if c == nil {
			c = &CategoryShare{Category: cat}
			byCat[cat] = c
		}
		c.TotalNS = trace.SatAdd(c.TotalNS, sp.TotalNS)
		c.Spans++
	}
	if cc, ok := byCat[CategoryCompile]; ok {
		// Out of the compute spans that held it (what a compilation outside
		// any compute span leaves of this is at most the compute there is).
		var moved uint64
		if c := byCat[CategoryCompute]; c != nil {
			moved = min(cc.TotalNS, c.TotalNS)
			c.TotalNS -= moved
		}
		r.TotalNS = trace.SatAdd(r.TotalNS, cc.TotalNS-moved)
	}
	for i := range r.Spans {
		if r.Spans[i].Category != CategoryIgnore && r.TotalNS > 0 {
			r.Spans[i].Share = float64(r.Spans[i].TotalNS) / float64(r.TotalNS)
		}
	}
	a := AggregateAnalysis{Hypothesis: ComputeHypothesis, Threshold: threshold, CategorizedNS: r.TotalNS, IgnoredNS: ignored, Categories: []CategoryShare{}}
	for _, c := range byCat {
		if r.TotalNS > 0 {
			c.Share = float64(c.TotalNS) / float64(r.TotalNS)
		}
		a.Categories = append(a.Categories, *c)
	}
	sort.Slice(a.Categories, func(i, j int) bool {
		x, y := a.Categories[i], a.Categories[j]
		return x.TotalNS > y.TotalNS || (x.TotalNS == y.TotalNS && x.Category < y.Category)
	})
	if c := byCat[CategoryCompute]; c != nil {
		a.ComputeNS = c.TotalNS
	}
	a.OverheadNS = r.TotalNS - a.ComputeNS
	if r.TotalNS == 0 {
		a.Verdict = "inconclusive"
		a.Explanation = "no span time to divide (no spans, or all ignored)"
		r.Analysis = a
		return r
	}
	a.ComputeShare = float64(a.ComputeNS) / float64(r.TotalNS)
	a.OverheadShare = float64(a.OverheadNS) / float64(r.TotalNS)
	largest := ""
	for _, c := range a.Categories {
		if c.Category != CategoryCompute {
			largest = fmt.Sprintf("%s at %s", c.Category, text.FormatShare(c.Share))
			if advice := categoryAdvice[c.Category]; advice != "" {
				largest += " (" + advice + ")"
			}
			break
		}
	}
	computed := fmt.Sprintf("compute took %s of %s categorized span time", text.FormatShare(a.ComputeShare), text.FormatNS(float64(r.TotalNS)))
	if a.ComputeShare > threshold {
		a.Verdict = "corroborated"
		a.Explanation = fmt.Sprintf("%s (> %s): compute dominates", computed, text.FormatShare(threshold))
		if largest != "" {
			a.Explanation += "; the largest overhead is " + largest
		}
	} else {
		a.Verdict = "falsified"
		a.Explanation = fmt.Sprintf("%s (<= %s): overhead dominates", computed, text.FormatShare(threshold))
		if largest != "" {
			a.Explanation += ", led by " + largest
		}
	}
	r.Analysis = a
	return r
}

var categoryAdvice = map[string]string{
	CategoryCompile: "torch.compile's compilations: the first one, then one per recompile -- shapes or dtypes that change " +
		"(a smaller last batch: drop_last, torch._dynamo.mark_dynamic) or guards on Python values; TORCH_LOGS=recompiles says why",
	CategoryData:     "the input pipeline: more loader workers, prefetching, pinned memory",
	CategoryTransfer: "host-device copies: pinned memory, non-blocking copies, keeping tensors on the device",
	CategoryOther:    "spans in no category: map them with --category NAME=CAT, and a span that encloses others to ignore",
}
