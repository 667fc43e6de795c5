package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/otlp"
	"github.com/candle-trace/candle-trace/internal/otlp/traces"
)

// `candle-trace export --format otlp` sends a trace (as spans) or an
// aggregate summary (as metrics) to an OpenTelemetry Collector; see
// internal/otlp, internal/otlp/traces and docs/otlp.md.

// otlpFlags are export's flags for --format otlp.
type otlpFlags struct {
	endpoint, service *string
	headers           headerFlag
	timeout           *time.Duration
}

// headerFlag collects repeated --header KEY=VALUE.
type headerFlag map[string]string

func (h headerFlag) String() string { return "" }

func (h headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	h[strings.TrimSpace(k)] = val
	return nil
}

func addOTLPFlags(fs *flag.FlagSet) *otlpFlags {
	def := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if def == "" {
		def = otlp.DefaultEndpoint
	}
	f := &otlpFlags{headers: headerFlag{}}
	f.endpoint = fs.String("endpoint", def, "otlp: the collector's OTLP/HTTP `URL` (/v1/traces or /v1/metrics is appended); default $OTEL_EXPORTER_OTLP_ENDPOINT, else "+otlp.DefaultEndpoint)
	f.service = fs.String("service-name", otlp.DefaultServiceName, "otlp: the resource's service.name")
	fs.Var(f.headers, "header", "otlp: `KEY=VALUE` sent with every request (repeatable), e.g. an Authorization token")
	f.timeout = fs.Duration("timeout", otlp.DefaultTimeout, "otlp: how long one request may take")
	return f
}

func exportOTLP(path string, f *otlpFlags, stderr io.Writer) int {
	client, err := otlp.NewClient(*f.endpoint, otlp.ClientOptions{Headers: f.headers, Timeout: *f.timeout})
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace export: %v\n", err)
		return ExitUsage
	}
	// Ctrl-C stops the export between requests, not mid-line.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if isSummary(path) {
		return exportSummaryOTLP(ctx, path, client, f, stderr)
	}
	start := time.Now()
	var res *traces.Result
	opts := traces.Options{ServiceName: *f.service}
	if path == "-" {
		res, err = traces.Export(ctx, stdinReader(), client, opts)
	} else {
		res, err = traces.ExportFile(ctx, path, client, opts)
	}
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace export: %s: %v\n", path, err)
		return ExitProblem
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(stderr, "%s: %d spans (%d spans, %d ops, %d device intervals) in %s from %d lines, %.0f spans/s; trace id %s\n",
		client.URL(otlp.Traces), res.Spans, res.Spans-res.Ops-res.DeviceIntervals, res.Ops, res.DeviceIntervals, plural(res.Requests, "request"), res.Stream.Lines, float64(res.Spans)/max(secs, 1e-9), res.TraceID)
	if res.JobID != "" {
		// The trace id is the job's: say so, so that the other ranks' exports are looked for there.
		fmt.Fprintf(stderr, "  %s: job %s: the trace id of every rank of the job that captured %s\n", path, res.JobID, res.Meta.CorrelationID)
	}
	if res.Anchor != traces.AnchorWallClock {
		fmt.Fprintf(stderr, "  %s: no meta.clock.wall_unix_ns_at_open; times are anchored at %s\n", path, res.Anchor)
	}
	if res.UnalignedIntervals > 0 {
		fmt.Fprintf(stderr, "  %s: %d device intervals on a device clock left out (not aligned with the host)\n", path, res.UnalignedIntervals)
	}
	st := res.Stream
	code := ExitOK
	switch {
	case st.Stop != nil:
		fmt.Fprintf(stderr, "  %s: stopped at line %d: %s: %s (exported what came before)\n", path, st.Stop.Line, st.Stop.Code, st.Stop.Message)
		code = ExitProblem
	case st.CutLine > 0:
		fmt.Fprintf(stderr, "  %s: partial trace, line %d cut short; exported to the cut\n", path, st.CutLine)
	case st.Incomplete:
		fmt.Fprintf(stderr, "  %s: partial trace (no terminal record)\n", path)
	}
	if res.OpenSpans > 0 {
		fmt.Fprintf(stderr, "  %s: %d open spans end at the last timestamp (candle.open, status error)\n", path, res.OpenSpans)
	}
	if res.Rejected > 0 {
		fmt.Fprintf(stderr, "candle-trace export: the collector kept all but %d spans: %s\n", res.Rejected, res.RejectedMessage)
		code = ExitProblem
	}
	return code
}

func exportSummaryOTLP(ctx context.Context, path string, client *otlp.Client, f *otlpFlags, stderr io.Writer) int {
	var s *aggregate.Summary
	var err error
	if path == "-" {
		s, err = aggregate.Read(stdinReader())
	} else {
		s, err = aggregate.ReadFile(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace export: %s: %v\n", path, err)
		return ExitProblem
	}
	res, err := otlp.ExportSummary(ctx, s, client, otlp.MetricsOptions{ServiceName: *f.service})
	if err != nil {
		fmt.Fprintf(stderr, "candle-trace export: %s: %v\n", path, err)
		return ExitProblem
	}
	fmt.Fprintf(stderr, "%s: %d metrics, %d data points from summary %d (%d span names, %d scalars), run %s\n",
		client.URL(otlp.Metrics), res.Metrics, res.DataPoints, s.Sequence, len(s.Spans), len(s.Scalars), otlp.SummaryRunID(s))
	if res.Rejected > 0 {
		fmt.Fprintf(stderr, "candle-trace export: the collector kept all but %d data points: %s\n", res.Rejected, res.RejectedMessage)
		return ExitProblem
	}
	return ExitOK
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
