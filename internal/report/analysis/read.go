package analysis

import (
	"io"
	"os"

	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// Options tune a read. The zero value validates with the defaults.
type Options struct {
	// MaxLineBytes caps one line (DefaultMaxLineBytes when 0).
	MaxLineBytes int
	// Report also gathers the statistics of Result.Report.
	Report bool
	// Progress, when set, is called every ProgressEvery bytes with the
	// bytes read so far.
	Progress func(bytesRead int64)
	// Observe, when set, also sees every record the checker accepted, after
	// the report's own fold: an output that needs more detail than the
	// report's summaries (the HTML view's timeline) collects it here, in the
	// same single pass. The record lives in d until the next line.
	Observe func(k trace.Kind, d *trace.Decoder, line int)
}

// Result is what a read of one trace found.
type Result struct {
	Health health.Health `json:"health"`
	Meta   *trace.Meta   `json:"meta,omitempty"`
	Report *Report       `json:"report,omitempty"`
}

// AnalyzeFile reads the trace at path. The error is for I/O only: every
// problem with the content is an issue in Result.Health.
func AnalyzeFile(path string, opts Options) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Analyze(f, opts)
}

// Analyze reads one trace from r in a single streaming pass. When memory
// records turn out to be out of timestamp order and r is an io.ReadSeeker,
// it re-reads them in a second pass; other readers have them buffered.
func Analyze(r io.Reader, opts Options) (*Result, error) {
	co := health.Options{MaxLineBytes: opts.MaxLineBytes, Progress: opts.Progress}
	var b *reportBuilder
	if opts.Report {
		b = newReportBuilder()
		co.Observe = b.event
	}
	if extra := opts.Observe; extra != nil {
		fold := co.Observe
		co.Observe = func(k trace.Kind, d *trace.Decoder, line int) {
			if fold != nil {
				fold(k, d, line)
			}
			extra(k, d, line)
		}
	}
	a, err := health.Check(r, co)
	if err != nil {
		return nil, err
	}
	res := &Result{Health: a.Health, Meta: a.Meta}
	if b != nil && a.Meta != nil && !a.Fatal {
		res.Report = b.build(a, a.Memory)
	}
	return res, nil
}
