package session

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/candle-trace/candle-trace/internal/events"
)

// A buffered session ("buffer": {"max_bytes": N} in the run JSON) is the
// flight recorder of one training update: its sink, a bufferSink, keeps the
// whole trace in memory, ct_finish / ct_finish_failed write it to the path
// (a trigger fired: an exception, a non-finite loss, a slow update) and
// ct_discard drops it (nothing happened). The session itself records as it
// always does; only the sink differs, plus one question the record paths
// ask it (keepLine): may this line stay?
//
// The bound. Once the trace would outgrow max_bytes, the detail lines — op,
// tensor, tensor_stats, memory, device_memory, device_interval and data
// edges — are dropped, this one and every later one (so what is kept is a
// prefix of them: a free is never kept without its alloc, a data edge
// never without its tensors). Span lines, call edges and gradients go on
// until the trace would outgrow twice max_bytes (the hard cap); then new
// spans are dropped with their span_end, their call edges and whatever is
// recorded on them, and so are call edges and gradients outside a gradient
// contract. What a valid trace needs is always kept: the meta line, the
// root, the end of every span already kept, the measured region and the
// first span of each required semantic label (with the dropped ancestors
// they open under, written when they start), a contract's gradients and the
// terminal. A dropped record is counted, never refused: the program sees
// CT_OK. The terminal states the counts ("dropped_records", "dropped_bytes",
// ours), ct_dropped_records reads them; a dropped span counts as its two
// lines when it ends (one when ct_finish_failed finds it still open), so a
// span revived as an ancestor is never counted.

// bufferSink is a buffered session's sink: the trace in memory, written to
// path at Close with the session's opener (the file rules of every trace:
// no final symbolic link followed, nobody else's file truncated). Guarded by
// the package lock, as all session state.
type bufferSink struct {
	path   string
	opener Opener
	data   []byte
	limit  int // max_bytes
	hard   int // 2 × max_bytes
	// detailFull and structureFull latch: once a line of the class has been
	// dropped, every later one is.
	detailFull, structureFull bool
	dropped                   events.Dropped
}

// newBufferSink keeps the trace in reuse's memory when given (Reopen: the
// update before's, emptied), else in a new chunk.
func newBufferSink(path string, b *events.Buffer, opener Opener, reuse []byte) *bufferSink {
	limit := int(b.MaxBytes)
	if reuse == nil {
		reuse = make([]byte, 0, min(limit, DefaultWriteChunk))
	}
	return &bufferSink{path: path, opener: opener, limit: limit, hard: 2 * limit, data: reuse[:0]}
}

// Write keeps b; it never fails.
func (b *bufferSink) Write(p []byte) (int, error) {
	b.data = append(b.data, p...)
	return len(p), nil
}

// room says whether a line of n bytes, coming after pending bytes the
// session has not handed over yet, may stay; a refused line is counted as
// dropped, except a span's (lineSpan: the session counts it when it ends).
func (b *bufferSink) room(c lineClass, pending, n int) bool {
	total := len(b.data) + pending + n
	full := &b.structureFull
	limit := b.hard
	if c == lineDetail {
		full, limit = &b.detailFull, b.limit
	}
	if !*full && total <= limit {
		return true
	}
	*full = true
	if c != lineSpan {
		b.drop(1, n)
	}
	return false
}

// drop counts lines left out.
func (b *bufferSink) drop(records, bytes int) {
	b.dropped.Records += uint64(records)
	b.dropped.Bytes += uint64(bytes)
}

// Close writes the trace to its path: the folder is made, the file created
// as every trace's is (the opener), and written in one go. When any of it
// fails, what was created goes again and a reused file is emptied (see
// outfile.File.Discard): nothing that claims to be a trace is left. The
// memory is freed either way.
func (b *bufferSink) Close() error {
	data := b.data
	b.data = nil
	if dir := filepath.Dir(b.path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create folder: %v; nothing was written", err)
		}
	}
	f, err := b.opener(b.path)
	if err != nil {
		return fmt.Errorf("create: %v; nothing was written", err)
	}
	n, err := f.Write(data)
	if err == nil && n != len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		discard(f)
		return fmt.Errorf("%v; nothing that claims to be a trace is left", err)
	}
	return f.Close()
}

// Discard drops the trace unwritten (ct_discard).
func (b *bufferSink) Discard() { b.data = nil }

// keepLine decides whether the line just appended (s.buf[mark:]) stays: a
// buffered session's bound may drop it; every other sink keeps everything.
// mu is held.
func (t *traceSession) keepLine(c lineClass, mark int) bool {
	s := t.sess
	if t.bound == nil || c == lineNeeded || t.bound.room(c, mark, len(s.buf)-mark) {
		return true
	}
	s.buf = s.buf[:mark]
	return false
}

// keepSpanStart decides about the span_start just appended for o: a span
// the trace needs (the measured region, the first span of a required label:
// its count already includes this one) always stays, after the dropped
// ancestors it opens under are written; any other stays while the bound
// allows. A dropped start is kept in o.line in case a needed descendant
// revives it. A kept span's parent is always kept, so only the direct
// parent needs looking at. mu is held.
func (t *traceSession) keepSpanStart(o *openSpan, mark int, name []byte, measured bool) {
	if t.bound == nil {
		return
	}
	s := t.sess
	if n, req := t.required[string(name)]; measured || (req && n == 1) {
		if p, ok := s.open.get(o.parent); ok && p.line != nil {
			line := append([]byte(nil), s.buf[mark:]...)
			s.buf = append(t.reviveLocked(s.buf[:mark], o.parent), line...)
		}
		return
	}
	line := s.buf[mark:]
	if !t.bound.room(lineSpan, mark, len(line)) {
		o.line = append([]byte(nil), line...)
		s.buf = s.buf[:mark]
	}
}

// reviveLocked appends the span_start lines of id and its open ancestors
// that were dropped, outermost first, so a needed span has its parents.
func (t *traceSession) reviveLocked(b []byte, id uint64) []byte {
	o, ok := t.sess.open.get(id)
	if !ok || o.line == nil {
		return b
	}
	b = t.reviveLocked(b, o.parent)
	b = append(b, o.line...)
	t.sess.open.setLine(id, nil)
	return b
}

// keepCompletedSpan decides about the two lines of a completed span just
// appended (s.buf[mark:]; its parent is the root): the first span of a
// required label always stays, any other while the bound allows. mu is held.
func (t *traceSession) keepCompletedSpan(mark int, name string) bool {
	if t.bound == nil {
		return true
	}
	if n, req := t.required[name]; req && n == 1 {
		return true
	}
	s := t.sess
	if t.bound.room(lineSpan, mark, len(s.buf)-mark) {
		return true
	}
	t.bound.drop(2, len(s.buf)-mark)
	s.buf = s.buf[:mark]
	return false
}

// keepCallEdge decides about the call edge just appended: one to a dropped
// span goes with it, any other stays while the bound allows. mu is held.
func (t *traceSession) keepCallEdge(mark int, toDropped bool) {
	if !toDropped {
		t.keepLine(lineStructure, mark)
		return
	}
	s := t.sess
	t.bound.drop(1, len(s.buf)-mark)
	s.buf = s.buf[:mark]
}

// dropEndedLocked leaves out a dropped span that ended: its start (line),
// and the end and call edges appended since mark, lines in all but the
// start.
func (t *traceSession) dropEndedLocked(line []byte, mark, lines int) {
	s := t.sess
	t.bound.drop(1+lines, len(line)+len(s.buf)-mark)
	s.buf = s.buf[:mark]
}

// buffered is s's trace when it is a buffered one, else nil.
func (s *Session) buffered() *traceSession {
	if t := s.traceSession; t != nil && t.bound != nil {
		return t
	}
	return nil
}

// discard ends a buffered session without writing anything (ct_discard):
// nothing is on disk, the memory goes and the handle is invalid; open spans
// do not matter. A session that writes as it records has nothing to
// discard: CT_ERR_STATE, and it stays open.
func (s *Session) discard() error {
	mu.Lock()
	defer mu.Unlock()
	if err := s.endableLocked("ct_discard"); err != nil {
		return err
	}
	t := s.buffered()
	if t == nil {
		return errorf(State, "ct_discard: session %d writes its trace as it records, so there is nothing to discard (open it with \"buffer\" in the run JSON to keep the trace in memory); end it with ct_finish or ct_finish_failed", s.handle)
	}
	t.discardLocked()
	return nil
}

// discardLocked is Discard once the session is known live and buffered; it
// returns the memory the session kept its trace, its encoding and its
// gradient contract's keys in (their contents are dropped).
func (t *traceSession) discardLocked() kept {
	s := t.sess
	s.endingLocked()
	k := kept{data: t.bound.data, enc: s.buf[:0], expected: s.expected}
	t.bound.Discard()
	s.buf, s.expected = nil, nil
	s.releaseLocked()
	return k
}

// kept is the memory a flight recorder's next session takes over from the
// one before (reopen): the buffer its trace was kept in, the buffer its
// lines were encoded in and its gradient contract's keys, so that an update's
// reopen allocates next to nothing (a 64-parameter contract's keys and meta
// line were 45 KB an update, and the collections they brought on ran beside
// the training). The zero value: a first open, which allocates its own.
type kept struct {
	data, enc []byte
	// expected: the same run's keys (a reopened run differs in its capture
	// step only); their values are reset.
	expected map[gradKey]bool
}

// reopen discards the buffered session s (as Discard does) and opens the
// next one at path with s's run for capture step step (ct_reopen: a flight
// recorder keeps one run JSON, parsed once, for every update it records);
// the next takes what s found out about the process and the folder
// (sameRun). A refusal that is the caller's (step 0 or a warmup_steps it no
// longer exceeds, s not buffered, s unknown) leaves s as it was; once s is
// discarded, a failure to open the next one (the path) is returned and
// nothing is open.
func (s *Session) reopen(path string, step uint64) (*Session, error) {
	if Forked() {
		return nil, errForked("ct_reopen")
	}
	if strings.TrimSpace(path) == "" {
		return nil, errorf(InvalidArgument, "ct_reopen: path is empty")
	}
	mu.Lock()
	if err := s.endableLocked("ct_reopen"); err != nil {
		mu.Unlock()
		return nil, err
	}
	t := s.buffered()
	if t == nil {
		mu.Unlock()
		return nil, errorf(State, "ct_reopen: session %d writes its trace as it records; only a buffered session (\"buffer\" in the run JSON) can be reopened", s.handle)
	}
	next, err := s.run.WithCaptureStep(step)
	if err != nil {
		mu.Unlock()
		return nil, errorf(InvalidArgument, "ct_reopen: %v", err)
	}
	// The update before's memory holds the next: no new chunk to clear, and
	// none of the growth the update before already went through.
	k, same, o := t.discardLocked(), t.sameRun, s.opts
	mu.Unlock()
	n, err := openRun(path, next, o, &same, k, nil)
	if err != nil {
		if e, ok := err.(*Error); ok && strings.HasPrefix(e.Msg, "ct_open:") {
			return nil, &Error{Code: e.Code, Msg: "ct_reopen" + e.Msg[len("ct_open"):]}
		}
		return nil, err
	}
	return n, nil
}

// Dropped is what a buffered session's bound has left out so far
// (ct_dropped_records); zero for every other session.
func (s *Session) Dropped() events.Dropped {
	mu.Lock()
	defer mu.Unlock()
	t := s.buffered()
	if t == nil {
		return events.Dropped{}
	}
	return t.bound.dropped
}

// appendTerminalLocked appends the terminal line; a buffered session's also
// states what its bound dropped, counting the dropped spans still open.
func (t *traceSession) appendTerminalLocked(complete bool, now uint64, reason string, tracer uint64) {
	s := t.sess
	tt := s.tracerTime(tracer)
	if t.bound == nil {
		s.buf = events.AppendTerminal(s.buf, complete, now, reason, tt)
		return
	}
	s.open.each(func(_ uint64, o openSpan) {
		if o.line != nil {
			t.bound.drop(1, len(o.line))
		}
	})
	s.buf = events.AppendBufferedTerminal(s.buf, complete, now, reason, tt, t.bound.dropped)
}
