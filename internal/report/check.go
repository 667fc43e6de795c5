package report

import (
	"errors"
	"fmt"
	"io"
)

// ProgressEvery is how often Options.Progress is called.
const ProgressEvery = 16 << 20

// checkOptions tune a check. observe, when set, sees every event the
// checker accepted (the analyses above fold them into their own state); the
// event lives in d until the next line.
type checkOptions struct {
	maxLineBytes int
	progress     func(bytesRead int64)
	observe      func(k eventKind, d *lineDecoder, line int)
}

// check reads one trace from r in a single streaming pass and judges it.
// When memory records turn out to be out of timestamp order and r is an
// io.ReadSeeker, it re-reads them in a second pass; other readers have them
// buffered. The error is for I/O only: every problem with the content is an
// issue in the verdict.
func check(r io.Reader, opts checkOptions) (*analyzer, error) {
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
		if replayed, err = replayMemory(seeker, a.opts.maxLineBytes, lines); err != nil {
			return nil, fmt.Errorf("re-read memory records: %w", err)
		}
	}
	if !a.fatal {
		a.lt = a.mem.finish(replayed)
	}
	a.health = a.finish(a.lt)
	a.health.Lines, a.health.Bytes = lines, total
	return a, nil
}

// readAll is the main pass. It stops at the first problem that makes the
// file unreadable for candle-graph, and tolerates a cut last line when no
// terminal record has been read.
func (a *analyzer) readAll(r io.Reader) (lines int, total int64, err error) {
	st := newEventStream(r, a.opts.maxLineBytes)
	nextProgress := int64(ProgressEvery)
	for !a.fatal {
		k, ok := st.next()
		if a.opts.progress != nil && st.bytesRead() >= nextProgress {
			a.opts.progress(st.bytesRead())
			nextProgress = st.bytesRead() + ProgressEvery
		}
		if !ok {
			break
		}
		a.event(&st.d, k, st.line)
		if a.opts.observe != nil && !a.fatal {
			a.opts.observe(k, &st.d, st.line)
		}
	}
	if st.err != nil {
		return st.lines(), st.bytesRead(), st.err
	}
	if st.stop != nil {
		a.stop(st.stop.Line, st.stop.Code, st.stop.Message)
	}
	a.cutLine = st.cutLine
	return st.lines(), st.bytesRead(), nil
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
