package aggregate

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/events"
)

// Defaults of the options.
const (
	// DefaultMaxKeys caps the distinct (span name, step) pairs. A key costs
	// about 0.6 KiB plus 128 B per power of two its durations reach, so the
	// cap bounds span statistics to a few MiB whatever the program does.
	DefaultMaxKeys = 4096
	// DefaultMaxScalars caps the distinct scalar labels (about 100 B each).
	DefaultMaxScalars = 1024
	// DefaultMaxPeriods is how many enabled periods the summary lists (the
	// most recent ones); older ones are only counted.
	DefaultMaxPeriods = 64
	// MaxNameBytes caps a span name or scalar label, so that the name table
	// is bounded too.
	MaxNameBytes = 1024
)

// OverflowName is the reserved name under which observations of keys
// refused by the cap are counted. It cannot be interned.
const OverflowName = "(overflow)"

// Key is an interned (span name, step) pair: the index of its statistics.
// Keys are only meaningful to the Aggregator that issued them.
type Key uint32

// ScalarKey is an interned scalar label.
type ScalarKey uint32

// OverflowKey and OverflowScalar collect what did not fit under the caps.
const (
	OverflowKey    Key       = 0
	OverflowScalar ScalarKey = 0
)

// Observation is one span duration for a batch. Its layout (16 bytes: a
// 32-bit key, 32 bits of padding, a 64-bit duration) is meant to match a C
// struct, so that a batch written by a C per-thread buffer can be handed to
// ObserveBatch without conversion.
type Observation struct {
	Key        Key
	_          uint32
	DurationNS uint64
}

// Clock is the time source; tests substitute a fake one.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock is the real clock.
var SystemClock Clock = systemClock{}

// Option configures an Aggregator.
type Option func(*config)

type config struct {
	maxKeys, maxScalars, maxPeriods, maxTriggers int
	clock                                        Clock
	enabled                                      bool
}

// WithMaxKeys caps the distinct (name, step) pairs (DefaultMaxKeys); the
// overflow key is not counted.
func WithMaxKeys(n int) Option { return func(c *config) { c.maxKeys = n } }

// WithMaxScalars caps the distinct scalar labels (DefaultMaxScalars).
func WithMaxScalars(n int) Option { return func(c *config) { c.maxScalars = n } }

// WithMaxPeriods sets how many enabled periods are listed (DefaultMaxPeriods).
func WithMaxPeriods(n int) Option { return func(c *config) { c.maxPeriods = n } }

// WithMaxTriggers caps the firings listed (DefaultMaxTriggers).
func WithMaxTriggers(n int) Option { return func(c *config) { c.maxTriggers = n } }

// WithClock replaces the system clock.
func WithClock(clock Clock) Option { return func(c *config) { c.clock = clock } }

// WithEnabled sets whether the aggregator starts enabled (default true).
func WithEnabled(on bool) Option { return func(c *config) { c.enabled = on } }

type keyName struct {
	name string
	step events.Step
}

type spanStats struct {
	keyName
	count, total, min, max uint64
	hist                   histogram
}

func (s *spanStats) add(ns uint64) {
	s.count++
	if t := s.total + ns; t >= s.total {
		s.total = t
	} else {
		s.total = math.MaxUint64 // saturate: 584 years of nanoseconds
	}
	s.min = min(s.min, ns)
	s.max = max(s.max, ns)
	s.hist.add(ns)
}

type scalarStats struct {
	label               string
	count, nonFinite    uint64
	sum, min, max, last float64
}

type period struct{ start, end time.Duration } // offsets from the aggregator's start

// Aggregator folds span durations and scalar values into per-key
// statistics whose size does not depend on how many observations arrive.
//
// All methods are safe for concurrent use. The hot path is Observe with a
// key from Intern (an enabled check, a mutex, an array index and a few
// adds); producers that observe at high rates should batch (Buffer, or
// ObserveBatch from a per-thread buffer kept elsewhere, such as C), which
// takes the mutex once per batch.
type Aggregator struct {
	cfg     config
	enabled atomic.Bool
	start   time.Time

	mu             sync.Mutex
	keyIndex       map[keyName]Key
	spans          []*spanStats // indexed by Key; [0] is the overflow key
	scalarIndex    map[string]ScalarKey
	scalars        []*scalarStats
	keysRefused    uint64
	scalarsRefused uint64
	invalidKeys    uint64
	producerDrops  uint64
	// the triggers that fired (triggers.go): the first maxTriggers, then a count
	fired           []Firing
	triggersRefused uint64
	// enabled periods: count, total of closed ones, the newest closed ones
	// (ring), and the start of the open one.
	periods    uint64
	enabledDur time.Duration
	recent     []period
	recentNext int
	openSince  time.Duration
	open       bool
}

// New returns an Aggregator; it is enabled unless WithEnabled(false).
func New(opts ...Option) *Aggregator {
	cfg := config{maxKeys: DefaultMaxKeys, maxScalars: DefaultMaxScalars, maxPeriods: DefaultMaxPeriods, maxTriggers: DefaultMaxTriggers, clock: SystemClock, enabled: true}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.maxKeys = max(cfg.maxKeys, 0)
	cfg.maxScalars = max(cfg.maxScalars, 0)
	cfg.maxPeriods = max(cfg.maxPeriods, 1)
	cfg.maxTriggers = max(cfg.maxTriggers, 0)
	a := &Aggregator{
		cfg:         cfg,
		start:       cfg.clock.Now(),
		keyIndex:    map[keyName]Key{},
		spans:       []*spanStats{newSpanStats(keyName{name: OverflowName})},
		scalarIndex: map[string]ScalarKey{},
		scalars:     []*scalarStats{newScalarStats(OverflowName)},
	}
	if cfg.enabled {
		a.enabled.Store(true)
		a.periods, a.open = 1, true
	}
	return a
}

func newSpanStats(k keyName) *spanStats { return &spanStats{keyName: k, min: math.MaxUint64} }

func newScalarStats(label string) *scalarStats {
	return &scalarStats{label: label, min: math.Inf(1), max: math.Inf(-1)}
}

// ErrReservedName is returned for an attempt to intern OverflowName.
var ErrReservedName = errors.New("aggregate: " + OverflowName + " is reserved")

func checkName(what, name string) error {
	switch {
	case name == OverflowName:
		return ErrReservedName
	case strings.TrimSpace(name) == "":
		return fmt.Errorf("aggregate: %s must not be blank", what)
	case len(name) > MaxNameBytes:
		return fmt.Errorf("aggregate: %s is %d bytes, more than %d", what, len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("aggregate: %s must be valid UTF-8", what)
	}
	return nil
}

// Intern returns the key of (name, step), creating it on first use. When
// the cap is reached a new pair gets OverflowKey (and is counted as
// refused): its observations still count, under OverflowName. The error is
// for a blank, over-long, non-UTF-8 or reserved name, or an invalid step.
func (a *Aggregator) Intern(name string, step events.Step) (Key, error) {
	if err := checkName("span name", name); err != nil {
		return 0, err
	}
	if !step.Valid() {
		return 0, fmt.Errorf("aggregate: invalid step %d", uint32(step))
	}
	kn := keyName{name, step}
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.keyIndex[kn]; ok {
		return k, nil
	}
	if len(a.spans)-1 >= a.cfg.maxKeys {
		a.keysRefused++
		return OverflowKey, nil
	}
	k := Key(len(a.spans))
	// Copy the name: a caller's string may alias memory it reuses (a C
	// buffer converted without copying).
	kn.name = strings.Clone(name)
	a.keyIndex[kn] = k
	a.spans = append(a.spans, newSpanStats(kn))
	return k, nil
}

// Name returns the span name and step k was interned for; false for a key
// this aggregator did not issue.
func (a *Aggregator) Name(k Key) (string, events.Step, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if int(k) >= len(a.spans) {
		return "", 0, false
	}
	return a.spans[k].name, a.spans[k].step, true
}

// InternScalar returns the key of a scalar label; see Intern.
func (a *Aggregator) InternScalar(label string) (ScalarKey, error) {
	if err := checkName("scalar label", label); err != nil {
		return 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.scalarIndex[label]; ok {
		return k, nil
	}
	if len(a.scalars)-1 >= a.cfg.maxScalars {
		a.scalarsRefused++
		return OverflowScalar, nil
	}
	k := ScalarKey(len(a.scalars))
	label = strings.Clone(label)
	a.scalarIndex[label] = k
	a.scalars = append(a.scalars, newScalarStats(label))
	return k, nil
}

// Observe folds one span duration into k's statistics; nothing happens
// while the aggregator is disabled. A key this aggregator did not issue is
// counted as dropped (invalid_key).
func (a *Aggregator) Observe(k Key, ns uint64) {
	if !a.enabled.Load() {
		return
	}
	a.mu.Lock()
	a.fold(k, ns)
	a.mu.Unlock()
}

func (a *Aggregator) fold(k Key, ns uint64) {
	if int(k) >= len(a.spans) {
		a.invalidKeys++
		return
	}
	a.spans[k].add(ns)
}

// ObserveBatch folds a batch under one lock. It does not check Enabled: a
// batch's observations were gated when they were produced (Buffer does so,
// and so must a C buffer), so that a window switched off while a batch was
// in flight still counts what happened inside it.
func (a *Aggregator) ObserveBatch(batch []Observation) {
	if len(batch) == 0 {
		return
	}
	a.mu.Lock()
	for i := range batch {
		a.fold(batch[i].Key, batch[i].DurationNS)
	}
	a.mu.Unlock()
}

// ObserveSpan interns (name, step) and observes ns: the convenient, slower
// form for callers that do not keep keys.
func (a *Aggregator) ObserveSpan(name string, step events.Step, ns uint64) error {
	if !a.enabled.Load() {
		return nil
	}
	k, err := a.Intern(name, step)
	if err != nil {
		return err
	}
	a.Observe(k, ns)
	return nil
}

// Scalar folds one value into k's statistics; disabled aggregators ignore
// it. NaN and ±Inf are only counted (non_finite): JSON cannot carry them
// and they would poison the mean.
func (a *Aggregator) Scalar(k ScalarKey, v float64) {
	if !a.enabled.Load() {
		return
	}
	a.FoldScalar(k, v)
}

// FoldScalar is Scalar without the Enabled check, for values a producer
// gated when they were recorded (as ObserveBatch is for spans).
func (a *Aggregator) FoldScalar(k ScalarKey, v float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if int(k) >= len(a.scalars) {
		a.invalidKeys++
		return
	}
	s := a.scalars[k]
	if math.IsNaN(v) || math.IsInf(v, 0) {
		s.nonFinite++
		return
	}
	s.count++
	s.sum += v
	s.min = math.Min(s.min, v)
	s.max = math.Max(s.max, v)
	s.last = v
}

// ScalarByLabel interns label and records v.
func (a *Aggregator) ScalarByLabel(label string, v float64) error {
	if !a.enabled.Load() {
		return nil
	}
	k, err := a.InternScalar(label)
	if err != nil {
		return err
	}
	a.Scalar(k, v)
	return nil
}

// AddDropped counts observations a producer had to drop before they
// reached the aggregator (reported as dropped.producer).
func (a *Aggregator) AddDropped(n uint64) {
	a.mu.Lock()
	a.producerDrops += n
	a.mu.Unlock()
}

// Enabled reports whether observations are being folded.
func (a *Aggregator) Enabled() bool { return a.enabled.Load() }

// SetEnabled switches folding on or off, so that a training loop can keep
// statistics for a window of steps. Each switch on starts an enabled
// period, recorded in the summary. A producer with a buffer should flush
// it before switching off.
func (a *Aggregator) SetEnabled(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open == on {
		return
	}
	now := a.cfg.clock.Now().Sub(a.start)
	if on {
		a.periods++
		a.openSince, a.open = now, true
	} else {
		a.closePeriod(now)
	}
	a.enabled.Store(on)
}

func (a *Aggregator) closePeriod(now time.Duration) {
	p := period{a.openSince, now}
	a.enabledDur += p.end - p.start
	if len(a.recent) < a.cfg.maxPeriods {
		a.recent = append(a.recent, p)
	} else {
		a.recent[a.recentNext] = p
		a.recentNext = (a.recentNext + 1) % len(a.recent)
	}
	a.open = false
}

// Buffer batches observations for one producer (one goroutine or thread):
// Observe is an enabled check and an append, and every Size observations
// go to the aggregator under a single lock. It is not safe for concurrent
// use. What is still buffered is invisible to snapshots until Flush.
type Buffer struct {
	a   *Aggregator
	obs []Observation
}

// DefaultBufferSize is the batch size of NewBuffer(0): 16 KiB of records.
const DefaultBufferSize = 1024

// NewBuffer returns a Buffer that flushes every size observations
// (DefaultBufferSize when size <= 0).
func (a *Aggregator) NewBuffer(size int) *Buffer {
	if size <= 0 {
		size = DefaultBufferSize
	}
	return &Buffer{a: a, obs: make([]Observation, 0, size)}
}

// Observe records one duration for k.
func (b *Buffer) Observe(k Key, ns uint64) {
	if !b.a.enabled.Load() {
		return
	}
	b.obs = append(b.obs, Observation{Key: k, DurationNS: ns})
	if len(b.obs) == cap(b.obs) {
		b.Flush()
	}
}

// Flush hands what is buffered to the aggregator.
func (b *Buffer) Flush() {
	b.a.ObserveBatch(b.obs)
	b.obs = b.obs[:0]
}
