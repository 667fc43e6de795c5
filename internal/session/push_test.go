package session

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/otlp"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// The aggregate mode's push to a real collector: summaries arrive on the
// interval, a collector that is down costs drops (counted in the summary),
// never update time, and a restarted one receives again.

func pushRun(endpoint string, intervalMs int) []byte {
	return []byte(fmt.Sprintf(`{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":%d,"otlp_endpoint":%q}`, intervalMs, endpoint))
}

// update is one training update of the tests: a step span around a
// forward span, and the loss.
func update(t testing.TB, s *Session, i int) {
	step, err := s.BeginSpan("train/step", events.SpanFunction, events.StepNone)
	require.NoError(t, err)
	fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
	require.NoError(t, err)
	require.NoError(t, s.EndSpan(fwd))
	require.NoError(t, s.RecordScalar(step, "loss", float64(i)))
	require.NoError(t, s.EndSpan(step))
}

// updateUntil runs updates until cond holds, failing after 15 s.
func updateUntil(t *testing.T, s *Session, what string, cond func(aggregate.OTLPPush) bool) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	n := 0
	for !cond(s.aggr.push.Stats()) {
		require.True(t, time.Now().Before(deadline), "%s: %+v", what, s.aggr.push.Stats())
		update(t, s, n)
		n++
		if n%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return n
}

func lastMetrics(t *testing.T, c *testutil.Collector) (pmetric.Metrics, int) {
	t.Helper()
	lines := c.Lines(c.MetricsOut)
	require.NotEmpty(t, lines, "collector log:\n%s", c.Log())
	var u pmetric.JSONUnmarshaler
	md, err := u.UnmarshalMetrics(lines[len(lines)-1])
	require.NoError(t, err)
	return md, len(lines)
}

func histogramCounts(md pmetric.Metrics) map[string]uint64 {
	out := map[string]uint64{}
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := 0; i < ms.Len(); i++ {
		if ms.At(i).Name() != otlp.MetricSpanDuration {
			continue
		}
		pts := ms.At(i).Histogram().DataPoints()
		for j := 0; j < pts.Len(); j++ {
			name, _ := pts.At(j).Attributes().Get("candle.span.name")
			out[name.Str()] = pts.At(j).Count()
		}
	}
	return out
}

func TestAggregatePushReachesTheCollector(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	col := testutil.StartCollector(t)
	t.Setenv("RANK", "2")
	t.Setenv("WORLD_SIZE", "8")
	path := filepath.Join(t.TempDir(), "summary.json")
	s, err := Open(path, pushRun(col.Endpoint(), 20))
	require.NoError(t, err)
	updateUntil(t, s, "two summaries pushed", func(st aggregate.OTLPPush) bool { return st.Pushed >= 2 })
	require.NoError(t, s.Finish())

	sum, err := aggregate.ReadFile(path)
	require.NoError(t, err)
	require.NotNil(t, sum.OTLP, "the summary states how its pushes went")
	assert.Equal(t, col.Endpoint()+"/v1/metrics", sum.OTLP.Endpoint)
	assert.GreaterOrEqual(t, sum.OTLP.Pushed, uint64(2))
	assert.Zero(t, sum.OTLP.Dropped, sum.OTLP.LastError)
	// The final summary was pushed at finish: the collector's last metrics
	// are the file's.
	want := map[string]uint64{}
	for _, sp := range sum.Spans {
		want[sp.Name] = sp.Count
	}
	require.Eventually(t, func() bool {
		md, _ := lastMetrics(t, col)
		return assert.ObjectsAreEqual(want, histogramCounts(md))
	}, 10*time.Second, 20*time.Millisecond, "the collector has the final summary's counts %v", want)
	md, _ := lastMetrics(t, col)
	res := md.ResourceMetrics().At(0).Resource().Attributes()
	rank, _ := res.Get("candle.rank")
	world, _ := res.Get("candle.world_size")
	assert.Equal(t, []int64{2, 8}, []int64{rank.Int(), world.Int()}, "rank and world size from RANK and WORLD_SIZE")
	host, _ := os.Hostname()
	assert.Equal(t, aggregate.Producer{Name: "candle-trace", Version: Version, PID: os.Getpid(), Hostname: host}, sum.Producer)
	hostAttr, _ := res.Get("host.name")
	assert.Equal(t, host, hostAttr.Str())
}

func TestAggregatePushWithTheCollectorDownCountsDropsAndCostsNoUpdateTime(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Down: nothing listens. Hanging: accepts and never answers.
	down := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer hanging.Close()
	defer close(release)
	dir := t.TempDir()
	base, err := Open(filepath.Join(dir, "base.json"), []byte(`{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":5}`))
	require.NoError(t, err)
	toDown, err := Open(filepath.Join(dir, "down.json"), pushRun(down, 5))
	require.NoError(t, err)
	toHanging, err := Open(filepath.Join(dir, "hanging.json"), pushRun(hanging.URL, 5))
	require.NoError(t, err)

	// The three sessions' updates interleave, so that the machine's noise
	// falls on all of them alike; the medians are compared.
	sessions := []*Session{base, toDown, toHanging}
	times := make([][]time.Duration, len(sessions))
	const updates = 6000 // about 30 push intervals
	for i := 0; i < updates; i++ {
		for k, s := range sessions {
			t0 := time.Now()
			update(t, s, i)
			times[k] = append(times[k], time.Since(t0))
		}
		if i%200 == 0 {
			time.Sleep(time.Millisecond) // let the intervals pass
		}
	}
	medians := make([]time.Duration, len(times))
	for k := range times {
		slices.Sort(times[k])
		medians[k] = times[k][len(times[k])/2]
	}
	t.Logf("median update: %v without push, %v pushing to a collector that is down (×%.2f), %v to one that hangs (×%.2f)",
		medians[0], medians[1], float64(medians[1])/float64(medians[0]), medians[2], float64(medians[2])/float64(medians[0]))
	for k, name := range []string{"", "down", "hanging"} {
		if k > 0 {
			assert.Less(t, float64(medians[k]), 1.5*float64(medians[0])+float64(2*time.Microsecond), "pushing to a collector that is %s slows the update", name)
		}
	}
	downStats, hangStats := toDown.aggr.push.Stats(), toHanging.aggr.push.Stats()

	start := time.Now()
	require.NoError(t, toDown.Finish())
	assert.Less(t, time.Since(start), time.Second, "a collector that refuses connections costs finish nothing")
	start = time.Now()
	require.NoError(t, toHanging.Finish())
	assert.Less(t, time.Since(start), FinalPushWait+time.Second, "a collector that hangs costs finish FinalPushWait at most")
	require.NoError(t, base.Finish())

	assert.Zero(t, downStats.Pushed)
	assert.GreaterOrEqual(t, downStats.Dropped, uint64(3), "every summary to the collector that is down is dropped")
	assert.Contains(t, downStats.LastError, "no collector reachable")
	assert.Zero(t, hangStats.Pushed)
	assert.GreaterOrEqual(t, hangStats.Dropped, uint64(3), "summaries queued behind the hanging push are dropped")
	sum, err := aggregate.ReadFile(filepath.Join(dir, "down.json"))
	require.NoError(t, err)
	require.NotNil(t, sum.OTLP)
	assert.GreaterOrEqual(t, sum.OTLP.Dropped, downStats.Dropped, "the final summary states the drops")
	assert.Contains(t, sum.OTLP.LastError, "POST "+down+"/v1/metrics: no collector reachable")
	for _, sp := range sum.Spans {
		if sp.Name == "train/step" {
			assert.Equal(t, uint64(updates), sp.Count, "every update counted")
		}
	}
	baseSum, err := aggregate.ReadFile(filepath.Join(dir, "base.json"))
	require.NoError(t, err)
	assert.Nil(t, baseSum.OTLP, "no otlp block without a push")
}

func TestAggregatePushResumesWhenTheCollectorRestarts(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	col := testutil.StartCollector(t)
	path := filepath.Join(t.TempDir(), "summary.json")
	t.Setenv(OTLPEndpointEnv, col.Endpoint()) // the environment's way
	s, err := Open(path, []byte(`{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":20}`))
	require.NoError(t, err)
	updateUntil(t, s, "a first push", func(st aggregate.OTLPPush) bool { return st.Pushed >= 1 })
	col.Stop()
	before := s.aggr.push.Stats()
	updateUntil(t, s, "drops while the collector is down", func(st aggregate.OTLPPush) bool { return st.Dropped >= before.Dropped+2 })
	down := s.aggr.push.Stats()
	_, linesBefore := lastMetrics(t, col)
	col.Start()
	updateUntil(t, s, "pushes again after the restart", func(st aggregate.OTLPPush) bool { return st.Pushed >= down.Pushed+2 })
	require.NoError(t, s.Finish())

	sum, err := aggregate.ReadFile(path)
	require.NoError(t, err)
	require.NotNil(t, sum.OTLP)
	assert.GreaterOrEqual(t, sum.OTLP.Dropped, uint64(2))
	assert.GreaterOrEqual(t, sum.OTLP.Pushed, down.Pushed+2)
	require.Eventually(t, func() bool {
		_, n := lastMetrics(t, col)
		return n >= linesBefore+2
	}, 10*time.Second, 20*time.Millisecond, "the restarted collector wrote the new summaries")
	md, _ := lastMetrics(t, col)
	dropped := -1
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := 0; i < ms.Len(); i++ {
		if ms.At(i).Name() == otlp.MetricOTLPDropped {
			dropped = int(ms.At(i).Sum().DataPoints().At(0).IntValue())
		}
	}
	assert.GreaterOrEqual(t, dropped, 2, "the collector is told what it missed")
}
