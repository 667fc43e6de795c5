package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/htmlview"
	"github.com/candle-trace/candle-trace/internal/report/text"
)

// viewOutput is where the page of a trace goes without --output: beside
// the trace, with .html for its extension.
func viewOutput(trace string) string {
	return strings.TrimSuffix(trace, ".jsonl") + ".html"
}

func viewCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("view", stderr)
	out := fs.String("output", "", "the HTML file to write (default: TRACE with .html)")
	fs.StringVar(out, "o", "", "short for --output")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) != 1 {
		fmt.Fprintln(stderr, "candle-trace view: give exactly one trace")
		return ExitUsage
	}
	p := paths[0]
	dst := *out
	if dst == "" {
		if p == "-" {
			fmt.Fprintln(stderr, "candle-trace view: a trace on standard input needs --output")
			return ExitUsage
		}
		dst = viewOutput(p)
	}
	opts := htmlview.Options{Progress: progress(stderr, p)}
	var page *htmlview.Page
	if p == "-" {
		page, err = htmlview.Build(stdinReader(), "-", opts)
	} else {
		page, err = htmlview.BuildFile(p, opts)
	}
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace view: %v\n", err)
		return ExitProblem
	}
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
	err = page.WriteHTML(bw)
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
