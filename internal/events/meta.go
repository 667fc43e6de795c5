package events

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Schema is the trace schema this package writes.
const Schema = traceformat.Schema

// MetaPrefix is how every trace AppendMeta begins: the first bytes of its
// meta line.
const MetaPrefix = `{"kind":"meta","schema":"` + Schema + `"`

// IsTrace tells a trace this package wrote (whole, partial or failed) from
// anything else by its first bytes.
func IsTrace(prefix []byte) bool { return bytes.HasPrefix(prefix, []byte(MetaPrefix)) }

// MetaExtras are the meta fields the session supplies at open. producer, clock and process
// are ours; candle-graph ignores them.
type MetaExtras struct {
	RunID, Timestamp                               string // Timestamp as FormatTimestamp writes it
	ProducerName, ProducerVersion, ProducerBinding string
	WallUnixNsAtOpen                               uint64
	PID                                            int
	Hostname                                       string
	Rank, WorldSize                                int // < 0 = omit
}

// Validate checks the fields candle-graph requires of meta (run_id and timestamp non-blank).
func (x MetaExtras) Validate() error {
	for _, f := range [...]struct{ name, v string }{{"run_id", x.RunID}, {"timestamp", x.Timestamp}} {
		if !utf8.ValidString(f.v) || strings.TrimSpace(f.v) == "" {
			return fmt.Errorf("meta: %q must be non-empty valid UTF-8", f.name)
		}
	}
	return nil
}

// FormatTimestamp formats t as UTC "YYYY-MM-DDTHH:MM:SS.mmmZ", the form candle-graph writes.
func FormatTimestamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// AppendMeta appends the meta line. It writes every field candle-graph reads, with
// defaulted fields always present (tags as {} when empty, required_semantic_labels as []
// when empty) because null is a parse error there, then our producer, clock and process.
// Call r.Validate (ParseRun does) and x.Validate first.
func (r *Run) AppendMeta(b []byte, x MetaExtras) []byte {
	b = append(b, MetaPrefix+`,"run_id":`...)
	b = appendString(b, x.RunID)
	b = append(b, `,"correlation_id":`...)
	b = appendString(b, r.CorrelationID)
	b = append(b, `,"entrypoint":`...)
	b = appendString(b, r.Entrypoint)
	b = append(b, `,"phase":`...)
	b = appendString(b, r.Phase)
	b = append(b, `,"timestamp":`...)
	b = appendString(b, x.Timestamp)
	b = append(b, `,"capture_step":`...)
	b = strconv.AppendUint(b, r.CaptureStep, 10)
	b = append(b, `,"warmup_steps":`...)
	b = strconv.AppendUint(b, r.WarmupSteps, 10)
	b = append(b, `,"device":`...)
	b = appendString(b, r.Device)
	b = append(b, `,"measured_region_device_synchronized":`...)
	b = appendBool(b, r.MeasuredRegionDeviceSynchronized)
	b = append(b, `,"timing_mode":`...)
	b = appendString(b, r.TimingMode)
	b = append(b, `,"capture_contract":`...)
	b = r.Contract.appendJSON(b)
	if r.Identity != nil {
		b = append(b, `,"comparison_identity":`...)
		b = r.Identity.appendJSON(b)
	}
	b = append(b, `,"tags":{`...)
	keys := make([]string, 0, len(r.Tags))
	for k := range r.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys) // candle-graph keeps tags in a BTreeMap; same order here
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, r.Tags[k])
	}
	b = append(b, '}')
	if r.CandleVersion != "" {
		b = append(b, `,"candle_version":`...)
		b = appendString(b, r.CandleVersion)
	}
	b = append(b, `,"producer":{"name":`...)
	b = appendString(b, x.ProducerName)
	b = append(b, `,"version":`...)
	b = appendString(b, x.ProducerVersion)
	b = append(b, `,"binding":`...)
	b = appendString(b, x.ProducerBinding)
	b = append(b, `},"clock":{"host":"monotonic","wall_unix_ns_at_open":`...)
	b = strconv.AppendUint(b, x.WallUnixNsAtOpen, 10)
	b = append(b, `},"process":{"pid":`...)
	b = strconv.AppendInt(b, int64(x.PID), 10)
	if x.Hostname != "" {
		b = append(b, `,"hostname":`...)
		b = appendString(b, x.Hostname)
	}
	if x.Rank >= 0 {
		b = append(b, `,"rank":`...)
		b = strconv.AppendInt(b, int64(x.Rank), 10)
	}
	if x.WorldSize >= 0 {
		b = append(b, `,"world_size":`...)
		b = strconv.AppendInt(b, int64(x.WorldSize), 10)
	}
	return append(b, "}}\n"...)
}

func (c *CaptureContract) appendJSON(b []byte) []byte {
	b = append(b, `{"measurement_scope":"`...)
	b = append(b, c.MeasurementScope.String()...)
	b = append(b, `","operations":"`...)
	b = append(b, c.Operations.String()...)
	b = append(b, `","activations":"`...)
	b = append(b, c.Activations.String()...)
	b = append(b, `","tensors":"`...)
	b = append(b, c.Tensors.String()...)
	b = append(b, `","gradients":"`...)
	b = append(b, c.Gradients.String()...)
	b = append(b, '"')
	if g := c.GradientContract; g != nil {
		b = append(b, `,"gradient_contract":{"manifest_sha256":`...)
		b = appendString(b, g.ManifestSHA256)
		b = append(b, `,"expected":[`...)
		for i, e := range g.Expected {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"root":`...)
			b = appendString(b, e.Root)
			b = append(b, `,"key":`...)
			b = appendString(b, e.Key)
			b = append(b, `,"family":`...)
			b = appendString(b, e.Family)
			b = append(b, '}')
		}
		b = append(b, `],"families":[`...)
		for i, f := range g.Families {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"family":`...)
			b = appendString(b, f.Family)
			b = append(b, `,"expectation":"`...)
			b = append(b, f.Expectation.String()...)
			b = append(b, `","min_present":`...)
			b = strconv.AppendUint(b, f.MinPresent, 10)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
	}
	b = append(b, `,"logical_memory":"`...)
	b = append(b, c.LogicalMemory.String()...)
	b = append(b, `","physical_memory":"`...)
	b = append(b, c.PhysicalMemory.String()...)
	b = append(b, `","device_timing":"`...)
	b = append(b, c.DeviceTiming.String()...)
	b = append(b, `","required_semantic_labels":`...)
	b = appendStrings(b, c.RequiredSemanticLabels)
	if len(c.GPUExpectedSemanticLabels) > 0 {
		b = append(b, `,"gpu_expected_semantic_labels":`...)
		b = appendStrings(b, c.GPUExpectedSemanticLabels)
	}
	if len(c.CPUOnlySemanticLabels) > 0 {
		b = append(b, `,"cpu_only_semantic_labels":`...)
		b = appendStrings(b, c.CPUOnlySemanticLabels)
	}
	return append(b, '}')
}

func (c *ComparisonIdentity) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if c.ImplementationID != nil {
		b = append(b, `"implementation_id":`...)
		b = appendString(b, *c.ImplementationID)
		b = append(b, ',')
	}
	b = append(b, `"workload_id":`...)
	b = appendString(b, c.WorkloadID)
	b = append(b, `,"model_id":`...)
	b = appendString(b, c.ModelID)
	b = append(b, `,"config_id":`...)
	b = appendString(b, c.ConfigID)
	b = append(b, `,"data_id":`...)
	b = appendString(b, c.DataID)
	b = append(b, `,"seed_policy":`...)
	b = appendString(b, c.SeedPolicy)
	b = append(b, `,"physical_batch":`...)
	b = strconv.AppendUint(b, c.PhysicalBatch, 10)
	b = append(b, `,"accumulation_steps":`...)
	b = strconv.AppendUint(b, c.AccumulationSteps, 10)
	b = append(b, `,"precision":`...)
	b = appendString(b, c.Precision)
	b = append(b, `,"device_state":`...)
	b = appendString(b, c.DeviceState)
	if c.PairID != nil {
		b = append(b, `,"pair_id":`...)
		b = appendString(b, *c.PairID)
	}
	return append(b, '}')
}
