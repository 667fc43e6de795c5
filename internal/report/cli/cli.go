// Package cli is the candle-trace command line: argument handling and
// output around the layers of internal/report (trace, health, analysis and
// the outputs text, compare, aggsummary, chrome), so that cmd/candle-trace
// stays a one-liner and the commands can be tested in-process. It is the top
// layer: nothing below imports it.
package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/candle-trace/candle-trace/internal/job"
	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/text"
	"github.com/candle-trace/candle-trace/internal/runner"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitProblem = 1 // a trace failed validation or could not be read
	ExitUsage   = 2
)

const usage = `usage: candle-trace <command> [flags] TRACE...

commands:
  validate [--json] [--allow-partial] TRACE...
        check each trace against candle-graph's parse rules and health
        analysis; exit 0 only if every trace is structurally valid and
        complete (--allow-partial: a cut, unterminated or failed capture
        passes if what was written is valid)
  report [--json] TRACE
        where the captured step spent its time, device idle time, memory
        peak, gradients, tensor statistics and an overhead analysis; exit 0
        whenever the trace could be read (its health is part of the report)
  report [--json] [--threshold PCT] RANK_TRACE RANK_TRACE...
        the job view of a multi-rank job: ranks on one clock (wall clocks
        refined by the collectives' ends), per-rank update, waiting and
        busy time per phase, who entered each collective last, and a
        straggler verdict (PCT: how much of their update the others must
        wait, default 5)
  compare [--json] [--force] [--threshold PCT] A B
        B against A: per span and op name count, totals, delta and ratio;
        measured region; memory peaks; gradient norm relative error and
        state changes; names only in one. Refuses (exit 1) traces whose
        comparison_identity differ in anything but implementation_id and
        pair_id, or that lack one, unless --force. ! marks changes beyond
        PCT percent (default 5).
  export [--format chrome] [-o OUT] TRACE
        Chrome Trace Event JSON for ui.perfetto.dev or chrome://tracing:
        spans and ops per thread, device intervals per stream, memory
        counters, edges as flows; a partial trace exports too
  export --format otlp [--endpoint URL] [--service-name NAME]
         [--header KEY=VALUE]... [--timeout DUR] TRACE|SUMMARY
        send to an OpenTelemetry Collector over OTLP/HTTP: a trace as spans
        (ops and device intervals as child spans), an aggregate summary as
        metrics (a histogram per span name, gauges for scalars); URL
        defaults to $OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318;
        exit 1 when the collector cannot be reached or refuses
  merge [-o OUT] RANK_TRACE...
        one Chrome trace for a multi-process job: a process per rank
        (meta.process.rank, else file order), aligned by each trace's
        meta.clock.wall_unix_ns_at_open, refined by the ends of the
        collectives every rank shares
  view [--output FILE] [--threshold PCT] TRACE [B]
        one self-contained HTML page (no network needed) to open in a
        browser: health verdict, overhead analysis, top spans and ops, a
        zoomable timeline of the update, the memory curve with the peak
        and what was live there, gradients and tensor statistics
        (default FILE: TRACE with .html). With two traces: B against A as
        compare sets them (PCT as there), then each trace's own views;
        an aggregate SUMMARY: its distributions, categories and scalars

  run [--capture-step N] [--output PATTERN] [--match PATTERNS]
      [--device-collect C] [--aggregate PATH] -- COMMAND ARGS...
        run COMMAND with the capture set up (a Python command: the PyTorch
        integration, no change to the script; any other: the LD_PRELOAD
        drop-in), then say where each trace is and whether it is valid;
        returns COMMAND's exit status (candle-trace run --help)
  run --watch FOLDER [--max-traces N] [--no-flight-recorder] -- COMMAND ARGS...
        a Python command with no capture step: the updates that are slow,
        turn NaN or raise are written to FOLDER as they happen

aggregate summaries (candle-trace/aggregate/1, told from traces by content):
  report [--json] [--category NAME=CAT]... [--categories FILE]
         [--threshold PCT] SUMMARY
        spans by total time (count, total, mean, p50/p95/p99, share) and
        the overhead analysis: is "compute dominates" corroborated or
        falsified? Names go into compute, data, transfer, other by default
        words (forward, backward, optimizer; data, dataloader, collate; to,
        copy, h2d, d2h, transfer) or the step tag; ignore leaves one out.
        PCT: compute share above which compute dominates (default 50)
  report [--json] RANK_SUMMARY RANK_SUMMARY...
        a job's ranks side by side: per span name the job's count, total,
        p50, p95, max (histograms added up), each rank's p50 and max, the
        slowest rank and the p50 spread
  compare [--json] [--threshold PCT] [--fail-on-regression] A B
        per span name deltas of count, total, p50 and p95; ! flags a p50
        that rose by more than PCT percent (default 10); exit 1 on any with
        --fail-on-regression

TRACE "-" reads standard input; OUT "-" or absent writes standard output.
`

// DefaultMemoryLimit is the soft heap limit the commands run under unless
// GOMEMLIMIT says otherwise. The reader's live state is bounded by spans
// and summaries, but with the default GOGC the heap may grow to twice that
// before a collection; the limit makes the collector work harder instead,
// which keeps a 1 GB trace well inside 256 MiB resident.
const DefaultMemoryLimit = 160 << 20

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(DefaultMemoryLimit)
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	switch args[0] {
	case "validate":
		return validate(args[1:], stdout, stderr)
	case "report", "compare":
		// An aggregate summary is told from a trace by its content.
		if code, ok := aggregateDispatch(args[0], args[1:], stdout, stderr); ok {
			return code
		}
		if args[0] == "report" {
			return reportCmd(args[1:], stdout, stderr)
		}
		return compareCmd(args[1:], stdout, stderr)
	case "export":
		return exportCmd(args[1:], stdout, stderr)
	case "merge":
		return mergeCmd(args[1:], stdout, stderr)
	case "run":
		return runner.Main(args[1:], stdout, stderr)
	case "view":
		return viewCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	default:
		fmt.Fprintf(stderr, "candle-trace: unknown command %q\n\n%s", args[0], usage)
		return ExitUsage
	}
}

// parse parses flags anywhere among the arguments ("validate a.jsonl
// --json" works as well as "validate --json a.jsonl"); "--" ends flags.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	return pos, nil
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("candle-trace "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

type validateResult struct {
	Path   string         `json:"path"`
	OK     bool           `json:"ok"`
	Error  string         `json:"error,omitempty"`
	Health *health.Health `json:"health,omitempty"`
}

func validate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("validate", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	allowPartial := fs.Bool("allow-partial", false, "accept a cut, unterminated or failed capture when what was written is valid")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "candle-trace validate: no trace given")
		return ExitUsage
	}
	allOK := true
	var results []validateResult
	for _, p := range paths {
		res, err := analyze(p, analysis.Options{Progress: progress(stderr, p)})
		vr := validateResult{Path: p}
		if err != nil {
			vr.Error = err.Error()
		} else {
			vr.Health = &res.Health
			vr.OK = res.Health.OK(*allowPartial)
		}
		allOK = allOK && vr.OK
		if *asJSON {
			results = append(results, vr)
			continue
		}
		if err != nil {
			fmt.Fprintf(stdout, "%s: FAIL (%v)\n", p, err)
			continue
		}
		text.WriteHealth(stdout, p, &res.Health, *allowPartial)
	}
	if *asJSON {
		writeJSON(stdout, struct {
			OK     bool             `json:"ok"`
			Traces []validateResult `json:"traces"`
		}{allOK, results})
	}
	if !allOK {
		return ExitProblem
	}
	return ExitOK
}

func reportCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("report", stderr)
	asJSON := fs.Bool("json", false, "print one JSON document for machines")
	waitPct := fs.Float64("threshold", job.DefaultWaitThreshold, "job view: the share (percent) of their update the other ranks must wait for a straggler")
	paths, err := parse(fs, args)
	if err != nil {
		return ExitUsage
	}
	if len(paths) > 1 { // the traces of a job's ranks
		return jobReportCmd(paths, *asJSON, *waitPct, stdout, stderr)
	}
	if len(paths) != 1 {
		fmt.Fprintln(stderr, "candle-trace report: give exactly one trace")
		return ExitUsage
	}
	p := paths[0]
	res, err := analyze(p, analysis.Options{Report: true, Progress: progress(stderr, p)})
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace report: %v\n", err)
		return ExitProblem
	}
	if *asJSON {
		writeJSON(stdout, struct {
			Path string `json:"path"`
			*analysis.Result
		}{p, res})
	} else {
		text.WriteReport(stdout, p, res)
	}
	if res.Report == nil {
		return ExitProblem
	}
	return ExitOK
}

// analyze reads a trace file, or standard input for "-".
func analyze(path string, opts analysis.Options) (*analysis.Result, error) {
	if path == "-" {
		return analysis.Analyze(stdinReader(), opts)
	}
	return analysis.AnalyzeFile(path, opts)
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(w, "{\"error\": %q}\n", err.Error())
	}
}

// progress returns a callback that shows a progress line on stderr when it
// is a terminal and the read has taken longer than two seconds.
func progress(stderr io.Writer, path string) func(int64) {
	f, ok := stderr.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	var size int64
	if st, err := os.Stat(path); err == nil {
		size = st.Size()
	}
	start := time.Now()
	return func(n int64) {
		if time.Since(start) < 2*time.Second {
			return
		}
		line := fmt.Sprintf("%s: %s read", path, text.FormatBytes(uint64(n)))
		if size > 0 {
			line += fmt.Sprintf(" (%.0f%%)", 100*float64(n)/float64(size))
		}
		fmt.Fprintf(f, "\r%s%s", line, strings.Repeat(" ", 8))
	}
}
