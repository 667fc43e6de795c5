package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/chrome"
	"github.com/candle-trace/candle-trace/internal/report/text"
)

func exportCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("export", stderr)
	format := fs.String("format", "chrome", "output `FORMAT`: chrome (Chrome Trace Event JSON, opened by ui.perfetto.dev and chrome://tracing) or otlp (sent to an OpenTelemetry Collector)")
	out := fs.String("o", "", "write to `FILE` (\"-\" or absent: standard output)")
	otlpf := addOTLPFlags(fs)
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if *format != "chrome" && *format != "otlp" {
		fmt.Fprintf(stderr, "candle-trace export: unknown --format %q; the formats are chrome and otlp\n", *format)
		return ExitUsage
	}
	if len(paths) != 1 {
		fmt.Fprintln(stderr, "candle-trace export: give exactly one trace")
		return ExitUsage
	}
	p := paths[0]
	if *format == "otlp" {
		if *out != "" {
			fmt.Fprintln(stderr, "candle-trace export: -o is for --format chrome; --format otlp sends to --endpoint")
			return ExitUsage
		}
		return exportOTLP(p, otlpf, stderr)
	}
	var res *chrome.ExportResult
	code := writeOutput(*out, stdout, stderr, "export", func(w *chrome.ChromeWriter) (map[string]string, error) {
		var err error
		if p == "-" {
			res, err = chrome.ExportChrome(os.Stdin, w, chrome.ChromeOptions{})
		} else {
			res, err = chrome.ExportChromeFile(p, w, chrome.ChromeOptions{})
		}
		if err != nil {
			return nil, err
		}
		return map[string]string{"source": p, "run_id": res.Meta.RunID, "schema": res.Meta.Schema, "exported_by": "candle-trace export"}, nil
	}, func(w *chrome.ChromeWriter) {
		fmt.Fprintf(stderr, "%s: %d trace events (%s) from %d lines, %d spans\n", dest(*out), w.Events(), phaseCounts(w.Phases()), res.Lines, res.Spans)
		notePartial(stderr, p, res)
	})
	if code == ExitOK && res.Stop != nil {
		return ExitProblem
	}
	return code
}

func mergeCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("merge", stderr)
	out := fs.String("o", "", "write to `FILE` (\"-\" or absent: standard output)")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "candle-trace merge: give the traces of the job's ranks")
		return ExitUsage
	}
	var res *chrome.MergeResult
	offsets, refined := alignedOffsets(paths) // job clock (package job), else wall clocks
	code := writeOutput(*out, stdout, stderr, "merge", func(w *chrome.ChromeWriter) (map[string]string, error) {
		var err error
		if res, err = chrome.MergeWith(paths, w, offsets); err != nil {
			return nil, err
		}
		other := map[string]string{"exported_by": "candle-trace merge", "ranks": fmt.Sprint(len(res.Inputs))}
		for _, in := range res.Inputs {
			other[fmt.Sprintf("rank %d", in.Rank)] = fmt.Sprintf("%s (pid %d, offset %d ns, rank from %s)", in.Path, in.HostPID, in.OffsetNS, in.RankFrom)
		}
		return other, nil
	}, func(w *chrome.ChromeWriter) {
		fmt.Fprintf(stderr, "%s: %d trace events (%s) from %d ranks\n", dest(*out), w.Events(), phaseCounts(w.Phases()), len(res.Inputs))
		if offsets != nil {
			fmt.Fprintf(stderr, "  %s\n", refined)
		}
		for _, in := range res.Inputs {
			fmt.Fprintf(stderr, "  rank %d (%s): %s, pid %d, +%s\n", in.Rank, in.RankFrom, in.Path, in.HostPID, text.FormatNS(float64(in.OffsetNS)))
			notePartial(stderr, in.Path, in.Result)
		}
		for _, warn := range res.Warnings {
			fmt.Fprintf(stderr, "  warning: %s\n", warn)
		}
	})
	if code == ExitOK {
		for _, in := range res.Inputs {
			if in.Result.Stop != nil {
				return ExitProblem
			}
		}
	}
	return code
}

// writeOutput runs fill on a Chrome writer to path (through a temporary
// file renamed at the end, so a failed run leaves no half file) or to
// stdout, then summary.
func writeOutput(path string, stdout, stderr io.Writer, cmd string, fill func(*chrome.ChromeWriter) (map[string]string, error), summary func(*chrome.ChromeWriter)) int {
	var dst io.Writer = stdout
	var tmp *os.File
	if path != "" && path != "-" {
		var err error
		tmp, err = os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
		if err != nil {
			fmt.Fprintf(stderr, "candle-trace %s: %v\n", cmd, err)
			return ExitProblem
		}
		defer os.Remove(tmp.Name()) // a no-op once renamed
		dst = tmp
	}
	w := chrome.NewChromeWriter(dst)
	other, err := fill(w)
	if err == nil {
		err = w.Close(other)
	}
	if tmp != nil {
		// CreateTemp makes the file private; the export is an ordinary file.
		if cerr := tmp.Chmod(0o644); err == nil {
			err = cerr
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace %s: %v\n", cmd, err)
		return ExitProblem
	}
	summary(w)
	return ExitOK
}

func dest(path string) string {
	if path == "" || path == "-" {
		return "stdout"
	}
	return path
}

func phaseCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func notePartial(stderr io.Writer, path string, r *chrome.ExportResult) {
	switch {
	case r.Stop != nil:
		fmt.Fprintf(stderr, "  %s: stopped at line %d: %s: %s (exported what came before)\n", path, r.Stop.Line, r.Stop.Code, r.Stop.Message)
	case r.CutLine > 0:
		fmt.Fprintf(stderr, "  %s: partial trace, line %d cut short; exported to the cut\n", path, r.CutLine)
	case r.Incomplete:
		fmt.Fprintf(stderr, "  %s: partial trace (no terminal record)\n", path)
	}
	if r.OpenSpans > 0 {
		fmt.Fprintf(stderr, "  %s: %d open spans end at the last timestamp, %s (args.open)\n", path, r.OpenSpans, text.FormatNS(float64(r.LastNS)))
	}
	if r.DroppedFlows > 0 {
		fmt.Fprintf(stderr, "  %s: %d edges left out: an endpoint never appeared\n", path, r.DroppedFlows)
	}
}
