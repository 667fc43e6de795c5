package cli

import (
	"fmt"
	"io"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/job"
)

// jobReportCmd is `candle-trace report RANK_TRACE RANK_TRACE...`: the job
// view of a multi-rank job (package job).
func jobReportCmd(paths []string, asJSON bool, waitPct float64, stdout, stderr io.Writer) int {
	traces, err := job.ReadAll(paths, job.ForAnalysis)
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace report: %v\n", err)
		return ExitProblem
	}
	j, err := job.Analyze(traces, waitPct)
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace report: %v\n", err)
		return ExitProblem
	}
	if asJSON {
		writeJSON(stdout, j)
	} else {
		job.Write(stdout, j)
	}
	return ExitOK
}

// alignedOffsets are the merge's offsets per rank, refined by the
// collectives' end times; nil (the wall clocks alone) when the traces give
// nothing to refine them with, with the reason.
func alignedOffsets(paths []string) (map[int64]uint64, string) {
	traces, err := job.ReadAll(paths, job.ForClock)
	if err != nil {
		return nil, err.Error()
	}
	al := job.Align(traces)
	if al.Matched == 0 {
		return nil, ""
	}
	out := map[int64]uint64{}
	for _, c := range al.Clocks {
		out[c.Rank] = uint64(c.OffsetNS)
	}
	return out, fmt.Sprintf("clocks refined by the ends of %d collectives every rank shares", al.Matched)
}

// rankSummariesCmd is `candle-trace report SUMMARY SUMMARY...`: the whole-run
// summaries of a job's ranks side by side (job.MergeSummaries).
func rankSummariesCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("report", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	var sums []*aggregate.Summary
	for _, p := range paths {
		s, err := readSummary(p)
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace report: %s: %v\n", p, err)
			return ExitProblem
		}
		sums = append(sums, s)
	}
	r, err := job.MergeSummaries(paths, sums)
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace report: %v\n", err)
		return ExitProblem
	}
	if *asJSON {
		writeJSON(stdout, r)
	} else {
		job.WriteSummaries(stdout, r)
	}
	return ExitOK
}
