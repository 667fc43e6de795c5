package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/compare"

	"github.com/candle-trace/candle-trace/internal/report/htmlview"
	"github.com/candle-trace/candle-trace/internal/report/text"
)

// viewOutput is where the page goes without --output: beside the trace,
// with .html for its extension; for two traces beside B, naming A too.
func viewOutput(paths []string) string {
	b := strings.TrimSuffix(paths[len(paths)-1], ".jsonl")
	if len(paths) == 1 {
		return b + ".html"
	}
	return b + "-vs-" + strings.TrimSuffix(filepath.Base(paths[0]), ".jsonl") + ".html"
}

// page is what view writes: one trace's page or a comparison's.
type page interface{ WriteHTML(io.Writer) error }

// ViewMemoryLimit is view's soft heap limit (unless GOMEMLIMIT says
// otherwise): the page's rows live beside the checker's state, which on a
// 1 GB trace is already about 130 MB, so under DefaultMemoryLimit the
// collector ran almost without a break and doubled view's CPU time. At
// this limit a 1 GB trace stays near 220 MiB resident (BENCHMARKS.md).
const ViewMemoryLimit = 208 << 20

func viewCmd(args []string, stdout, stderr io.Writer) int {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(ViewMemoryLimit)
	}
	fs := newFlags("view", stderr)
	out := fs.String("output", "", "the HTML file to write (default: TRACE with .html)")
	fs.StringVar(out, "o", "", "short for --output")
	threshold := fs.Float64("threshold", 100*compare.DefaultCompareThreshold, "with two traces: mark changes beyond this `PCT` percent")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) != 1 && len(paths) != 2 {
		fmt.Fprintln(stderr, "candle-trace view: give one trace, or two (A B) to compare")
		return ExitUsage
	}
	if *threshold <= 0 {
		fmt.Fprintln(stderr, "candle-trace view: --threshold must be a positive percentage")
		return ExitUsage
	}
	dst := *out
	if dst == "" {
		for _, p := range paths {
			if p == "-" {
				fmt.Fprintln(stderr, "candle-trace view: a trace on standard input needs --output")
				return ExitUsage
			}
		}
		dst = viewOutput(paths)
	}
	if len(paths) == 1 && isSummary(paths[0]) {
		s, err := readSummary(paths[0])
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace view: %s: %v\n", paths[0], err)
			return ExitProblem
		}
		return writeView(htmlview.Aggregate(paths[0], s), dst, stdout, stderr)
	}
	var pages []*htmlview.Page
	for _, p := range paths {
		opts := htmlview.Options{Progress: progress(stderr, p)}
		var pg *htmlview.Page
		if p == "-" {
			pg, err = htmlview.Build(stdinReader(), "-", opts)
		} else {
			pg, err = htmlview.BuildFile(p, opts)
		}
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace view: %v\n", err)
			return ExitProblem
		}
		pages = append(pages, pg)
	}
	var doc page = pages[0]
	if len(pages) == 2 {
		doc = htmlview.Compare(pages[0], pages[1], *threshold/100)
	}
	return writeView(doc, dst, stdout, stderr)
}

// writeView writes the page to dst ("-": standard output) and says where.
func writeView(doc page, dst string, stdout, stderr io.Writer) int {
	var err error
	var w io.Writer = stdout
	var f *os.File
	if dst != "-" {
		if f, err = os.Create(dst); err != nil {
			fmt.Fprintf(stderr, "candle-trace view: %v\n", err)
			return ExitProblem
		}
		w = f
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	err = doc.WriteHTML(bw)
	if err == nil {
		err = bw.Flush()
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace view: write %s: %v\n", dst, err)
		return ExitProblem
	}
	if dst != "-" {
		size := int64(0)
		if st, err := os.Stat(dst); err == nil {
			size = st.Size()
		}
		fmt.Fprintf(stdout, "wrote %s (%s): open it in a browser\n", dst, text.FormatBytes(uint64(size)))
	}
	return ExitOK
}
