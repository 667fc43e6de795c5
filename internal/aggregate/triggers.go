package aggregate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// The triggers that fired during a run (candle_trace.torch.watch, the
// Rust Schedule): each one by itself, in the order they fired, with the
// trace written for it. A trigger's scalar (trigger/<name>) folds its
// values; only this list says which update it was and where its trace is.

// DefaultMaxTriggers is how many firings a summary lists: a run writes a
// few traces at most, and a trigger that fires on every update past the
// cap says nothing more each time. Later ones are counted as refused.
const DefaultMaxTriggers = 256

// Limits of a firing's strings: a trigger's name is an identifier, its
// detail and trace names are a line each.
const (
	MaxTriggerNameBytes = 64
	MaxTriggerTextBytes = 1024
)

// Triggers is the summary's "triggers" block, present once a trigger fired.
type Triggers struct {
	Max     int      `json:"max"`     // the cap on Fired
	Refused uint64   `json:"refused"` // firings past the cap, counted only
	Fired   []Firing `json:"fired"`   // in the order they fired
}

// Firing is one trigger that fired: on which update, what it measured
// against which threshold, and the trace written for it — or, in NoTrace,
// why none was (the run's cap on traces reached, say). Exactly one of
// Trace and NoTrace is non-empty.
type Firing struct {
	Update    uint64       `json:"update"`
	Trigger   string       `json:"trigger"`
	Value     TriggerValue `json:"value"`
	Threshold float64      `json:"threshold"` // 0: none (an exception, the program's own call)
	Detail    string       `json:"detail"`
	Trace     string       `json:"trace"`
	NoTrace   string       `json:"no_trace"`
}

// TriggerValue is what a trigger measured: a JSON number, or for a value
// JSON has no number for (the NaN loss of non_finite) the string "NaN",
// "Infinity" or "-Infinity".
type TriggerValue float64

// MarshalJSON writes the number, or the string of a non-finite value.
func (v TriggerValue) MarshalJSON() ([]byte, error) {
	f := float64(v)
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"Infinity"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Infinity"`), nil
	}
	return json.Marshal(f)
}

// UnmarshalJSON reads what MarshalJSON writes and nothing else.
func (v *TriggerValue) UnmarshalJSON(data []byte) error {
	var s string
	if json.Unmarshal(data, &s) == nil {
		switch s {
		case "NaN":
			*v = TriggerValue(math.NaN())
		case "Infinity":
			*v = TriggerValue(math.Inf(1))
		case "-Infinity":
			*v = TriggerValue(math.Inf(-1))
		default:
			return fmt.Errorf("value %q: a number, or \"NaN\", \"Infinity\" or \"-Infinity\"", s)
		}
		return nil
	}
	var f float64
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("value %s: a number, or \"NaN\", \"Infinity\" or \"-Infinity\"", data)
	}
	*v = TriggerValue(f)
	return nil
}

// Check verifies one firing; a producer's call and the reader both use it.
func (f *Firing) Check() error {
	text := func(field, s string, limit int) error {
		switch {
		case len(s) > limit:
			return fmt.Errorf("%s is %d bytes, more than %d", field, len(s), limit)
		case !utf8.ValidString(s):
			return fmt.Errorf("%s is not valid UTF-8", field)
		}
		return nil
	}
	switch {
	case f.Update == 0:
		return errors.New("update must be >= 1 (the first update is 1)")
	case strings.TrimSpace(f.Trigger) == "":
		return errors.New("trigger must not be blank")
	case math.IsNaN(f.Threshold) || math.IsInf(f.Threshold, 0):
		return fmt.Errorf("threshold must be finite, got %v", f.Threshold)
	case (f.Trace == "") == (f.NoTrace == ""):
		return errors.New("give the trace written, or (no_trace) why none was: exactly one of the two")
	}
	for _, t := range []struct {
		field, s string
		limit    int
	}{{"trigger", f.Trigger, MaxTriggerNameBytes}, {"detail", f.Detail, MaxTriggerTextBytes},
		{"trace", f.Trace, MaxTriggerTextBytes}, {"no_trace", f.NoTrace, MaxTriggerTextBytes}} {
		if err := text(t.field, t.s, t.limit); err != nil {
			return err
		}
	}
	return nil
}

func (t *Triggers) check() error {
	if t.Max < 0 || len(t.Fired) > t.Max {
		return fmt.Errorf("triggers: %d listed, more than the cap %d", len(t.Fired), t.Max)
	}
	if len(t.Fired) == 0 && t.Refused == 0 {
		return errors.New("triggers: none fired (the block is left out then)")
	}
	for i := range t.Fired {
		if err := t.Fired[i].Check(); err != nil {
			return fmt.Errorf("triggers.fired[%d]: %w", i, err)
		}
	}
	return nil
}

// Fire lists one trigger that fired (checked first: an error says what is
// wrong and lists nothing). Past the cap it is counted as refused, not an
// error: the trace written for it, if any, is on disk regardless.
func (a *Aggregator) Fire(f Firing) error {
	if err := f.Check(); err != nil {
		return fmt.Errorf("aggregate: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.fired) >= a.cfg.maxTriggers {
		a.triggersRefused++
		return nil
	}
	a.fired = append(a.fired, f)
	return nil
}

// triggersSnapshot is the "triggers" block of a snapshot; nil when none
// fired. Called with a.mu held.
func (a *Aggregator) triggersSnapshot() *Triggers {
	if len(a.fired) == 0 && a.triggersRefused == 0 {
		return nil
	}
	return &Triggers{Max: a.cfg.maxTriggers, Refused: a.triggersRefused, Fired: append([]Firing(nil), a.fired...)}
}
