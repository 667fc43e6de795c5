package aggsummary

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

func readFixture(t *testing.T, name string) *aggregate.Summary {
	t.Helper()
	s, err := aggregate.ReadFile(filepath.Join(testutil.CorpusDir(t), name))
	require.NoError(t, err)
	return s
}

func TestCategorize(t *testing.T) {
	c := NewCategorizer([]CategoryRule{{"train_step", "ignore"}, {"log_*", "logging"}, {"log_metrics", "other"}})
	tests := []struct{ name, step, cat, src string }{
		{"train_step", "", "ignore", "rule"},
		{"log_metrics", "", "other", "rule"}, // an exact name before a pattern
		{"log_images", "", "logging", "rule"},
		{"mlp/forward", "forward", "compute", "name"},
		{"Model.Backward", "", "compute", "name"},
		{"optimizer.step", "", "compute", "name"},
		{"DataLoader.__next__", "", "data", "name"},
		{"collate_fn", "", "data", "name"},
		{"batch.to", "", "transfer", "name"},
		{"forward/h2d", "forward", "transfer", "name"}, // the last known word decides
		{"d2h_copy", "", "transfer", "name"},
		{"linear", "forward", "compute", "step"},
		{"sgd/step", "optimizer", "compute", "step"},
		{"train/step", "", "ignore", "name"}, // encloses the update's other spans
		{"Trainer.training_step", "", "ignore", "name"},
		{"epoch", "", "ignore", "name"},
		{"train/compile", "", "compile", "name"}, // torch.compile's, inside a forward or backward
		{"compile/forward", "forward", "compute", "name"},
		{"step/tokenize", "", "other", "default"}, // only the last word encloses
		{"tokenize", "", "other", "default"},
		{"total", "", "other", "default"}, // "to" is a word, not a prefix
	}
	for _, tc := range tests {
		cat, src := c.Categorize(tc.name, tc.step)
		assert.Equal(t, []string{tc.cat, tc.src}, []string{cat, src}, tc.name)
	}
}

func TestParseCategoryRules(t *testing.T) {
	rules, err := ReadCategoryRules(strings.NewReader("# mine\n\ntrain_step=ignore\n a=b=data \nlog_*=logging\n"))
	require.NoError(t, err)
	assert.Equal(t, []CategoryRule{{"train_step", "ignore"}, {"a=b", "data"}, {"log_*", "logging"}}, rules)
	for _, bad := range []string{"x", "=data", "x=", "x=two words", "[=data"} {
		_, err := ParseCategoryRule(bad)
		assert.Error(t, err, bad)
	}
	_, err = ReadCategoryRules(strings.NewReader("ok=data\nbad\n"))
	assert.ErrorContains(t, err, "line 2")
}

// By default a name ending in "step" with no step tag encloses the update
// and is ignored: train_step's 10 s leave 10 s, of which compute is 75%.
func TestAggregateAnalysisDefaultsIgnoreTheEnclosingStep(t *testing.T) {
	r := AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), nil, 0)
	assert.Equal(t, "corroborated", r.Analysis.Verdict)
	assert.Equal(t, uint64(10e9), r.Analysis.IgnoredNS)
	assert.Equal(t, 0.75, r.Analysis.ComputeShare)
	assert.Equal(t, []string{"train_step", "ignore", "name"}, []string{r.Spans[0].Name, r.Spans[0].Category, r.Spans[0].CategorySource})
}

// Mapped to "other", the enclosing train_step (10 of 20 s) counts twice, and
// compute — forward 3 + backward 4 + sgd 0.5 = 7.5 s — is 37.5%: falsified.
func TestAggregateAnalysisEnclosingStepAsOther(t *testing.T) {
	r := AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), NewCategorizer([]CategoryRule{{"train_step", CategoryOther}}), 0)
	assert.Equal(t, uint64(20e9), r.TotalNS)
	a := r.Analysis
	assert.Equal(t, AggregateAnalysis{
		Hypothesis: ComputeHypothesis, Threshold: 0.5, CategorizedNS: 20e9, ComputeNS: 7.5e9, ComputeShare: 0.375,
		OverheadNS: 12.5e9, OverheadShare: 0.625,
		Categories: []CategoryShare{
			{"other", 10.2e9, 0.51, 2}, {"compute", 7.5e9, 0.375, 3}, {"data", 1.9e9, 0.095, 1}, {"transfer", 0.4e9, 0.02, 1},
		},
		Verdict: "falsified",
		Explanation: "compute took 37.5% of 20.000 s categorized span time (<= 50.0%): overhead dominates, led by other at 51.0% " +
			"(spans in no category: map them with --category NAME=CAT, and a span that encloses others to ignore)",
	}, a)
}

// Ignoring train_step leaves 10 s: compute 75% > 50%, corroborated; the
// largest overhead is the loader's 1.9 s = 19%.
func TestAggregateAnalysisIgnore(t *testing.T) {
	cats := NewCategorizer([]CategoryRule{{"train_step", CategoryIgnore}})
	r := AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), cats, 0)
	a := r.Analysis
	assert.Equal(t, "corroborated", a.Verdict)
	assert.Equal(t, uint64(10e9), a.CategorizedNS)
	assert.Equal(t, uint64(10e9), a.IgnoredNS)
	assert.Equal(t, 0.75, a.ComputeShare)
	assert.Equal(t, []CategoryShare{{"compute", 7.5e9, 0.75, 3}, {"data", 1.9e9, 0.19, 1}, {"transfer", 0.4e9, 0.04, 1}, {"other", 0.2e9, 0.02, 1}}, a.Categories)
	assert.Equal(t, "compute took 75.0% of 10.000 s categorized span time (> 50.0%): compute dominates; the largest overhead is data at 19.0% "+
		"(the input pipeline: more loader workers, prefetching, pinned memory)", a.Explanation)

	// The table: by total, with shares of the 10 s and exact percentiles.
	var names []string
	for _, row := range r.Spans {
		names = append(names, row.Name)
	}
	assert.Equal(t, []string{"train_step", "mlp/backward", "mlp/forward", "dataloader/next", "sgd/step", "batch.to", "log_metrics"}, names)
	assert.Equal(t, AggregateRow{Name: "dataloader/next", Category: "data", CategorySource: "name", Count: 1000, TotalNS: 1.9e9, MeanNS: 1.9e6,
		MinNS: 1e6, P50NS: 1e6, P95NS: 1e7, P99NS: 1e7, MaxNS: 1e7, Share: 0.19}, r.Spans[3])
	assert.Equal(t, 0.0, r.Spans[0].Share)

	// A higher threshold turns the verdict.
	r = AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), cats, 0.8)
	assert.Equal(t, "falsified", r.Analysis.Verdict)
}

// A compiled model that recompiled: 6 of forward's 8 s were dynamo compiling
// (train/compile, inside forward). Compute is 8 - 6 + 2 (backward) = 4 s of
// 4 + 6 + 1 (data) = 11 s, 36.4%: the compiler, not compute, dominates.
func TestAggregateAnalysisMovesCompilationsOutOfCompute(t *testing.T) {
	a := aggregate.New()
	for _, sp := range []struct {
		name string
		step events.Step
		ns   uint64
	}{
		{"train/forward", events.StepForward, 2e9}, {"train/forward", events.StepForward, 6e9},
		{"train/compile", events.StepNone, 5.5e9}, {"train/compile", events.StepNone, 0.5e9},
		{"train/backward", events.StepBackward, 2e9}, {"train/data", events.StepNone, 1e9},
		{"train/step", events.StepNone, 10e9},
	} {
		require.NoError(t, a.ObserveSpan(sp.name, sp.step, sp.ns))
	}
	r := AnalyzeAggregate("c.json", a.Snapshot(), nil, 0)
	an := r.Analysis
	assert.Equal(t, uint64(11e9), an.CategorizedNS)
	assert.Equal(t, uint64(4e9), an.ComputeNS)
	assert.Equal(t, uint64(7e9), an.OverheadNS)
	assert.Equal(t, []CategoryShare{{"compile", 6e9, 6.0 / 11, 1}, {"compute", 4e9, 4.0 / 11, 2}, {"data", 1e9, 1.0 / 11, 1}}, an.Categories)
	assert.Equal(t, "falsified", an.Verdict)
	assert.Contains(t, an.Explanation, "overhead dominates, led by compile at 54.5% (torch.compile's compilations: the first one, then one per recompile")

	// Without a compute span to hold them, nothing is moved: they count as they are.
	b := aggregate.New()
	require.NoError(t, b.ObserveSpan("train/compile", events.StepNone, 3e9))
	require.NoError(t, b.ObserveSpan("train/data", events.StepNone, 1e9))
	an = AnalyzeAggregate("d.json", b.Snapshot(), nil, 0).Analysis
	assert.Equal(t, uint64(4e9), an.CategorizedNS)
	assert.Equal(t, uint64(0), an.ComputeNS)
}

func TestAggregateAnalysisEmpty(t *testing.T) {
	s := aggregate.New().Snapshot()
	r := AnalyzeAggregate("e.json", s, nil, 0)
	assert.Equal(t, "inconclusive", r.Analysis.Verdict)
	var buf bytes.Buffer
	WriteAggregateReport(&buf, r)
	assert.Contains(t, buf.String(), "verdict:    inconclusive")
}

func TestWriteAggregateReport(t *testing.T) {
	cats := NewCategorizer([]CategoryRule{{"train_step", CategoryIgnore}})
	var buf bytes.Buffer
	WriteAggregateReport(&buf, AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), cats, 0))
	out := buf.String()
	for _, want := range []string{
		"Summary a.json: candle-trace/aggregate/1, final (sequence 7)",
		"Run: mlp::train, phase train, device cuda:0, binding python",
		"Window: 25.000 s, from 2027-01-15T08:00:00.000Z; enabled 25.000 s in 1 period(s), enabled at the end",
		"  dataloader/next              data   1000    1.900 s    1.90 ms    1.00 ms   10.00 ms   10.00 ms   10.00 ms  19.0%\n",
		"  train_step                 ignore   1000   10.000 s   10.00 ms   10.00 ms   10.00 ms   10.00 ms   10.00 ms      -\n",
		"mlp/forward [forward",
		"  grad_norm    999   0.5  0.5  0.5   0.5         ! 1\n",
		"numbers:    categorized 10.000 s: compute 7.500 s = 75.0%, overhead 2.500 s = 25.0% (10.000 s ignored)",
		"threshold:  compute share > 50.0%",
		"verdict:    corroborated: compute took 75.0%",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "overflow")
}

// B against A: forward's p50 rose 16.7% (regression), the loader's fell
// 50% (improvement), batch.to rose 5% (below 10%: no flag).
func TestCompareAggregate(t *testing.T) {
	c := CompareAggregate("a.json", readFixture(t, "aggregate-a.json"), "b.json", readFixture(t, "aggregate-b.json"), 0)
	assert.Equal(t, 0.1, c.Threshold)
	assert.Equal(t, 1, c.Regressions)
	assert.Equal(t, 1, c.Improvements)
	assert.Empty(t, c.Notes)
	rows := map[string]AggregateDelta{}
	for _, d := range c.Spans {
		rows[d.Name] = d
	}
	f := rows["mlp/forward"]
	require.NotNil(t, f.P50Change)
	assert.InDelta(t, 1.0/6, *f.P50Change, 1e-12)
	assert.True(t, f.Regressed)
	assert.Equal(t, int64(0.5e9), f.TotalDelta)

	d := rows["dataloader/next"]
	assert.Equal(t, []uint64{1e6, 5e5}, []uint64{d.P50A, d.P50B})
	assert.Equal(t, -0.5, *d.P50Change)
	assert.Equal(t, 0.0, *d.P95Change)
	assert.True(t, d.Improved)
	assert.False(t, d.Regressed)
	assert.Equal(t, int64(-0.45e9), d.TotalDelta)

	b := rows["batch.to"]
	assert.InDelta(t, 0.05, *b.P50Change, 1e-12)
	assert.False(t, b.Regressed || b.Improved)

	assert.Equal(t, AggregateDelta{Name: "log_metrics", Only: "a", CountA: 10, CountDelta: -10, TotalA: 0.2e9, TotalDelta: -0.2e9, P50A: 2e7, P95A: 2e7}, rows["log_metrics"])
	assert.Equal(t, "b", rows["checkpoint"].Only)
	assert.False(t, rows["checkpoint"].Regressed)
	// Sorted by the larger total: train_step, then mlp/backward, ...
	assert.Equal(t, "train_step", c.Spans[0].Name)
	assert.Equal(t, "checkpoint", c.Spans[4].Name)

	// At 20% forward's +16.7% is no longer a regression.
	c = CompareAggregate("a.json", readFixture(t, "aggregate-a.json"), "b.json", readFixture(t, "aggregate-b.json"), 0.2)
	assert.Equal(t, 0, c.Regressions)
	assert.Equal(t, 1, c.Improvements)

	var buf bytes.Buffer
	WriteAggregateComparison(&buf, CompareAggregate("a.json", readFixture(t, "aggregate-a.json"), "b.json", readFixture(t, "aggregate-b.json"), 0))
	out := buf.String()
	assert.Contains(t, out, "1 regression(s), 1 improvement(s)\n")
	flags := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			flags[f[0]] = f[len(f)-1]
		}
	}
	assert.Equal(t, "!", flags["mlp/forward"])
	assert.Equal(t, "-", flags["dataloader/next"])
	assert.Equal(t, "+5.0%", flags["batch.to"])
	assert.Equal(t, "a", flags["log_metrics"])
	assert.Equal(t, "b", flags["checkpoint"])
	assert.Contains(t, out, "  mlp/forward [forward]       1000     1000    3.000 s    3.500 s  +500.00 ms    3.00 ms    3.50 ms  +16.7%")
}

// TestTriggersThatFired: the summary of a real candle_trace.torch.watch run
// (testdata/aggregate-triggers.py: update 12 stalls 1 s, the program asks
// at updates 20 and 24, update 27's loss is NaN; at most 4 traces) lists
// its triggers, each firing with its trace or why none.
func TestTriggersThatFired(t *testing.T) {
	s := readFixture(t, "aggregate-triggers.json")
	r := AnalyzeAggregate("t.json", s, nil, 0)
	require.Len(t, r.Triggers, 3)
	byName := map[string]Trigger{}
	for _, tr := range r.Triggers {
		byName[tr.Name] = tr
	}
	assert.Equal(t, []string{"non_finite", "slow", "user"}, []string{r.Triggers[0].Name, r.Triggers[1].Name, r.Triggers[2].Name})
	assert.Equal(t, Trigger{Name: "non_finite", Fired: 1, NonFinite: 1}, byName["non_finite"], "a NaN loss: fired once, no finite value")
	slow := byName["slow"]
	assert.Equal(t, uint64(1), slow.Fired)
	assert.True(t, slow.Values)
	assert.InDelta(t, 1.02, slow.Max, 0.05, "the stalled update's seconds: 1 s of sleep and a 20 ms update")
	user := byName["user"]
	assert.Equal(t, uint64(2), user.Fired)
	assert.Less(t, user.Max, 0.1, "the asked updates were ordinary ones")
	var buf bytes.Buffer
	WriteAggregateReport(&buf, r)
	out := buf.String()
	assert.Contains(t, out, "Triggers that fired")
	assert.Regexp(t, `\n  non_finite\s+1\s+-\s+-\s+-\s+-\s+! 1\s*\n`, out)
	assert.Regexp(t, `\n  slow\s+1\s+1\.02\d*\s`, out)
	assert.Regexp(t, `\n  user\s+2\s`, out)
	assert.Contains(t, out, "trigger/slow", "the scalars table still has the label")

	type row struct {
		update        uint64
		trigger, file string
	}
	var got []row
	for _, f := range r.Fired {
		got = append(got, row{f.Update, f.Trigger, f.Trace + f.NoTrace})
	}
	cap4 := "the run's cap of 4 traces was reached"
	assert.Equal(t, []row{{12, "slow", "traces/update-000012-slow.jsonl"}, {20, "user", "traces/update-000020-user.jsonl"},
		{24, "user", cap4}, {27, "non_finite", cap4}}, got)
	assert.Equal(t, float64(r.Fired[0].Value), slow.Max, "the firing's value is the scalar's")
	assert.Greater(t, float64(r.Fired[0].Value), r.Fired[0].Threshold)
	assert.Contains(t, out, "Triggers fired (4 listed):\n")
	assert.Regexp(t, `\n  update 12  slow  1\.02\d s > \d+\.\d\d ms  1\d+\.\d ms > .*\(.*median.*\)  -> traces/update-000012-slow\.jsonl\n`, out)
	assert.Contains(t, out, "\n  update 24  user  ")
	assert.Contains(t, out, "  checkpoint at 24  (no trace: "+cap4+")\n")
	assert.Contains(t, out, "\n  update 27  non_finite  NaN  loss nan  (no trace: "+cap4+")\n")

	// A summary without a watch has no section.
	buf.Reset()
	plain := AnalyzeAggregate("a.json", readFixture(t, "aggregate-a.json"), nil, 0)
	WriteAggregateReport(&buf, plain)
	assert.NotContains(t, buf.String(), "Triggers")
	assert.Equal(t, []Firing{}, plain.Fired, "an empty list in --json, not null")
}

func TestFiringValue(t *testing.T) {
	for _, tc := range []struct {
		f    aggregate.Firing
		want string
	}{
		{aggregate.Firing{Trigger: "slow", Value: 0.0681, Threshold: 0.0326}, "68.10 ms > 32.60 ms"},
		{aggregate.Firing{Trigger: "non_finite", Value: aggregate.TriggerValue(math.NaN())}, "NaN"},
		{aggregate.Firing{Trigger: "non_finite", Value: aggregate.TriggerValue(math.Inf(-1))}, "-Infinity"},
		{aggregate.Firing{Trigger: "exception"}, "-"},
		{aggregate.Firing{Trigger: "grad_norm", Value: 12.5, Threshold: 10}, "12.5 > 10"},
		{aggregate.Firing{Trigger: "user", Value: 0.0211478}, "0.0211478"},
	} {
		assert.Equal(t, tc.want, FiringValue(tc.f), "%+v", tc.f)
	}
}
