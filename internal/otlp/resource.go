package otlp

import (
	"sort"
	"strconv"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/report"
)

// DefaultServiceName is service.name unless an option says otherwise.
const DefaultServiceName = "candle-trace"

// ScopeName is the instrumentation scope of everything exported.
const ScopeName = "candle-trace"

// Resource attribute keys. service.name, host.name and process.pid are
// OpenTelemetry's semantic conventions; the candle.* keys are ours (there
// is no convention for a training rank).
const (
	attrServiceName   = "service.name"
	attrHostName      = "host.name"
	attrProcessPID    = "process.pid"
	attrRunID         = "candle.run_id"
	attrCorrelationID = "candle.correlation_id"
	attrEntrypoint    = "candle.entrypoint"
	attrPhase         = "candle.phase"
	attrCaptureStep   = "candle.capture_step"
	attrDevice        = "candle.device"
	attrRank          = "candle.rank"
	attrWorldSize     = "candle.world_size"
	attrBinding       = "candle.binding"
	attrSchema        = "candle.schema"
	attrTagPrefix     = "candle.tag."
)

// putIntOrStr puts v as an int when it is one (a rank is a number), as a
// string otherwise, and nothing when it is empty.
func putIntOrStr(m pcommon.Map, k, v string) {
	if v == "" {
		return
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		m.PutInt(k, n)
		return
	}
	m.PutStr(k, v)
}

func putStr(m pcommon.Map, k, v string) {
	if v != "" {
		m.PutStr(k, v)
	}
}

func putTags(m pcommon.Map, tags map[string]string) {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		m.PutStr(attrTagPrefix+k, tags[k])
	}
}

// traceResource describes the process that wrote a trace, from its meta
// line: run, rank and world size (meta.process, which the library takes
// from RANK and WORLD_SIZE), host, pid, device.
func traceResource(m *report.Meta, service string) pcommon.Resource {
	res := pcommon.NewResource()
	a := res.Attributes()
	a.PutStr(attrServiceName, service)
	putStr(a, attrRunID, m.RunID)
	putStr(a, attrCorrelationID, m.CorrelationID)
	putStr(a, attrEntrypoint, m.Entrypoint)
	putStr(a, attrPhase, m.Phase)
	a.PutInt(attrCaptureStep, int64(m.CaptureStep))
	putStr(a, attrDevice, m.Device)
	putIntOrStr(a, attrRank, m.Process["rank"])
	putIntOrStr(a, attrWorldSize, m.Process["world_size"])
	putStr(a, attrHostName, m.Process["hostname"])
	putIntOrStr(a, attrProcessPID, m.Process["pid"])
	putStr(a, attrBinding, m.Producer["binding"])
	putStr(a, attrSchema, m.Schema)
	putTags(a, m.Tags)
	return res
}

// SummaryRunID names the run of a summary, which carries no run id of its
// own: "run-<pid>-<window start in unix ns>", the shape of a trace's run id.
func SummaryRunID(s *aggregate.Summary) string {
	return "run-" + strconv.Itoa(s.Producer.PID) + "-" + strconv.FormatUint(s.Window.StartUnixNS, 10)
}

// summaryResource describes the process of an aggregate summary. Rank and
// world size come from opts (the library's push knows RANK and
// WORLD_SIZE), else from the run's tags "rank" and "world_size".
func summaryResource(s *aggregate.Summary, opts *MetricsOptions) pcommon.Resource {
	res := pcommon.NewResource()
	a := res.Attributes()
	a.PutStr(attrServiceName, opts.serviceName())
	a.PutStr(attrRunID, SummaryRunID(s))
	putStr(a, attrCorrelationID, s.Run.CorrelationID)
	putStr(a, attrEntrypoint, s.Run.Entrypoint)
	putStr(a, attrPhase, s.Run.Phase)
	putStr(a, attrDevice, s.Run.Device)
	rank, world := opts.Rank, opts.WorldSize
	if rank == "" {
		rank = s.Run.Tags["rank"]
	}
	if world == "" {
		world = s.Run.Tags["world_size"]
	}
	putIntOrStr(a, attrRank, rank)
	putIntOrStr(a, attrWorldSize, world)
	putStr(a, attrHostName, s.Producer.Hostname)
	if s.Producer.PID > 0 {
		a.PutInt(attrProcessPID, int64(s.Producer.PID))
	}
	putStr(a, attrBinding, s.Run.Binding)
	a.PutStr(attrSchema, s.Schema)
	putTags(a, s.Run.Tags)
	return res
}
