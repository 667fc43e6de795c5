package cli

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/report/aggsummary"
)

// report and compare accept a candle-trace/aggregate/1 summary as well as a
// JSONL trace; which one a file is, is decided by its first bytes
// (aggregate.IsSummary), never by its name.

// sniffBytes is how much of a file is read to tell a summary: the writer
// puts the schema first, within the first 50 bytes.
const sniffBytes = 4 << 10

// valueFlags are the flags of report and compare (both kinds) that take a
// value, so that the value is not taken for a path while looking for the
// paths before the flags are parsed.
var valueFlags = map[string]bool{"threshold": true, "category": true, "categories": true, "o": true, "format": true}

// positional returns the arguments that are not flags or flag values.
func positional(args []string) []string {
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(pos, args[i+1:]...)
		case a == "-" || !strings.HasPrefix(a, "-"):
			pos = append(pos, a)
		default:
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && valueFlags[name] {
				i++
			}
		}
	}
	return pos
}

// stdin is standard input once it has been peeked at through a buffer (a
// pipe cannot be rewound); nil until then.
var stdin *bufio.Reader

// stdinReader is what the commands read for "-".
func stdinReader() io.Reader {
	if stdin != nil {
		return stdin
	}
	return os.Stdin
}

// isSummary tells whether path (or "-") holds a summary. A file that
// cannot be read is not one: the trace reader then reports why.
func isSummary(path string) bool {
	buf := make([]byte, sniffBytes)
	if path == "-" {
		// A redirected file is read in place, so the trace reader can still
		// seek it; a pipe is peeked through a buffer.
		if off, err := os.Stdin.Seek(0, io.SeekCurrent); err == nil {
			n, _ := os.Stdin.ReadAt(buf, off)
			return aggregate.IsSummary(buf[:n])
		}
		if stdin == nil {
			stdin = bufio.NewReaderSize(os.Stdin, sniffBytes)
		}
		p, _ := stdin.Peek(sniffBytes)
		return aggregate.IsSummary(p)
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	n, _ := io.ReadFull(f, buf)
	return aggregate.IsSummary(buf[:n])
}

func readSummary(path string) (*aggregate.Summary, error) {
	if path == "-" {
		return aggregate.Read(stdinReader())
	}
	return aggregate.ReadFile(path)
}

// aggregateDispatch runs report or compare on summaries; handled is false
// when the arguments name traces.
func aggregateDispatch(cmd string, args []string, stdout, stderr io.Writer) (code int, handled bool) {
	pos := positional(args)
	if len(pos) == 0 {
		return 0, false
	}
	switch cmd {
	case "report":
		if !isSummary(pos[0]) {
			return 0, false
		}
		if len(pos) > 1 { // the summaries of a job's ranks (job.go)
			return rankSummariesCmd(args, stdout, stderr), true
		}
		return aggregateReportCmd(args, stdout, stderr), true
	case "compare":
		if len(pos) != 2 {
			return 0, false
		}
		a, b := isSummary(pos[0]), isSummary(pos[1])
		switch {
		case a && b:
			return aggregateCompareCmd(args, stdout, stderr), true
		case a != b:
			fmt.Fprintln(stderr, "candle-trace compare: one of A and B is an aggregate summary and the other a trace; compare two of a kind")
			return ExitUsage, true
		}
	}
	return 0, false
}

// categoryFlag collects repeated --category NAME=CAT.
type categoryFlag []aggsummary.CategoryRule

func (c *categoryFlag) String() string { return fmt.Sprint(*c) }

func (c *categoryFlag) Set(s string) error {
	r, err := aggsummary.ParseCategoryRule(s)
	if err != nil {
		return err
	}
	*c = append(*c, r)
	return nil
}

func aggregateReportCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("report", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	var rules categoryFlag
	fs.Var(&rules, "category", "put span `NAME=CATEGORY` (NAME may be a * pattern; categories compute, data, transfer, other, ignore or your own); repeatable, before --categories rules")
	file := fs.String("categories", "", "read NAME=CATEGORY rules from `FILE`, one a line (# comments)")
	threshold := fs.Float64("threshold", 100*aggsummary.DefaultComputeThreshold, "compute share in `PCT` percent above which compute dominates")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) != 1 {
		fmt.Fprintln(stderr, "candle-trace report: give exactly one summary")
		return ExitUsage
	}
	if *threshold <= 0 || *threshold >= 100 {
		fmt.Fprintln(stderr, "candle-trace report: --threshold must be a percentage between 0 and 100")
		return ExitUsage
	}
	all := []aggsummary.CategoryRule(rules)
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace report: %v\n", err)
			return ExitUsage
		}
		more, err := aggsummary.ReadCategoryRules(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace report: %s: %v\n", *file, err)
			return ExitUsage
		}
		all = append(all, more...)
	}
	s, err := readSummary(paths[0])
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace report: %s: %v\n", paths[0], err)
		return ExitProblem
	}
	r := aggsummary.AnalyzeAggregate(paths[0], s, aggsummary.NewCategorizer(all), *threshold/100)
	if *asJSON {
		writeJSON(stdout, r)
	} else {
		aggsummary.WriteAggregateReport(stdout, r)
	}
	return ExitOK
}

func aggregateCompareCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("compare", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	threshold := fs.Float64("threshold", 100*aggsummary.DefaultRegressionThreshold, "flag a p50 that moved by more than `PCT` percent")
	failOn := fs.Bool("fail-on-regression", false, "exit 1 when any p50 rose by more than the threshold")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) != 2 {
		fmt.Fprintln(stderr, "candle-trace compare: give two summaries, A and B")
		return ExitUsage
	}
	if *threshold <= 0 {
		fmt.Fprintln(stderr, "candle-trace compare: --threshold must be a positive percentage")
		return ExitUsage
	}
	var sums [2]*aggregate.Summary
	for i, p := range paths {
		if sums[i], err = readSummary(p); err != nil {
			fmt.Fprintf(stderr, "candle-trace compare: %s: %v\n", p, err)
			return ExitProblem
		}
	}
	c := aggsummary.CompareAggregate(paths[0], sums[0], paths[1], sums[1], *threshold/100)
	if *asJSON {
		writeJSON(stdout, c)
	} else {
		aggsummary.WriteAggregateComparison(stdout, c)
	}
	if *failOn && c.Regressions > 0 {
		return ExitProblem
	}
	return ExitOK
}

var _ flag.Value = (*categoryFlag)(nil)
