package report

import (
	"errors"
	"fmt"
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

// ProgressEvery is how often Options.Progress is called.
const ProgressEvery = 16 << 20

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
	seeker, _ := r.(io.ReadSeeker)
	var origin int64
	if seeker != nil {
		var err error
		if origin, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			seeker = nil
		}
	}
	a := newAnalyzer(opts)
	a.mem.buffer = seeker == nil
	lines, total, err := a.readAll(r)
	if err != nil {
		return nil, err
	}
	var replayed []memRecord
	if !a.fatal && a.mem.needsReplay() {
		if _, err := seeker.Seek(origin, io.SeekStart); err != nil {
			return nil, fmt.Errorf("re-read memory records: %w", err)
		}
		if replayed, err = replayMemory(seeker, a.opts.MaxLineBytes, lines); err != nil {
			return nil, fmt.Errorf("re-read memory records: %w", err)
		}
	}
	var lt *lifetimes
	if !a.fatal {
		lt = a.mem.finish(replayed)
	}
	h := a.finish(lt)
	h.Lines, h.Bytes = lines, total
	res := &Result{Health: h, Meta: a.meta}
	if a.rep != nil && a.meta != nil && !a.fatal {
		res.Report = a.rep.build(a, lt)
	}
	return res, nil
}

// readAll is the main pass. It stops at the first problem that makes the
// file unreadable for candle-graph, and tolerates a cut last line when no
// terminal record has been read.
func (a *analyzer) readAll(r io.Reader) (lines int, total int64, err error) {
	st := newEventStream(r, a.opts.MaxLineBytes)
	nextProgress := int64(ProgressEvery)
	for !a.fatal {
		k, ok := st.next()
		if a.opts.Progress != nil && st.lr.read >= nextProgress {
			a.opts.Progress(st.lr.read)
			nextProgress = st.lr.read + ProgressEvery
		}
		if !ok {
			break
		}
		a.event(&st.d, k, st.line)
	}
	if st.err != nil {
		return st.lr.n, st.lr.read, st.err
	}
	if st.stop != nil {
		a.stop(st.stop.Line, st.stop.Code, st.stop.Message)
	}
	a.cutLine = st.cutLine
	return st.lr.n, st.lr.read, nil
}

func codeOf(err error) string {
	var de *decodeError
	if errors.As(err, &de) {
		return de.code
	}
	return CodeInvalidJSON
}

// replayMemory re-reads the first n lines and returns their memory records.
// The main pass already validated them.
func replayMemory(r io.Reader, maxLine, n int) ([]memRecord, error) {
	lr := newLineReader(r, maxLine)
	var d lineDecoder
	var out []memRecord
	for lr.n < n {
		raw, _, err := lr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		line := trimSpace(raw)
		if k, err := d.decode(line); err == nil && k == kindMemory {
			out = append(out, recordOf(&d.memory, lr.n))
		}
	}
	return out, nil
}
