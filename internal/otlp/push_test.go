package otlp

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

func summaryN(seq uint64) *aggregate.Summary {
	s := aggregate.New().Snapshot()
	s.Run = aggregate.Run{Entrypoint: "e", Phase: "train", Device: "cpu", Tags: map[string]string{}}
	s.Sequence = seq
	return s
}

// sequences records the candle.aggregate.sequence of each metrics request.
type sequences struct {
	got  chan int64
	gate chan struct{} // when set, each request waits for a value
}

func (q *sequences) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if q.gate != nil {
		<-q.gate
	}
	body, _ := io.ReadAll(r.Body)
	var u pmetric.ProtoUnmarshaler
	md, err := u.UnmarshalMetrics(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := 0; i < ms.Len(); i++ {
		if ms.At(i).Name() == MetricSequence {
			q.got <- ms.At(i).Gauge().DataPoints().At(0).IntValue()
		}
	}
}

func TestPusherSendsAndCloseDeliversTheLast(t *testing.T) {
	q := &sequences{got: make(chan int64, 10)}
	srv := httptest.NewServer(q)
	defer srv.Close()
	p, err := NewPusher(srv.URL, PushOptions{})
	require.NoError(t, err)
	p.Offer(summaryN(1))
	assert.Equal(t, int64(1), <-q.got)
	p.Offer(summaryN(2))
	p.Close(5 * time.Second)
	// 2 was either sent before Close or by it.
	assert.Equal(t, int64(2), <-q.got)
	st := p.Stats()
	assert.Equal(t, aggregate.OTLPPush{Endpoint: srv.URL + "/v1/metrics", Pushed: 2}, st)
	p.Close(time.Second) // again: a no-op
}

func TestPusherNeverBlocksAndKeepsTheNewest(t *testing.T) {
	q := &sequences{got: make(chan int64, 10), gate: make(chan struct{})}
	srv := httptest.NewServer(q)
	defer srv.Close()
	p, err := NewPusher(srv.URL, PushOptions{})
	require.NoError(t, err)
	p.Offer(summaryN(1))
	// 1 is on the wire, held at the gate; 2..100 supersede one another.
	require.Eventually(t, func() bool { return len(p.mailbox) == 0 }, 5*time.Second, time.Millisecond)
	start := time.Now()
	for i := uint64(2); i <= 100; i++ {
		p.Offer(summaryN(i))
	}
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Offer returns at once while a push hangs")
	q.gate <- struct{}{}
	assert.Equal(t, int64(1), <-q.got)
	q.gate <- struct{}{}
	assert.Equal(t, int64(100), <-q.got, "the newest summary is the one sent next")
	p.Close(5 * time.Second)
	st := p.Stats()
	assert.Equal(t, uint64(2), st.Pushed)
	assert.Equal(t, uint64(98), st.Dropped, "2..99 were superseded")
	assert.Contains(t, st.LastError, "superseded by a newer summary")
}

func TestPusherCollectorDownAndBack(t *testing.T) {
	port := testutil.FreePort(t)
	p, err := NewPusher("http://127.0.0.1:"+strconv.Itoa(port), PushOptions{Timeout: time.Second})
	require.NoError(t, err)
	defer p.Close(time.Second)
	p.Offer(summaryN(1))
	require.Eventually(t, func() bool { return p.Stats().Dropped == 1 }, 5*time.Second, time.Millisecond)
	assert.Contains(t, p.Stats().LastError, "no collector reachable")
	assert.NotContains(t, p.Stats().LastError, "attempts", "a push is tried once: the next summary is the retry")

	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	l, err := listenOn(port)
	require.NoError(t, err)
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	p.Offer(summaryN(2))
	require.Eventually(t, func() bool { return p.Stats().Pushed == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), hits.Load())
	assert.Equal(t, uint64(1), p.Stats().Dropped)
}

// A summary superseded while the pusher catches up does not hide why it fell
// behind: the failed push's error stays the last one (an aggregate session's
// final summary, written as the last summary supersedes a waiting one, named
// only "superseded" on a loaded CI machine).
func TestASupersededSummaryKeepsThePushErrorAsTheLast(t *testing.T) {
	p, err := NewPusher("http://127.0.0.1:"+strconv.Itoa(testutil.FreePort(t)), PushOptions{Timeout: time.Second})
	require.NoError(t, err)
	defer p.Close(time.Second)
	p.superseded() // before any push failed: the only reason there is
	assert.Equal(t, uint64(1), p.Stats().Dropped)
	assert.Contains(t, p.Stats().LastError, "superseded by a newer summary")
	p.Offer(summaryN(1))
	require.Eventually(t, func() bool { return p.Stats().Dropped == 2 }, 5*time.Second, time.Millisecond)
	assert.Contains(t, p.Stats().LastError, "no collector reachable", "a failed push replaces it")
	p.superseded()
	st := p.Stats()
	assert.Equal(t, uint64(3), st.Dropped, "counted all the same")
	assert.Contains(t, st.LastError, "no collector reachable", "and the cause stays the last error")
}

func TestNewPusherRefusesABadEndpoint(t *testing.T) {
	_, err := NewPusher("localhost:4318", PushOptions{})
	assert.ErrorContains(t, err, "want an http:// or https:// URL")
}

func listenOn(port int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
}
