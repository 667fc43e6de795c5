package otlp

import (
	"sort"
	"strconv"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// DefaultServiceName is service.name unless an option says otherwise.
const DefaultServiceName = "candle-trace"

// ScopeName is the instrumentation scope of everything exported.
const ScopeName = "candle-trace"

// Resource attribute keys. service.name, host.name and process.pid are
// OpenTelemetry's semantic conventions; the candle.* keys are ours (there
// is no convention for a training rank).
const (
	AttrServiceName   = "service.name"
	AttrHostName      = "host.name"
	AttrProcessPID    = "process.pid"
	AttrRunID         = "candle.run_id"
	AttrCorrelationID = "candle.correlation_id"
	AttrEntrypoint    = "candle.entrypoint"
	AttrPhase         = "candle.phase"
	AttrCaptureStep   = "candle.capture_step"
	AttrDevice        = "candle.device"
	AttrRank          = "candle.rank"
	AttrWorldSize     = "candle.world_size"
	AttrBinding       = "candle.binding"
	AttrSchema        = "candle.schema"
	AttrTagPrefix     = "candle.tag."
)

// Resource describes the process that measured: what a trace's meta line
// or a summary's run and producer say. Empty fields are left out; rank,
// world size and pid are numbers when they parse as one.
type Resource struct {
	ServiceName                                 string // DefaultServiceName when ""
	RunID, CorrelationID, Entrypoint, Phase     string
	CaptureStep                                 uint64 // 0: left out
	Device, Rank, WorldSize, Host, PID, Binding string
	Schema                                      string
	Tags                                        map[string]string
}

// Put writes the attributes into r.
func (res *Resource) Put(r pcommon.Resource) {
	a := r.Attributes()
	service := res.ServiceName
	if service == "" {
		service = DefaultServiceName
	}
	a.PutStr(AttrServiceName, service)
	for _, kv := range [...]struct{ k, v string }{
		{AttrRunID, res.RunID}, {AttrCorrelationID, res.CorrelationID}, {AttrEntrypoint, res.Entrypoint},
		{AttrPhase, res.Phase}, {AttrDevice, res.Device},
	} {
		if kv.v != "" {
			a.PutStr(kv.k, kv.v)
		}
	}
	if res.CaptureStep > 0 {
		a.PutInt(AttrCaptureStep, int64(min(res.CaptureStep, 1<<63-1)))
	}
	putIntOrStr(a, AttrRank, res.Rank)
	putIntOrStr(a, AttrWorldSize, res.WorldSize)
	if res.Host != "" {
		a.PutStr(AttrHostName, res.Host)
	}
	putIntOrStr(a, AttrProcessPID, res.PID)
	if res.Binding != "" {
		a.PutStr(AttrBinding, res.Binding)
	}
	if res.Schema != "" {
		a.PutStr(AttrSchema, res.Schema)
	}
	keys := make([]string, 0, len(res.Tags))
	for k := range res.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a.PutStr(AttrTagPrefix+k, res.Tags[k])
	}
}

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

// SummaryRunID names the run of a summary, which carries no run id of its
// own: "run-<pid>-<window start in unix ns>", the shape of a trace's run id.
func SummaryRunID(s *aggregate.Summary) string {
	return "run-" + strconv.Itoa(s.Producer.PID) + "-" + strconv.FormatUint(s.Window.StartUnixNS, 10)
}

// summaryResource describes the process of an aggregate summary. Rank and
// world size come from opts (the library's push knows RANK and
// WORLD_SIZE), else from the run's tags "rank" and "world_size".
func summaryResource(s *aggregate.Summary, opts *MetricsOptions) *Resource {
	res := &Resource{ServiceName: opts.ServiceName, RunID: SummaryRunID(s), CorrelationID: s.Run.CorrelationID,
		Entrypoint: s.Run.Entrypoint, Phase: s.Run.Phase, Device: s.Run.Device, Rank: opts.Rank, WorldSize: opts.WorldSize,
		Host: s.Producer.Hostname, Binding: s.Run.Binding, Schema: s.Schema, Tags: s.Run.Tags}
	if res.Rank == "" {
		res.Rank = s.Run.Tags["rank"]
	}
	if res.WorldSize == "" {
		res.WorldSize = s.Run.Tags["world_size"]
	}
	if s.Producer.PID > 0 {
		res.PID = strconv.Itoa(s.Producer.PID)
	}
	return res
}
