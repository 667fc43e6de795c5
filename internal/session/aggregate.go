package session

/*
#include <stddef.h>
#include <stdint.h>
#include "aggkeys.h"
*/
import "C"

import (
	"fmt"
	"os"
	"time"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/otlp"
)

// aggregateSession is the product of an aggregate session ("mode":
// "aggregate" in the run JSON): span and scalar statistics over a whole run
// instead of a trace of one step. Its
// spans take their own C path (fastpath.c, agg_begin/agg_end): a thread
// caches each span name's statistics key (aggkeys.c, asking ctgo_agg_intern
// on a miss), a span begin writes nothing, and a span end appends its key and
// duration in ticks (ticks.h) to the thread's ring — 16 bytes. The drainer
// folds those in batches into internal/aggregate, so memory stays constant
// however many steps run. Every other record is still checked, then not
// kept. The summary file is rewritten atomically every aggregate_interval_ms
// and at finish, and, with an OTLP endpoint, pushed to a collector from the
// pusher's own goroutine (internal/otlp.Pusher): the writer only hands it
// over.
type aggregateSession struct {
	sess   *Session
	agg    *aggregate.Aggregator
	writer *aggregate.Writer
	push   *otlp.Pusher // nil without an OTLP endpoint

	naiveKeys []aggregate.Key // NaiveBeginSpan's open spans; guarded by mu
}

// OTLPEndpointEnv names the collector an aggregate session pushes its
// summaries to when the run JSON gives no "otlp_endpoint".
const OTLPEndpointEnv = "CANDLE_TRACE_OTLP_ENDPOINT"

// FinalPushWait is how long ct_finish waits for the final summary's push:
// long enough for a collector that answers, short enough that one that
// hangs cannot hold a finishing job.
const FinalPushWait = 2 * time.Second

// openAggregate makes s an aggregate session: the summary's writer starts
// (it writes the first summary now) and the slot's spans take the aggregate
// path.
func openAggregate(s *Session) error {
	run, p := s.run, s.opts.producer
	if run.Binding != "" {
		p.Binding = run.Binding
	}
	agg := aggregate.New()
	// The process too: WithProducer replaces the writer's whole default, and
	// a pushed summary's host.name and run id come from these.
	host, _ := os.Hostname()
	opts := []aggregate.WriterOption{aggregate.WithProducer(aggregate.Producer{Name: p.Name, Version: p.Version, PID: os.Getpid(), Hostname: host})}
	if run.AggregateIntervalMs > 0 {
		opts = append(opts, aggregate.WithInterval(time.Duration(run.AggregateIntervalMs)*time.Millisecond))
	}
	fail := func(err error) error {
		return errorf(IO, "ct_open: aggregate summary %s: %v", s.path, err)
	}
	push, err := openPush(run)
	if err != nil {
		return fail(err)
	}
	if push != nil {
		opts = append(opts, aggregate.WithPush(push))
	}
	ar := aggregate.RunFrom(run)
	if ar.Binding == "" {
		ar.Binding = p.Binding
	}
	w, err := aggregate.NewWriter(s.path, agg, ar, opts...)
	if err == nil {
		err = w.Start()
	}
	if err != nil {
		if push != nil {
			push.Close(0)
		}
		return fail(err)
	}
	a := &aggregateSession{sess: s, agg: agg, writer: w, push: push}
	s.product, s.aggr = a, a
	setSlotAggregate(s.slot, agg.Enabled())
	return nil
}

// openPush starts the OTLP push of the summaries when the run JSON or the
// environment names a collector. Rank and world size come from torchrun's
// RANK and WORLD_SIZE, the service name from OpenTelemetry's own
// OTEL_SERVICE_NAME.
func openPush(run *events.Run) (*otlp.Pusher, error) {
	endpoint, from := run.OTLPEndpoint, `"otlp_endpoint"`
	if endpoint == "" {
		endpoint, from = os.Getenv(OTLPEndpointEnv), OTLPEndpointEnv
	}
	if endpoint == "" {
		return nil, nil
	}
	p, err := otlp.NewPusher(endpoint, otlp.PushOptions{Metrics: otlp.MetricsOptions{
		ServiceName: os.Getenv("OTEL_SERVICE_NAME"), Rank: os.Getenv("RANK"), WorldSize: os.Getenv("WORLD_SIZE"),
	}})
	if err != nil {
		return nil, fmt.Errorf("%s: %v", from, err)
	}
	return p, nil
}

func (a *aggregateSession) flushesInBackground() bool { return true }

// tickLocked: the flusher's drain folded what the rings held; the writer
// rewrites the summary on its own interval.
func (a *aggregateSession) tickLocked() {}

func (a *aggregateSession) flushLocked() error { return a.writer.WriteNow() }

// finishCheckLocked refuses ct_finish while spans are open on any thread.
// A summary of a whole run has no measured region or contract, but a span
// never ended is a missing duration. Their frames live in C; only the
// calling thread's innermost one can be named (another thread's stack may
// be changing under us).
func (a *aggregateSession) finishCheckLocked() error {
	const maxThreads = 5
	total, tids, counts, threads := openSpansC(a.sess.handle, maxThreads)
	if total == 0 {
		return nil
	}
	parts := make([]string, len(tids))
	self := threadID()
	for i, tid := range tids {
		parts[i] = fmt.Sprintf("thread %d holds %d", tid, counts[i])
		if tid != self {
			continue
		}
		if k, ok := innermostKeyC(a.sess.handle); ok {
			if name, _, ok := a.agg.Name(aggregate.Key(k)); ok {
				parts[i] += fmt.Sprintf(" (innermost %q)", name)
			}
		}
	}
	more := ""
	if threads > maxThreads {
		more = fmt.Sprintf(" and %d more threads", threads-maxThreads)
	}
	return openSpansErr(int(total), parts, more)
}

func (a *aggregateSession) finishLocked() error {
	if err := a.endLocked(); err != nil {
		return errorf(IO, "ct_finish: write %s: %v", a.sess.path, err)
	}
	return nil
}

// finishFailedLocked: the summary has no outcome; what was folded so far
// is written.
func (a *aggregateSession) finishFailedLocked(string) error {
	drainLocked()
	if err := a.endLocked(); err != nil {
		return errorf(IO, "ct_finish_failed: write %s: %v", a.sess.path, err)
	}
	return nil
}

// endLocked writes the final summary, releases the session and then,
// outside the lock so that other sessions go on, waits at most
// FinalPushWait for the final summary's push.
func (a *aggregateSession) endLocked() error {
	err := a.writer.Finish()
	a.sess.releaseLocked()
	if a.push != nil {
		mu.Unlock()
		a.push.Close(FinalPushWait)
		mu.Lock()
	}
	return err
}

// keepLocked: a summary keeps no record lines; the record was checked.
func (a *aggregateSession) keepLocked(_ lineClass, mark int) { a.sess.buf = a.sess.buf[:mark] }

// scalarLocked folds v into the label's running statistics (the C path,
// ct__agg_scalar, folds most scalars without entering Go).
func (a *aggregateSession) scalarLocked(fn, label string, v float64) error {
	if err := a.agg.ScalarByLabel(label, v); err != nil {
		return invalid(fn, err)
	}
	return nil
}

func (a *aggregateSession) completedSpanLocked(_ uint64, name string, _ events.SpanKind, _, durNs uint64) bool {
	a.agg.Observe(a.spanKey(name, uint32(events.StepNone)), durNs)
	return false
}

// callEdgeLocked: no hierarchy to check against, and nothing is kept.
func (a *aggregateSession) callEdgeLocked(fn string, _, to, _ uint64) error {
	return a.sess.spanExists(fn, to)
}

// untrackedSpan: an aggregate session's spans never reach the Go tables
// (they keep only a duration); that the id was handed out is all there is.
func (a *aggregateSession) untrackedSpan(span uint64) bool {
	return span != 0 && span <= lastSpanID(a.sess.slot)
}

// naiveBeginLocked and naiveEndLocked fold the duration on the spot (a map
// lookup at begin, a locked Observe at end), the design a Go-only
// aggregator would have.
func (a *aggregateSession) naiveBeginLocked(_, _ uint64, name string, _ events.SpanKind, step events.Step, _ uint64) {
	a.naiveKeys = append(a.naiveKeys, a.spanKey(name, uint32(step)))
}

func (a *aggregateSession) naiveEndLocked(_ openSpan, _, dur uint64) {
	n := len(a.naiveKeys)
	k := a.naiveKeys[n-1]
	a.naiveKeys = a.naiveKeys[:n-1]
	a.agg.Observe(k, dur)
}

// spanKey interns a span's name and step; spans beyond the name cap fold
// into the aggregator's overflow key.
func (a *aggregateSession) spanKey(name string, step uint32) aggregate.Key {
	k, err := a.agg.Intern(name, events.Step(step))
	if err != nil {
		return aggregate.OverflowKey
	}
	return k
}

// ctgo_agg_intern is the C span path's cache miss: the statistics key of
// (name, step) in aggregate session h, -1 when h is not one (finished in
// the meantime).
//
//export ctgo_agg_intern
func ctgo_agg_intern(h C.uint64_t, name *C.char, n C.size_t, step C.uint32_t) C.int64_t {
	mu.Lock()
	s := live[uint64(h)]
	mu.Unlock()
	if s == nil || s.aggr == nil {
		return -1
	}
	a := s.aggr
	if step == C.CT_AGG_SCALAR {
		// The aggregator's limits (length, the reserved name) refuse a label
		// as RecordScalar's Go path does; a label past the cap comes back as
		// OverflowScalar.
		k, err := a.agg.InternScalar(C.GoStringN(name, C.int(n)))
		if err != nil {
			WriteCError(invalid("ct_record_scalar", err))
			return C.CT_AGG_REFUSED
		}
		return C.int64_t(k)
	}
	return C.int64_t(a.spanKey(C.GoStringN(name, C.int(n)), uint32(step)))
}

// aggregateLocked is s's aggregate product for fn, an aggregate-only call;
// CT_ERR_STATE for a trace session.
func (s *Session) aggregateLocked(fn string) (*aggregateSession, error) {
	if s.aggr == nil {
		return nil, errorf(State, "%s: session %d is a trace session; open it with \"mode\": \"aggregate\"", fn, s.handle)
	}
	return s.aggr, nil
}

// SetAggregateEnabled switches statistics on or off. A span counts when
// statistics were on both at its begin and at its end; what the rings hold
// was gated when it was produced and is folded whatever the new setting.
func (s *Session) SetAggregateEnabled(on bool) error {
	const fn = "ct_aggregate_enable"
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	a, err := s.aggregateLocked(fn)
	if err != nil {
		return err
	}
	if on {
		a.agg.SetEnabled(true)
		setSlotAggregateOn(s.slot, true)
	} else {
		setSlotAggregateOn(s.slot, false)
		a.agg.SetEnabled(false)
	}
	return nil
}

// AggregateTrigger lists one trigger that fired in the summary's
// "triggers" (ct_aggregate_trigger): checked, then kept, the first
// aggregate.DefaultMaxTriggers of a run; later ones are counted.
func (s *Session) AggregateTrigger(f aggregate.Firing) error {
	const fn = "ct_aggregate_trigger"
	if err := f.Check(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	a, err := s.aggregateLocked(fn)
	if err != nil {
		return err
	}
	return a.agg.Fire(f) // checked above: only the cap can stop it, and that is no error
}

// AggregateEnabled reports whether an aggregate session is folding spans.
func (s *Session) AggregateEnabled() bool {
	mu.Lock()
	defer mu.Unlock()
	return s.aggr != nil && s.aggr.agg.Enabled()
}
