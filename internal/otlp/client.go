package otlp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Signal is what a request carries; it names the OTLP/HTTP path.
type Signal string

const (
	Traces  Signal = "traces"
	Metrics Signal = "metrics"
)

// DefaultEndpoint is OTLP/HTTP's default: a collector on this machine.
const DefaultEndpoint = "http://localhost:4318"

// ClientOptions configure a Client. The zero value sends with the defaults.
type ClientOptions struct {
	// Headers go on every request (an Authorization token, a tenant id).
	Headers map[string]string
	// Timeout bounds one request, retries not counted (DefaultTimeout).
	Timeout time.Duration
	// Attempts is how many times a request is tried when the collector
	// cannot be reached or answers that it is overloaded (429, 502, 503,
	// 504): DefaultAttempts when 0, 1 for no retry.
	Attempts int
	// Backoff is the wait before the first retry, doubled after each
	// (DefaultBackoff); a Retry-After from the collector replaces it, up to
	// MaxRetryAfter.
	Backoff time.Duration
	// HTTPClient replaces the default client (tests).
	HTTPClient *http.Client
}

const (
	DefaultTimeout  = 10 * time.Second
	DefaultAttempts = 3
	DefaultBackoff  = 200 * time.Millisecond
	MaxRetryAfter   = 5 * time.Second
)

// Client posts OTLP/HTTP protobuf requests to one collector.
type Client struct {
	traces, metrics string
	opts            ClientOptions
	http            *http.Client
}

// NewClient returns a client for endpoint: a base URL, to which
// /v1/traces and /v1/metrics are appended (OTEL_EXPORTER_OTLP_ENDPOINT's
// rule), or a URL that already ends in one of them, used as it is for
// that signal.
func NewClient(endpoint string, opts ClientOptions) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("OTLP endpoint %q: want an http:// or https:// URL (OTLP/HTTP), e.g. %s", endpoint, DefaultEndpoint)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("OTLP endpoint %q: no host", endpoint)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Attempts <= 0 {
		opts.Attempts = DefaultAttempts
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultBackoff
	}
	c := &Client{opts: opts, http: opts.HTTPClient}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	base := strings.TrimRight(u.String(), "/")
	switch {
	case strings.HasSuffix(u.Path, "/v1/traces"):
		c.traces = base
		c.metrics = strings.TrimSuffix(base, "/v1/traces") + "/v1/metrics"
	case strings.HasSuffix(u.Path, "/v1/metrics"):
		c.metrics = base
		c.traces = strings.TrimSuffix(base, "/v1/metrics") + "/v1/traces"
	default:
		c.traces, c.metrics = base+"/v1/traces", base+"/v1/metrics"
	}
	return c, nil
}

// URL is where the client posts a signal.
func (c *Client) URL(s Signal) string {
	if s == Metrics {
		return c.metrics
	}
	return c.traces
}

// ExportError is a request the collector did not accept.
type ExportError struct {
	URL      string
	Status   int    // the HTTP status; 0 when the collector was not reached
	Message  string // the collector's own explanation, when it gave one
	Attempts int
	Err      error // the transport error when Status is 0
}

func (e *ExportError) Error() string {
	tries := ""
	if e.Attempts > 1 {
		tries = fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	if e.Status == 0 {
		// url.Error repeats the method and URL this message starts with.
		cause := e.Err
		var uerr *url.Error
		if errors.As(cause, &uerr) {
			cause = uerr.Err
		}
		return fmt.Sprintf("POST %s: no collector reachable%s: %v", e.URL, tries, cause)
	}
	msg := e.Message
	if msg == "" {
		msg = "no message"
	}
	return fmt.Sprintf("POST %s: the collector answered %d %s%s: %s", e.URL, e.Status, http.StatusText(e.Status), tries, msg)
}

func (e *ExportError) Unwrap() error { return e.Err }

// Reply is what an accepted request brought back.
type Reply struct {
	// Rejected counts the spans or data points the collector accepted the
	// request for but did not keep (partial_success), Message says why.
	Rejected int64
	Message  string
	Attempts int
}

// Send posts one protobuf request body (an ExportTraceServiceRequest or
// ExportMetricsServiceRequest) and retries where that can help: when the
// collector could not be reached or answered 429, 502, 503 or 504. Every
// other answer is final; a 2xx is success. The context bounds it all.
func (c *Client) Send(ctx context.Context, s Signal, body []byte) (*Reply, error) {
	u := c.URL(s)
	wait := c.opts.Backoff
	var last *ExportError
	for attempt := 1; ; attempt++ {
		rep, xerr, retryAfter := c.post(ctx, u, body)
		if xerr == nil {
			rep.Attempts = attempt
			return rep, nil
		}
		xerr.Attempts = attempt
		last = xerr
		if attempt >= c.opts.Attempts || !retryable(xerr) || ctx.Err() != nil {
			return nil, last
		}
		if retryAfter > 0 {
			wait = min(retryAfter, MaxRetryAfter)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, last
		case <-t.C:
		}
		wait *= 2
	}
}

func (c *Client) post(ctx context.Context, u string, body []byte) (*Reply, *ExportError, time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, &ExportError{URL: u, Err: err}, 0
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range c.opts.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &ExportError{URL: u, Err: err}, 0
	}
	defer resp.Body.Close()
	// A reply is a few bytes; more is not a collector's.
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return nil, &ExportError{URL: u, Status: resp.StatusCode, Message: errorMessage(resp.Header.Get("Content-Type"), data)}, retryAfter(resp.Header.Get("Retry-After"))
	}
	if err != nil {
		// Accepted: the data is in. An unreadable reply only loses the
		// partial-success count.
		return &Reply{}, nil, 0
	}
	rep := &Reply{}
	if strings.Contains(strings.ToLower(resp.Header.Get("Content-Type")), "protobuf") {
		if ps, err := parsePartialSuccess(data); err == nil {
			rep.Rejected, rep.Message = ps.Rejected, clip(ps.Message)
		}
	}
	return rep, nil, 0
}

func retryable(e *ExportError) bool {
	switch e.Status {
	case 0:
		// Not reached: a collector starting or restarting, or a timeout.
		// Not when the caller gave up.
		return !errors.Is(e.Err, context.Canceled)
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryAfter reads a Retry-After header in seconds (the form collectors
// send); 0 when absent or another form.
func retryAfter(h string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
