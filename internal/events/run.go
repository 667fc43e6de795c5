package events

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Run is the provenance of one capture, given to ct_open as JSON and written into meta.
type Run struct {
	Entrypoint, CorrelationID, Device, Phase, TimingMode string
	CaptureStep, WarmupSteps                             uint64
	MeasuredRegionDeviceSynchronized                     bool
	// MeasuredRoot makes the root span s1 the measured region. It is a session setting,
	// not a meta field.
	MeasuredRoot  bool
	Contract      CaptureContract
	Identity      *ComparisonIdentity
	Tags          map[string]string // never nil after ParseRun
	CandleVersion string            // "" = absent
	// Mode is "trace" (the default: a candle-graph/trace/10 capture of one
	// step) or "aggregate" (statistics over the whole run in a
	// candle-trace/aggregate/1 summary; capture_step is then optional).
	Mode string
	// AggregateIntervalMs is how often an aggregate summary is rewritten
	// (0 = the aggregate package's default).
	AggregateIntervalMs uint64
	// OTLPEndpoint, for an aggregate session, is the OpenTelemetry
	// Collector (OTLP/HTTP base URL) each summary is also pushed to; ""
	// means none (or $CANDLE_TRACE_OTLP_ENDPOINT, which the session reads).
	OTLPEndpoint string
	// Binding names the binding that wrote the trace (meta.producer.binding),
	// e.g. "python" or "rust"; "" leaves the session's default. Not a meta
	// field of candle-graph's.
	Binding string
	// Buffer, when set ("buffer" in the run JSON), keeps the whole trace in
	// memory until ct_finish writes it or ct_discard drops it: the flight
	// recorder of one training update. nil: the trace is written as it is
	// recorded.
	Buffer *Buffer

	// warmupGiven and correlationGiven say whether the run JSON set
	// warmup_steps and correlation_id, or ParseRun defaulted them from
	// capture_step (WithCaptureStep defaults them again).
	warmupGiven, correlationGiven bool
}

// WithCaptureStep is a copy of r (a validated run) for capture step step
// (ct_reopen: a flight recorder's next update), with warmup_steps and
// correlation_id defaulted again from it where the run JSON left them out.
// Only what the step decides is checked again (Validate's rules on
// capture_step and warmup_steps, as ParseRun words them; a default
// correlation_id is never empty): the contract's checks, most of Validate,
// do not depend on it and ran when r was parsed. The copy shares r's tags,
// contract and identity, which nothing changes once parsed.
func (r *Run) WithCaptureStep(step uint64) (*Run, error) {
	if step == 0 {
		return nil, fmt.Errorf("run JSON: %q must be >= 1, got 0", "capture_step")
	}
	c := *r
	c.CaptureStep = step
	if !c.warmupGiven {
		c.WarmupSteps = step - 1
	}
	if c.WarmupSteps >= step {
		return nil, fmt.Errorf("run JSON: %q (%d) must be less than %q (%d)", "warmup_steps", c.WarmupSteps, "capture_step", step)
	}
	if !c.correlationGiven {
		c.CorrelationID = DefaultCorrelationID(c.Entrypoint, c.Phase, step)
	}
	return &c, nil
}

// MinCaptureStep is the lowest capture step WithCaptureStep accepts: above
// an explicit warmup_steps, else 1.
func (r *Run) MinCaptureStep() uint64 {
	if r.warmupGiven {
		return r.WarmupSteps + 1
	}
	return 1
}

// Buffer bounds a buffered session ("buffer": {"max_bytes": N}).
type Buffer struct {
	// MaxBytes is how many bytes of trace lines are kept before records that
	// the trace's structure does not need are dropped (counted, not refused).
	MaxBytes uint64
}

// DefaultBufferMaxBytes is "max_bytes" when "buffer" leaves it out (64 MiB);
// MaxBufferMaxBytes is the largest accepted (64 GiB).
const (
	DefaultBufferMaxBytes uint64 = 64 << 20
	MaxBufferMaxBytes     uint64 = 64 << 30
)

// runKeys are the keys the run JSON may carry; anything else is refused by name, because a
// misspelt optional key would otherwise silently take its default.
var runKeys = []string{
	"entrypoint", "phase", "capture_step", "device", "warmup_steps", "correlation_id",
	"timing_mode", "measured_region_device_synchronized", "capture_contract",
	"comparison_identity", "tags", "candle_version", "measured_root", "binding",
	"mode", "aggregate_interval_ms", "buffer", "otlp_endpoint",
}

// ParseRun parses and validates the run JSON given to ct_open.
//
// The input is read strictly: invalid UTF-8, duplicate keys, unknown keys (at any depth),
// wrong types, and non-integer numbers for integer fields are refused; null is accepted
// only where candle-graph has an Option (comparison_identity, candle_version,
// capture_contract.gradient_contract, comparison_identity.implementation_id and pair_id)
// and means absent. Defaults: correlation_id "<entrypoint>/update-<capture_step>" (train) or
// "<entrypoint>/inference-<capture_step>" (infer), warmup_steps capture_step-1, timing_mode
// "host", measured_region_device_synchronized and measured_root false, tags {}, and each
// capture_contract field CaptureContract::default()'s value (scope unknown, levels none).
//
// The gradient manifest digest is computed here from capture_contract.gradient_contract
// .expected. A caller may still give manifest_sha256 (e.g. copied from an existing trace);
// it is then verified and a mismatch is refused.
//
// Errors start with "run JSON: " and name the field.
func ParseRun(data []byte) (*Run, error) {
	r, err := parseRun(data)
	if err != nil {
		return nil, fmt.Errorf("run JSON: %w", err)
	}
	return r, nil
}

func parseRun(data []byte) (*Run, error) {
	tree, err := decodeStrict(data)
	if err != nil {
		return nil, err
	}
	obj, ok := tree.(*jsonObject)
	if !ok {
		return nil, fmt.Errorf("must be a JSON object, got %s", describe(tree))
	}
	f := fields{obj: obj}
	if err := f.checkKeys(runKeys...); err != nil {
		return nil, err
	}
	r := &Run{Tags: map[string]string{}}
	if r.Entrypoint, _, err = f.str("entrypoint", true, false); err != nil {
		return nil, err
	}
	if r.Device, _, err = f.str("device", true, false); err != nil {
		return nil, err
	}
	if r.Phase, err = f.enum("phase", true, "", traceformat.Phases...); err != nil {
		return nil, err
	}
	if r.Mode, err = f.enum("mode", false, "trace", "trace", "aggregate"); err != nil {
		return nil, err
	}
	var hasStep bool
	if r.CaptureStep, hasStep, err = f.uint("capture_step", r.Mode != "aggregate"); err != nil {
		return nil, err
	}
	if !hasStep {
		r.CaptureStep = 1 // an aggregate run covers every step
	}
	var hasInterval bool
	if r.AggregateIntervalMs, hasInterval, err = f.uint("aggregate_interval_ms", false); err != nil {
		return nil, err
	}
	if hasInterval && r.Mode != "aggregate" {
		return nil, fmt.Errorf("%q is only for \"mode\": \"aggregate\"", "aggregate_interval_ms")
	}
	if hasInterval && r.AggregateIntervalMs == 0 {
		return nil, fmt.Errorf("%q must be >= 1, got 0", "aggregate_interval_ms")
	}
	var hasEndpoint bool
	if r.OTLPEndpoint, hasEndpoint, err = f.str("otlp_endpoint", false, false); err != nil {
		return nil, err
	}
	if hasEndpoint && r.Mode != "aggregate" {
		return nil, fmt.Errorf("%q is only for \"mode\": \"aggregate\" (export a trace with candle-trace export --format otlp)", "otlp_endpoint")
	}
	if hasEndpoint && strings.TrimSpace(r.OTLPEndpoint) == "" {
		return nil, fmt.Errorf("%q must not be empty when present (omit it instead)", "otlp_endpoint")
	}
	if r.CaptureStep == 0 {
		return nil, fmt.Errorf("%q must be >= 1, got 0", "capture_step")
	}
	var hasWarmup bool
	if r.WarmupSteps, hasWarmup, err = f.uint("warmup_steps", false); err != nil {
		return nil, err
	}
	r.warmupGiven = hasWarmup
	if !hasWarmup {
		r.WarmupSteps = r.CaptureStep - 1
	}
	var hasCorr bool
	if r.CorrelationID, hasCorr, err = f.str("correlation_id", false, false); err != nil {
		return nil, err
	}
	r.correlationGiven = hasCorr
	if !hasCorr {
		r.CorrelationID = DefaultCorrelationID(r.Entrypoint, r.Phase, r.CaptureStep)
	}
	if r.TimingMode, err = f.enum("timing_mode", false, "host", traceformat.TimingModes...); err != nil {
		return nil, err
	}
	if r.MeasuredRegionDeviceSynchronized, err = f.boolean("measured_region_device_synchronized"); err != nil {
		return nil, err
	}
	if r.MeasuredRoot, err = f.boolean("measured_root"); err != nil {
		return nil, err
	}
	var hasVersion bool
	if r.CandleVersion, hasVersion, err = f.str("candle_version", false, true); err != nil {
		return nil, err
	}
	if hasVersion && strings.TrimSpace(r.CandleVersion) == "" {
		return nil, fmt.Errorf("%q must not be empty when present (omit it instead)", "candle_version")
	}
	var hasBinding bool
	if r.Binding, hasBinding, err = f.str("binding", false, false); err != nil {
		return nil, err
	}
	if hasBinding && strings.TrimSpace(r.Binding) == "" {
		return nil, fmt.Errorf("%q must not be empty when present (omit it instead)", "binding")
	}
	if err := parseTags(f, r.Tags); err != nil {
		return nil, err
	}
	if r.Buffer, err = parseBuffer(f, r.Mode); err != nil {
		return nil, err
	}
	cf, ok, err := f.object("capture_contract", false)
	if err != nil {
		return nil, err
	}
	if ok {
		if r.Contract, err = parseContract(cf); err != nil {
			return nil, err
		}
	}
	idf, ok, err := f.object("comparison_identity", true)
	if err != nil {
		return nil, err
	}
	if ok {
		if r.Identity, err = parseIdentity(idf); err != nil {
			return nil, err
		}
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// parseBuffer reads "buffer": an object with an optional "max_bytes"
// (1..MaxBufferMaxBytes, default DefaultBufferMaxBytes); nil when absent.
func parseBuffer(f fields, mode string) (*Buffer, error) {
	bf, ok, err := f.object("buffer", false)
	if err != nil || !ok {
		return nil, err
	}
	if mode == "aggregate" {
		return nil, fmt.Errorf("%q is only for \"mode\": \"trace\" (an aggregate summary is already bounded)", "buffer")
	}
	if err := bf.checkKeys("max_bytes"); err != nil {
		return nil, err
	}
	n, has, err := bf.uint("max_bytes", false)
	switch {
	case err != nil:
		return nil, err
	case !has:
		n = DefaultBufferMaxBytes
	case n == 0:
		return nil, fmt.Errorf("%s must be >= 1, got 0", bf.name("max_bytes"))
	case n > MaxBufferMaxBytes:
		return nil, fmt.Errorf("%s must be at most %d (64 GiB), got %d", bf.name("max_bytes"), MaxBufferMaxBytes, n)
	}
	return &Buffer{MaxBytes: n}, nil
}

func parseTags(f fields, dst map[string]string) error {
	v, present := f.get("tags")
	if !present {
		return nil
	}
	o, ok := v.(*jsonObject)
	if !ok {
		return fmt.Errorf("%q must be an object of string values, got %s (omit it for no tags)", "tags", describe(v))
	}
	for _, k := range o.keys {
		s, ok := o.vals[k].(string)
		if !ok {
			return fmt.Errorf("%q must be a string, got %s", "tags."+k, describe(o.vals[k]))
		}
		dst[k] = s
	}
	return nil
}

// DefaultCorrelationID is candle-graph's default correlation key for a run.
func DefaultCorrelationID(entrypoint, phase string, captureStep uint64) string {
	kind := "/update-"
	if phase == "infer" {
		kind = "/inference-"
	}
	return entrypoint + kind + strconv.FormatUint(captureStep, 10)
}

// Validate checks what candle-graph's TraceRunMeta::validate, CaptureContract::validate and
// ComparisonIdentity::validate check, plus the enum spellings; ParseRun calls it, and a
// Run built in Go should be checked with it before AppendMeta.
func (r *Run) Validate() error {
	for _, f := range [...]struct{ name, v string }{
		{"entrypoint", r.Entrypoint}, {"correlation_id", r.CorrelationID}, {"device", r.Device},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%q must be valid UTF-8", f.name)
		}
		if strings.TrimSpace(f.v) == "" {
			return fmt.Errorf("%q must not be empty", f.name)
		}
	}
	if r.Phase != "train" && r.Phase != "infer" {
		return fmt.Errorf("%q must be train or infer, got %q", "phase", r.Phase)
	}
	if r.TimingMode != "host" && r.TimingMode != "device_synchronized" {
		return fmt.Errorf("%q must be host or device_synchronized, got %q", "timing_mode", r.TimingMode)
	}
	if r.CaptureStep == 0 {
		return fmt.Errorf("%q must be >= 1, got 0", "capture_step")
	}
	if r.WarmupSteps >= r.CaptureStep {
		return fmt.Errorf("%q (%d) must be less than %q (%d)", "warmup_steps", r.WarmupSteps, "capture_step", r.CaptureStep)
	}
	if !utf8.ValidString(r.CandleVersion) {
		return fmt.Errorf("%q must be valid UTF-8", "candle_version")
	}
	for k, v := range r.Tags {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%q: tags must be valid UTF-8", "tags")
		}
	}
	if err := r.Contract.Validate(); err != nil {
		return err
	}
	if r.Identity != nil {
		if err := r.Identity.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// RequiredLabels returns a copy of the span names the contract requires exactly once.
func (r *Run) RequiredLabels() []string {
	return append([]string(nil), r.Contract.RequiredSemanticLabels...)
}

// ExpectedGradients returns a copy of the gradient manifest, nil when there is no gradient
// contract.
func (r *Run) ExpectedGradients() []ExpectedGradient {
	if r.Contract.GradientContract == nil {
		return nil
	}
	return append([]ExpectedGradient(nil), r.Contract.GradientContract.Expected...)
}
