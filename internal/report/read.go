package report

import (
	"io"
	"os"
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
}

// Result is what a read of one trace found.
type Result struct {
	Health Health  `json:"health"`
	Meta   *Meta   `json:"meta,omitempty"`
	Report *Report `json:"report,omitempty"`
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
	co := checkOptions{maxLineBytes: opts.MaxLineBytes, progress: opts.Progress}
	var b *reportBuilder
	if opts.Report {
		b = newReportBuilder()
		co.observe = b.event
	}
	a, err := check(r, co)
	if err != nil {
		return nil, err
	}
	res := &Result{Health: a.health, Meta: a.meta}
	if b != nil && a.meta != nil && !a.fatal {
		res.Report = b.build(a, a.lt)
	}
	return res, nil
}
