package health

import (
	"errors"
	"fmt"
	"io"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// ProgressEvery is how often Options.Progress is called.
const ProgressEvery = 16 << 20

// checkOptions tune a check. observe, when set, sees every event the
// checker accepted (the analyses above fold them into their own state); the
// event lives in d until the next line.
type Options struct {
	MaxLineBytes int
	Progress     func(bytesRead int64)
	Observe      func(k trace.Kind, d *trace.Decoder, line int)
}

// check reads one trace from r in a single streaming pass and judges it.
// When memory records turn out to be out of timestamp order and r is an
// io.ReadSeeker, it re-reads them in a second pass; other readers have them
// buffered. The error is for I/O only: every problem with the content is an
// issue in the verdict.
func Check(r io.Reader, opts Options) (*Checker, error) {
	seeker, origin := trace.Rewindable(r)
	a := newAnalyzer(opts)
	a.mem.buffer = seeker == nil
	lines, total, err := a.readAll(r)
	if err != nil {
		return nil, err
	}
	var replayed []memRecord
	if !a.Fatal && a.mem.needsReplay() {
		if _, err := seeker.Seek(origin, io.SeekStart); err != nil {
			return nil, fmt.Errorf("re-read memory records: %w", err)
		}
		if replayed, err = replayMemory(seeker, a.opts.MaxLineBytes, lines); err != nil {
			return nil, fmt.Errorf("re-read memory records: %w", err)
		}
	}
	if !a.Fatal {
		a.Memory = a.mem.finish(replayed)
	}
	a.Health = a.finish(a.Memory)
	a.Health.Lines, a.Health.Bytes = lines, total
	return a, nil
}

// readAll is the main pass. It stops at the first problem that makes the
// file unreadable for candle-graph, and tolerates a cut last line when no
// terminal record has been read.
func (a *Checker) readAll(r io.Reader) (lines int, total int64, err error) {
	st := trace.NewStream(r, a.opts.MaxLineBytes)
	nextProgress := int64(ProgressEvery)
	for !a.Fatal {
		k, ok := st.Next()
		if a.opts.Progress != nil && st.BytesRead() >= nextProgress {
			a.opts.Progress(st.BytesRead())
			nextProgress = st.BytesRead() + ProgressEvery
		}
		if !ok {
			break
		}
		a.event(&st.Decoded, k, st.Line)
		if a.opts.Observe != nil && !a.Fatal {
			a.opts.Observe(k, &st.Decoded, st.Line)
		}
	}
	if st.Err != nil {
		return st.Lines(), st.BytesRead(), st.Err
	}
	if st.Stop != nil {
		a.stop(st.Stop.Line, st.Stop.Code, st.Stop.Message)
	}
	a.cutLine = st.CutLine
	return st.Lines(), st.BytesRead(), nil
}

// replayMemory re-reads the first n lines and returns their memory records.
// The main pass already validated them.
func replayMemory(r io.Reader, maxLine, n int) ([]memRecord, error) {
	lr := trace.NewLineReader(r, maxLine)
	var d trace.Decoder
	var out []memRecord
	for lr.N < n {
		raw, _, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		line := trace.TrimSpace(raw)
		if k, err := d.Decode(line); err == nil && k == trace.KindMemory {
			out = append(out, recordOf(&d.Memory, lr.N))
		}
	}
	return out, nil
}
