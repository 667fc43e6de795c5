package aggsummary

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// FuzzCategoryRules: the rules parser never panics, and a rule it accepts
// is one word of category and a usable pattern.
func FuzzCategoryRules(f *testing.F) {
	f.Add("train_step=ignore\n# c\nlog_*=logging\n")
	f.Add("a=b=c")
	f.Add("[=x")
	f.Fuzz(func(t *testing.T, in string) {
		rules, err := ReadCategoryRules(strings.NewReader(in))
		if err != nil {
			return
		}
		c := NewCategorizer(rules)
		for _, r := range rules {
			if r.Category == "" || strings.ContainsAny(r.Category, " \t\n") {
				t.Fatalf("accepted category %q", r.Category)
			}
			if cat, _ := c.Categorize(r.Pattern, ""); cat == "" {
				t.Fatalf("no category for %q", r.Pattern)
			}
		}
	})
}

// FuzzAggregateReport: whatever summary the strict reader accepts, the
// report and comparison hold together: shares of the categorized time sum
// to 1, the verdict agrees with the threshold, and each trigger listed is a
// trigger/ scalar's firings.
func FuzzAggregateReport(f *testing.F) {
	for _, name := range []string{"aggregate-a.json", "aggregate-b.json", "aggregate-triggers.json"} {
		if data, err := os.ReadFile(filepath.Join(testutil.CorpusDir(f), name)); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := aggregate.Parse(data)
		if err != nil {
			return
		}
		r := AnalyzeAggregate("f", s, nil, 0)
		a := r.Analysis
		var sum float64
		for _, c := range a.Categories {
			sum += c.Share
		}
		switch {
		case a.CategorizedNS == 0:
			if a.Verdict != "inconclusive" {
				t.Fatalf("verdict %s with no time", a.Verdict)
			}
		case math.Abs(sum-1) > 1e-9:
			t.Fatalf("category shares sum to %v", sum)
		case (a.ComputeShare > a.Threshold) != (a.Verdict == "corroborated"):
			t.Fatalf("verdict %s at compute share %v", a.Verdict, a.ComputeShare)
		}
		byLabel := map[string]aggregate.ScalarStats{}
		for _, sc := range s.Scalars {
			byLabel[sc.Label] = sc
		}
		for _, tr := range r.Triggers {
			sc, ok := byLabel[TriggerPrefix+tr.Name]
			if !ok || tr.Fired != sc.Count+sc.NonFinite || tr.Fired == 0 || tr.Values != (sc.Count > 0) {
				t.Fatalf("trigger %+v from scalar %+v", tr, sc)
			}
		}
		WriteAggregateReport(io.Discard, r)
		var buf bytes.Buffer
		WriteAggregateComparison(&buf, CompareAggregate("a", s, "b", s, 0))
		if c := CompareAggregate("a", s, "b", s, 0); c.Regressions != 0 || c.Improvements != 0 {
			t.Fatalf("a summary against itself: %d regressions", c.Regressions)
		}
	})
}
