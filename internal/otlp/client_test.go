package otlp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

func TestNewClientURLs(t *testing.T) {
	for _, tc := range []struct {
		endpoint, traces, metrics, err string
	}{
		{"http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/metrics", ""},
		{"http://collector:4318/", "http://collector:4318/v1/traces", "http://collector:4318/v1/metrics", ""},
		{"https://otel.example/prefix", "https://otel.example/prefix/v1/traces", "https://otel.example/prefix/v1/metrics", ""},
		{"http://c:4318/v1/traces", "http://c:4318/v1/traces", "http://c:4318/v1/metrics", ""},
		{"http://c:4318/v1/metrics", "http://c:4318/v1/traces", "http://c:4318/v1/metrics", ""},
		{"127.0.0.1:4318", "", "", "want an http:// or https:// URL"},
		{"grpc://c:4317", "", "", "want an http:// or https:// URL"},
		{"http://", "", "", "no host"},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			c, err := NewClient(tc.endpoint, ClientOptions{})
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.traces, c.URL(Traces))
			assert.Equal(t, tc.metrics, c.URL(Metrics))
		})
	}
}

// fakeCollector answers each request with the next of its replies (the
// last one repeats) and records what it got.
type fakeCollector struct {
	replies []func(w http.ResponseWriter)
	hits    atomic.Int32
	last    atomic.Pointer[http.Request]
	body    atomic.Pointer[[]byte]
}

func (f *fakeCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(f.hits.Add(1))
	b, _ := io.ReadAll(r.Body)
	f.last.Store(r)
	f.body.Store(&b)
	f.replies[min(n, len(f.replies))-1](w)
}

func reply(status int, contentType string, body []byte, header ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		w.Write(body)
	}
}

var ok200 = reply(http.StatusOK, "application/x-protobuf", nil)

func TestClientSend(t *testing.T) {
	fast := ClientOptions{Backoff: time.Millisecond, Headers: map[string]string{"Authorization": "Bearer t0ken"}}
	for _, tc := range []struct {
		name     string
		replies  []func(http.ResponseWriter)
		hits     int
		rejected int64
		status   int
		err      string
	}{
		{"accepted", []func(http.ResponseWriter){ok200}, 1, 0, 0, ""},
		{"partial success", []func(http.ResponseWriter){reply(200, "application/x-protobuf", encodePartialSuccess(5, "5 spans too old"))}, 1, 5, 0, ""},
		{"refused: no retry", []func(http.ResponseWriter){reply(400, "application/x-protobuf", encodeStatus(3, "span has no trace id"))}, 1, 0, 400,
			"the collector answered 400 Bad Request: span has no trace id"},
		{"not found: no retry", []func(http.ResponseWriter){reply(404, "text/plain", []byte("404 page not found\n"))}, 1, 0, 404,
			"the collector answered 404 Not Found: 404 page not found"},
		{"unavailable then accepted", []func(http.ResponseWriter){reply(503, "", nil), reply(502, "", nil), ok200}, 3, 0, 0, ""},
		{"throttled with Retry-After", []func(http.ResponseWriter){reply(429, "", nil, "Retry-After", "0"), ok200}, 2, 0, 0, ""},
		{"unavailable throughout", []func(http.ResponseWriter){reply(503, "application/x-protobuf", encodeStatus(14, "memory limiter"))}, 3, 0, 503,
			"the collector answered 503 Service Unavailable (after 3 attempts): memory limiter"},
		{"no message", []func(http.ResponseWriter){reply(500, "", nil)}, 1, 0, 500, "the collector answered 500 Internal Server Error: no message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := &fakeCollector{replies: tc.replies}
			srv := httptest.NewServer(fc)
			defer srv.Close()
			c, err := NewClient(srv.URL, fast)
			require.NoError(t, err)
			rep, err := c.Send(context.Background(), Metrics, []byte("payload"))
			assert.Equal(t, tc.hits, int(fc.hits.Load()), "requests")
			r := fc.last.Load()
			assert.Equal(t, http.MethodPost, r.Method)
			assert.Equal(t, "/v1/metrics", r.URL.Path)
			assert.Equal(t, "application/x-protobuf", r.Header.Get("Content-Type"))
			assert.Equal(t, "Bearer t0ken", r.Header.Get("Authorization"))
			assert.Equal(t, "payload", string(*fc.body.Load()), "every attempt sends the whole body")
			if tc.err != "" {
				var xe *ExportError
				require.ErrorAs(t, err, &xe)
				assert.Equal(t, tc.status, xe.Status)
				assert.EqualError(t, err, "POST "+srv.URL+"/v1/metrics: "+tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.hits, rep.Attempts)
			assert.Equal(t, tc.rejected, rep.Rejected)
		})
	}
}

func TestClientCollectorDown(t *testing.T) {
	url := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	c, err := NewClient(url, ClientOptions{Backoff: 10 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.Send(context.Background(), Traces, []byte("x"))
	var xe *ExportError
	require.ErrorAs(t, err, &xe)
	assert.Equal(t, 0, xe.Status)
	assert.Equal(t, DefaultAttempts, xe.Attempts)
	assert.Contains(t, err.Error(), "POST "+url+"/v1/traces: no collector reachable (after 3 attempts): ")
	assert.Contains(t, err.Error(), "connection refused")
	// 10 ms + 20 ms of backoff, and refusals are immediate.
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestClientStopsWithItsContext(t *testing.T) {
	fc := &fakeCollector{replies: []func(http.ResponseWriter){reply(503, "", nil)}}
	srv := httptest.NewServer(fc)
	defer srv.Close()
	c, err := NewClient(srv.URL, ClientOptions{Backoff: time.Hour, Attempts: 5})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Send(ctx, Traces, nil)
	assert.Error(t, err)
	assert.Equal(t, 1, int(fc.hits.Load()), "no retry once the caller gave up")
	assert.Less(t, time.Since(start), 5*time.Second)

	// A request that hangs ends at the timeout, and is retried.
	release := make(chan struct{})
	var hits atomic.Int32
	hang := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1); <-release }))
	defer hang.Close()
	defer close(release) // before Close, which waits for the handlers
	c, err = NewClient(hang.URL, ClientOptions{Timeout: 50 * time.Millisecond, Attempts: 2, Backoff: time.Millisecond})
	require.NoError(t, err)
	_, err = c.Send(context.Background(), Traces, nil)
	var xe *ExportError
	require.ErrorAs(t, err, &xe)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Equal(t, int32(2), hits.Load())
}

func TestRetryAfter(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "3": 3 * time.Second, " 1 ": time.Second, "-1": 0, "Wed, 21 Oct 2015 07:28:00 GMT": 0} {
		assert.Equal(t, want, retryAfter(in), in)
	}
}
