package otlp

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// Pusher sends an aggregate session's summaries to a collector as OTLP
// metrics, from a goroutine of its own, so that neither the training loop
// nor the summary writer ever waits for the network. It holds one summary
// at a time: a newer one replaces one not yet sent (the statistics are
// cumulative, so the newer says all the older did). A summary that is
// replaced, or whose push fails, is dropped and counted — never retried,
// for the same reason; the next interval is the retry, which is also what
// makes a restarted collector receive again.
type Pusher struct {
	client *Client
	opts   MetricsOptions
	url    string

	mailbox chan *aggregate.Summary // holds at most one
	stop    chan struct{}
	done    chan struct{}
	closing sync.Once

	pushed, dropped atomic.Uint64
	lastErr         atomic.Pointer[string]
}

// PushOptions tune a Pusher.
type PushOptions struct {
	Metrics MetricsOptions
	// Timeout bounds one push (DefaultPushTimeout): a collector that hangs
	// costs one dropped summary per timeout, nothing more.
	Timeout time.Duration
	Headers map[string]string
}

// DefaultPushTimeout bounds one push.
const DefaultPushTimeout = 5 * time.Second

// NewPusher starts a pusher to endpoint (as for NewClient).
func NewPusher(endpoint string, opts PushOptions) (*Pusher, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultPushTimeout
	}
	c, err := NewClient(endpoint, ClientOptions{Timeout: opts.Timeout, Attempts: 1, Headers: opts.Headers})
	if err != nil {
		return nil, err
	}
	p := &Pusher{client: c, opts: opts.Metrics, url: c.URL(Metrics),
		mailbox: make(chan *aggregate.Summary, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p, nil
}

// Offer hands a summary over and returns at once. The summary must not
// change afterwards.
func (p *Pusher) Offer(s *aggregate.Summary) {
	for {
		select {
		case p.mailbox <- s:
			return
		default:
		}
		// Full: the summary waiting there is older than s.
		select {
		case <-p.mailbox:
			p.superseded()
		default:
		}
	}
}

// Stats says how the pushes went so far.
func (p *Pusher) Stats() aggregate.OTLPPush {
	st := aggregate.OTLPPush{Endpoint: p.url, Pushed: p.pushed.Load(), Dropped: p.dropped.Load()}
	if e := p.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

func (p *Pusher) drop(why string) {
	p.dropped.Add(1)
	p.lastErr.Store(&why)
}

// supersededWhy is the reason of a summary replaced in the mailbox by a newer
// one before it could be sent.
var supersededWhy = "superseded by a newer summary before it could be sent (the collector is slow)"

// superseded counts a summary replaced in the mailbox. Its reason becomes the
// last error only while no push has failed: a push's own error (a collector
// down, a timeout) says why the pusher fell behind, and a summary written
// while the pusher catches up would otherwise name the consequence, not the
// cause.
func (p *Pusher) superseded() {
	p.dropped.Add(1)
	p.lastErr.CompareAndSwap(nil, &supersededWhy)
}

func (p *Pusher) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			// Close: the last summary, if one is waiting, then stop.
			select {
			case s := <-p.mailbox:
				p.push(s)
			default:
			}
			return
		case s := <-p.mailbox:
			p.push(s)
		}
	}
}

func (p *Pusher) push(s *aggregate.Summary) {
	var m pmetric.ProtoMarshaler
	body, err := m.MarshalMetrics(SummaryMetrics(s, p.opts))
	if err == nil {
		_, err = p.client.Send(context.Background(), Metrics, body)
	}
	if err != nil {
		p.drop(err.Error())
		return
	}
	p.pushed.Add(1)
}

// Close sends the summary still waiting, if any (the final one, offered
// by the writer's Finish), waiting for it at most wait, and stops the
// pusher. A push still under way after wait is left to finish on its own
// and counted as it ends. Close may be called more than once.
func (p *Pusher) Close(wait time.Duration) {
	p.closing.Do(func() { close(p.stop) })
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}
