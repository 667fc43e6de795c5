package session

import "github.com/candle-trace/candle-trace/internal/events"

// product is what a session makes of what it is told: a trace of one step
// (*traceSession, trace.go) or the statistics of a whole run
// (*aggregateSession, aggregate.go). The Session checks every call the same
// way for both (records.go, the lifecycle, the span bounds); the product
// decides what a checked call becomes. Every method runs with mu held.
type product interface {
	// flushesInBackground: whether a flusher goroutine (flushLoop) calls
	// tickLocked every flush interval, after draining the rings.
	flushesInBackground() bool
	tickLocked()
	// flushLocked makes what was recorded so far durable (ct_flush), after
	// the rings were drained.
	flushLocked() error

	// finishCheckLocked refuses a ct_finish the product cannot complete,
	// beyond spans open in the Go tables (which refuse either).
	finishCheckLocked() error
	// finishLocked writes the product's end and releases the session.
	finishLocked() error
	// finishFailedLocked ends the session after a failure (any state).
	finishFailedLocked(reason string) error

	// keepLocked decides about the record line just appended to s.buf at
	// mark, once the record was checked.
	keepLocked(c lineClass, mark int)
	// scalarLocked takes one scalar observation (a stats line is kept too,
	// through keepLocked).
	scalarLocked(fn, label string, v float64) error
	// completedSpanLocked takes a completed span (ct_record_completed_span),
	// checked; it reports whether the span was left out of the output.
	completedSpanLocked(id uint64, name string, kind events.SpanKind, startNs, durNs uint64) (dropped bool)
	// callEdgeLocked checks and takes a call edge whose from exists.
	callEdgeLocked(fn string, from, to, hostDurationNs uint64) error
	// untrackedSpan: span is one of the product's spans that never reach the
	// Go tables, whose bounds therefore cannot be checked.
	untrackedSpan(span uint64) bool

	// naiveBeginLocked and naiveEndLocked are the naive design's span
	// (naive.go) after the Session's stack took it.
	naiveBeginLocked(id, parent uint64, name string, kind events.SpanKind, step events.Step, start uint64)
	naiveEndLocked(o openSpan, id, dur uint64)
}

// lineClass is what a record line is to a trace that must drop lines to
// stay within its bound (a buffered session, buffered.go).
type lineClass uint8

const (
	// lineDetail: dropped from the moment the trace would outgrow max_bytes.
	lineDetail lineClass = iota
	// lineStructure: dropped from the moment it would outgrow the hard cap.
	lineStructure
	// lineSpan: a span_start (or a completed span's two lines), dropped as
	// lineStructure but counted by the session when the span ends.
	lineSpan
	// lineNeeded: never dropped (a gradient of the contract).
	lineNeeded
)
