package cli

import (
	"fmt"
	"io"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/compare"
	"github.com/candle-trace/candle-trace/internal/report/text"
)

func compareCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("compare", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	force := fs.Bool("force", false, "compare even when the comparison identities differ or are missing")
	threshold := fs.Float64("threshold", 100*compare.DefaultCompareThreshold, "mark time ratios and gradient-norm errors beyond this `PCT` percent")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) != 2 {
		fmt.Fprintln(stderr, "candle-trace compare: give two traces, A and B")
		return ExitUsage
	}
	if *threshold <= 0 {
		fmt.Fprintln(stderr, "candle-trace compare: --threshold must be a positive percentage")
		return ExitUsage
	}
	var results [2]*analysis.Result
	for i, p := range paths {
		res, err := analyze(p, analysis.Options{Report: true, Progress: progress(stderr, p)})
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace compare: %v\n", err)
			return ExitProblem
		}
		if res.Report == nil {
			fmt.Fprintf(stderr, "candle-trace compare: %s cannot be read:\n", p)
			text.WriteHealth(stderr, p, &res.Health, true)
			return ExitProblem
		}
		results[i] = res
	}
	c := compare.Compare(paths[0], results[0], paths[1], results[1], *threshold/100)
	c.Forced = *force && !c.IdentityComparable
	refused := !c.IdentityComparable && !*force
	if *asJSON {
		writeJSON(stdout, struct {
			Refused bool `json:"refused"`
			*compare.Comparison
		}{refused, c})
	}
	if refused {
		if !*asJSON {
			compare.WriteIdentityRefusal(stderr, c)
		} else {
			fmt.Fprintf(stderr, "candle-trace compare: refused: %s (--force compares anyway)\n", c.IdentityProblem)
		}
		return ExitProblem
	}
	if !*asJSON {
		compare.WriteComparison(stdout, c)
	}
	return ExitOK
}
