package testutil

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Otelcol returns the OpenTelemetry Collector the OTLP tests export to:
// $CANDLE_TRACE_OTELCOL, else build/tools/otelcol/otelcol (make otelcol).
// Without it the test is skipped, except in CI (CI set), where it fails:
// CI builds it.
func Otelcol(t testing.TB) string {
	t.Helper()
	return Tool(t, "the OpenTelemetry Collector", os.Getenv("CANDLE_TRACE_OTELCOL"), filepath.Join("build", "tools", "otelcol", "otelcol"), "make otelcol")
}

// Collector is a real OpenTelemetry Collector on 127.0.0.1, receiving
// OTLP/HTTP and writing what it receives with the file exporter, traces
// and metrics into two files of OTLP JSON lines (one request a line).
type Collector struct {
	t          testing.TB
	bin        string
	Dir        string
	Port       int
	Config     string // the config file
	TracesOut  string
	MetricsOut string

	mu     sync.Mutex
	proc   *os.Process
	exited chan error
	log    *syncBuffer
}

// syncBuffer is the collector's output, written by exec's copying
// goroutine while a test may read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// CollectorConfig is the config the tests run the collector with; %d is
// the port, the two %s the output files. The file exporter flushes every
// 10 ms and appends, so a restarted collector adds to what it wrote.
const CollectorConfig = `receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  file/traces:
    path: %s
    append: true
    flush_interval: 10ms
  file/metrics:
    path: %s
    append: true
    flush_interval: 10ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file/traces]
    metrics:
      receivers: [otlp]
      exporters: [file/metrics]
`

// StartCollector writes a config for a free port and starts the collector;
// it is stopped when the test ends.
func StartCollector(t testing.TB) *Collector {
	t.Helper()
	return StartCollectorWith(t, func(port int, tracesOut, metricsOut string) string {
		return fmt.Sprintf(CollectorConfig, port, tracesOut, metricsOut)
	})
}

// StartCollectorWith starts the collector with the config that config
// writes for a free port and the two output files.
func StartCollectorWith(t testing.TB, config func(port int, tracesOut, metricsOut string) string) *Collector {
	t.Helper()
	bin := Otelcol(t)
	dir := t.TempDir()
	c := &Collector{t: t, bin: bin, Dir: dir, Port: FreePort(t),
		Config: filepath.Join(dir, "otelcol.yaml"), TracesOut: filepath.Join(dir, "traces.jsonl"), MetricsOut: filepath.Join(dir, "metrics.jsonl")}
	require.NoError(t, os.WriteFile(c.Config, []byte(config(c.Port, c.TracesOut, c.MetricsOut)), 0o644))
	c.Start()
	t.Cleanup(c.Stop)
	return c
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Endpoint is the collector's OTLP/HTTP base URL.
func (c *Collector) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(c.Port) }

// Start starts the collector (again) and waits until it accepts
// connections.
func (c *Collector) Start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Nil(c.t, c.proc, "collector already running")
	log := &syncBuffer{}
	cmd := exec.Command(c.bin, "--config", "file:"+c.Config)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(c.t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(c.Port), 200*time.Millisecond)
		if err == nil {
			conn.Close()
			c.proc, c.exited, c.log = cmd.Process, exited, log
			return
		}
		select {
		case err := <-exited:
			c.t.Fatalf("the collector exited before listening on %d: %v\n%s", c.Port, err, log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			c.t.Fatalf("the collector did not listen on %d within 20 s:\n%s", c.Port, log.String())
		}
	}
}

// Stop stops the collector the way a service manager does (SIGTERM: the
// file exporter flushes), killing it after 10 s. A no-op when stopped.
func (c *Collector) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return
	}
	_ = c.proc.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.proc.Kill()
		<-c.exited
	}
	c.proc = nil
}

// Log is what the collector printed.
func (c *Collector) Log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.log == nil {
		return ""
	}
	return c.log.String()
}

// Lines returns the complete JSON lines of an output file (none when it
// does not exist yet): a line the exporter is still writing is left out.
func (c *Collector) Lines(path string) [][]byte {
	c.t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(c.t, err)
	var out [][]byte
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return out
		}
		if line := bytes.TrimSpace(data[:i]); len(line) > 0 {
			out = append(out, line)
		}
		data = data[i+1:]
	}
}
