package session

import (
	"time"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

// An aggregate session ("mode": "aggregate" in the run JSON) keeps span and
// scalar statistics over a whole run instead of a trace of one step. Spans
// take the same C fast path and rings as in a trace session; the drainer
// folds each closed span's duration into internal/aggregate instead of
// encoding it, so memory stays constant however many steps run. Every other
// record is still checked, then not kept. The summary file is rewritten
// atomically every aggregate_interval_ms and at finish.

type aggState struct {
	agg    *aggregate.Aggregator
	writer *aggregate.Writer
}

func openAggregate(path string, run *events.Run, p Producer) (*aggState, error) {
	agg := aggregate.New()
	opts := []aggregate.WriterOption{aggregate.WithProducer(aggregate.Producer{Name: p.Name, Version: p.Version})}
	if run.AggregateIntervalMs > 0 {
		opts = append(opts, aggregate.WithInterval(time.Duration(run.AggregateIntervalMs)*time.Millisecond))
	}
	ar := aggregate.RunFrom(run)
	if ar.Binding == "" {
		ar.Binding = p.Binding
	}
	w, err := aggregate.NewWriter(path, agg, ar, opts...)
	if err != nil {
		return nil, err
	}
	if err := w.Start(); err != nil {
		return nil, err
	}
	return &aggState{agg: agg, writer: w}, nil
}

// spanKey interns a span's name and step; spans beyond the name cap fold
// into the aggregator's overflow key.
func (s *Session) spanKey(name string, step uint32) aggregate.Key {
	k, err := s.aggr.agg.Intern(name, events.Step(step))
	if err != nil {
		return aggregate.OverflowKey
	}
	return k
}

// SetAggregateEnabled switches statistics on or off. What the rings hold
// was recorded before the call and is folded under the old setting.
func (s *Session) SetAggregateEnabled(on bool) error {
	const fn = "ct_aggregate_enable"
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if s.aggr == nil {
		return errorf(State, "%s: session %d is a trace session; open it with \"mode\": \"aggregate\"", fn, s.handle)
	}
	s.aggr.agg.SetEnabled(on)
	return nil
}

// AggregateEnabled reports whether an aggregate session is folding spans.
func (s *Session) AggregateEnabled() bool {
	mu.Lock()
	defer mu.Unlock()
	return s.aggr != nil && s.aggr.agg.Enabled()
}
