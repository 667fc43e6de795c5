package job

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"text/tabwriter"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// RankSummaries is the whole-run summaries (candle-trace/aggregate/1) of a
// job's ranks side by side: per span name the job's statistics (the ranks'
// histograms added up) and each rank's.
type RankSummaries struct {
	Ranks []int64   `json:"ranks"`
	Paths []string  `json:"paths"`
	Rows  []RankRow `json:"rows"`
	Notes []string  `json:"notes,omitempty"`
	sums  []*aggregate.Summary
}

// RankRow is one (name, step): the job's and each rank's numbers, in the
// order of Ranks (0 where a rank never saw the name).
type RankRow struct {
	Name    string   `json:"name"`
	Step    string   `json:"step,omitempty"`
	Count   uint64   `json:"count"`
	TotalNS uint64   `json:"total_ns"`
	P50NS   uint64   `json:"p50_ns"`
	P95NS   uint64   `json:"p95_ns"`
	MaxNS   uint64   `json:"max_ns"`
	Counts  []uint64 `json:"rank_counts"`
	P50s    []uint64 `json:"rank_p50_ns"`
	Maxes   []uint64 `json:"rank_max_ns"`
	// SlowestRank has the largest p50 (ties: the largest max); SpreadPct is
	// how much larger its p50 is than the smallest rank's.
	SlowestRank int64   `json:"slowest_rank"`
	SpreadPct   float64 `json:"p50_spread_pct"`
}

// MergeSummaries puts the summaries of a job's ranks side by side. A rank
// is its run.tags "rank" (the binding's tag under torchrun), else its
// position; two summaries of one rank are refused.
func MergeSummaries(paths []string, sums []*aggregate.Summary) (*RankSummaries, error) {
	type ranked struct {
		rank int64
		path string
		s    *aggregate.Summary
	}
	var in []ranked
	seen := map[int64]string{}
	for i, s := range sums {
		r := int64(i)
		if v, err := strconv.ParseInt(s.Run.Tags["rank"], 10, 64); err == nil && v >= 0 {
			r = v
		}
		if prev, dup := seen[r]; dup {
			return nil, fmt.Errorf("%s and %s both are rank %d (run.tags.rank, else file order); give one summary per rank", prev, paths[i], r)
		}
		seen[r] = paths[i]
		in = append(in, ranked{r, paths[i], s})
	}
	sort.SliceStable(in, func(i, j int) bool { return in[i].rank < in[j].rank })
	out := &RankSummaries{}
	type key struct{ name, step string }
	rows := map[key]*RankRow{}
	merged := map[key]*aggregate.SpanStats{}
	var order []key
	for k, r := range in {
		out.Ranks = append(out.Ranks, r.rank)
		out.Paths = append(out.Paths, r.path)
		out.sums = append(out.sums, r.s)
		if r.s.Run.Entrypoint != in[0].s.Run.Entrypoint {
			out.Notes = append(out.Notes, fmt.Sprintf("rank %d ran %s, rank %d %s", r.rank, r.s.Run.Entrypoint, in[0].rank, in[0].s.Run.Entrypoint))
		}
		for _, sp := range r.s.Spans {
			kk := key{sp.Name, sp.Step}
			row, ok := rows[kk]
			if !ok {
				n := len(in)
				row = &RankRow{Name: sp.Name, Step: sp.Step, Counts: make([]uint64, n), P50s: make([]uint64, n), Maxes: make([]uint64, n)}
				rows[kk] = row
				merged[kk] = &aggregate.SpanStats{Name: sp.Name, Step: sp.Step, MinNS: sp.MinNS}
				order = append(order, kk)
			}
			row.Counts[k], row.P50s[k], row.Maxes[k] = sp.Count, sp.P50NS, sp.MaxNS
			addStats(merged[kk], &sp)
		}
	}
	for _, kk := range order {
		row, m := rows[kk], merged[kk]
		row.Count, row.TotalNS, row.MaxNS = m.Count, m.TotalNS, m.MaxNS
		row.P50NS, row.P95NS = m.Percentile(50), m.Percentile(95)
		slow, fast := 0, -1
		for k := range out.Ranks {
			if row.Counts[k] == 0 {
				continue
			}
			if row.P50s[k] > row.P50s[slow] || (row.P50s[k] == row.P50s[slow] && row.Maxes[k] > row.Maxes[slow]) || row.Counts[slow] == 0 {
				slow = k
			}
			if fast < 0 || row.P50s[k] < row.P50s[fast] {
				fast = k
			}
		}
		row.SlowestRank = out.Ranks[slow]
		if fast >= 0 {
			row.SpreadPct = pct(int64(row.P50s[slow]-row.P50s[fast]), int64(row.P50s[fast]))
		}
		out.Rows = append(out.Rows, *row)
	}
	sort.SliceStable(out.Rows, func(i, j int) bool { return out.Rows[i].TotalNS > out.Rows[j].TotalNS })
	return out, nil
}

// addStats folds one rank's statistics of a name into the job's: counts,
// totals and histogram buckets add up (every rank writes one layout).
func addStats(m *aggregate.SpanStats, s *aggregate.SpanStats) {
	if m.Count == 0 || s.MinNS < m.MinNS {
		m.MinNS = s.MinNS
	}
	m.MaxNS = max(m.MaxNS, s.MaxNS)
	m.Count += s.Count
	m.TotalNS += s.TotalNS
	counts := map[uint64]uint64{}
	for _, b := range m.Buckets {
		counts[b[0]] += b[1]
	}
	for _, b := range s.Buckets {
		counts[b[0]] += b[1]
	}
	m.Buckets = m.Buckets[:0]
	for i, c := range counts {
		m.Buckets = append(m.Buckets, [2]uint64{i, c})
	}
	sort.Slice(m.Buckets, func(i, j int) bool { return m.Buckets[i][0] < m.Buckets[j][0] })
}

// WriteSummaries prints the job's table: the job's count, total, p50, p95
// and max per span name, then each rank's p50 and max.
func WriteSummaries(w io.Writer, r *RankSummaries) {
	fmt.Fprintf(w, "Job: %d ranks' summaries (%s)\n", len(r.Ranks), r.sums[0].Run.Entrypoint)
	for k, p := range r.Paths {
		s := r.sums[k]
		fmt.Fprintf(w, "  rank %d: %s, window %s, sequence %d%s\n", r.Ranks[k], filepath.Base(p), ns(int64(s.Window.DurationNS)), s.Sequence, map[bool]string{true: ", final", false: ""}[s.Final])
	}
	fmt.Fprintln(w, "\nSpans by total time (JOB: every rank's observations; p50 within 3.1%)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "  NAME\tCOUNT\tTOTAL\tP50\tP95\tMAX\t"
	for _, rk := range r.Ranks {
		head += fmt.Sprintf("R%d P50\t", rk)
	}
	for _, rk := range r.Ranks {
		head += fmt.Sprintf("R%d MAX\t", rk)
	}
	fmt.Fprintln(tw, head+"SLOWEST\tSPREAD\t")
	for _, row := range r.Rows {
		name := row.Name
		if row.Step != "" {
			name += " [" + row.Step + "]"
		}
		line := fmt.Sprintf("  %s\t%d\t%s\t%s\t%s\t%s\t", name, row.Count, ns(int64(row.TotalNS)), ns(int64(row.P50NS)), ns(int64(row.P95NS)), ns(int64(row.MaxNS)))
		for _, v := range row.P50s {
			line += ns(int64(v)) + "\t"
		}
		for _, v := range row.Maxes {
			line += ns(int64(v)) + "\t"
		}
		fmt.Fprintf(tw, "%srank %d\t%+.1f%%\t\n", line, row.SlowestRank, row.SpreadPct)
	}
	tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}
