package aggregate

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func slowFiring(update uint64) Firing {
	return Firing{Update: update, Trigger: "slow", Value: 0.0685, Threshold: 0.0521,
		Detail: "68.5 ms > 52.1 ms (3 x median)", Trace: "update-000037-slow.jsonl"}
}

func TestFiringCheckRefusesBadFields(t *testing.T) {
	long := strings.Repeat("x", MaxTriggerTextBytes+1)
	for _, tc := range []struct {
		name string
		edit func(*Firing)
		msg  string
	}{
		{"update 0", func(f *Firing) { f.Update = 0 }, "update must be >= 1"},
		{"blank trigger", func(f *Firing) { f.Trigger = " " }, "trigger must not be blank"},
		{"long trigger", func(f *Firing) { f.Trigger = strings.Repeat("t", 65) }, "trigger is 65 bytes, more than 64"},
		{"trigger not UTF-8", func(f *Firing) { f.Trigger = "s\xff" }, "trigger is not valid UTF-8"},
		{"NaN threshold", func(f *Firing) { f.Threshold = math.NaN() }, "threshold must be finite"},
		{"infinite threshold", func(f *Firing) { f.Threshold = math.Inf(1) }, "threshold must be finite"},
		{"neither trace nor why", func(f *Firing) { f.Trace = "" }, "exactly one of the two"},
		{"both trace and why", func(f *Firing) { f.NoTrace = "cap reached" }, "exactly one of the two"},
		{"long detail", func(f *Firing) { f.Detail = long }, "detail is 1025 bytes, more than 1024"},
		{"trace not UTF-8", func(f *Firing) { f.Trace = "a\xffb" }, "trace is not valid UTF-8"},
		{"long no_trace", func(f *Firing) { f.Trace, f.NoTrace = "", long }, "no_trace is 1025 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := slowFiring(37)
			tc.edit(&f)
			err := f.Check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
			a := New()
			require.Error(t, a.Fire(f), "Fire checks too")
			assert.Nil(t, a.Snapshot().Triggers, "nothing listed")
		})
	}
	f := slowFiring(1)
	f.Value = TriggerValue(math.NaN()) // a value may be non-finite: the NaN loss
	assert.NoError(t, f.Check())
}

func TestFiringsAreListedInOrderUpToTheCapThenCounted(t *testing.T) {
	a := New(WithMaxTriggers(2))
	assert.Nil(t, a.Snapshot().Triggers, "no block before a trigger fired")
	nan := Firing{Update: 20, Trigger: "non_finite", Value: TriggerValue(math.NaN()), Detail: "loss nan", Trace: "update-000020-non_finite.jsonl"}
	capped := Firing{Update: 40, Trigger: "user", Value: 0.02, NoTrace: "the cap of 3 traces was reached"}
	for _, f := range []Firing{nan, slowFiring(37), capped} {
		require.NoError(t, a.Fire(f))
	}
	a.SetEnabled(false) // statistics off: a firing is still listed
	require.NoError(t, a.Fire(slowFiring(50)))
	tr := a.Snapshot().Triggers
	require.NotNil(t, tr)
	assert.Equal(t, 2, tr.Max)
	assert.Equal(t, uint64(2), tr.Refused)
	require.Len(t, tr.Fired, 2)
	assert.Equal(t, []uint64{20, 37}, []uint64{tr.Fired[0].Update, tr.Fired[1].Update})
	assert.True(t, math.IsNaN(float64(tr.Fired[0].Value)))
}

func TestTriggersRoundTripThroughTheFile(t *testing.T) {
	s := sample(t)
	s.Triggers = &Triggers{Max: DefaultMaxTriggers, Fired: []Firing{
		{Update: 20, Trigger: "non_finite", Value: TriggerValue(math.NaN()), Detail: "loss nan", Trace: "update-000020-non_finite.jsonl"},
		{Update: 21, Trigger: "non_finite", Value: TriggerValue(math.Inf(-1)), NoTrace: "cap"},
		slowFiring(37),
	}}
	data := encode(t, s)
	text := string(data)
	assert.Contains(t, text, "\n \"triggers\": {\"max\":256,\"refused\":0,\"fired\":[\n  {\"update\":20,\"trigger\":\"non_finite\",\"value\":\"NaN\",")
	assert.Contains(t, text, `"value":"-Infinity"`)
	assert.True(t, strings.HasSuffix(text, "]}\n}\n"), "the last field, one firing per line")
	got, err := Parse(data)
	require.NoError(t, err)
	require.Len(t, got.Triggers.Fired, 3)
	assert.True(t, math.IsNaN(float64(got.Triggers.Fired[0].Value)))
	assert.True(t, math.IsInf(float64(got.Triggers.Fired[1].Value), -1))
	assert.Equal(t, slowFiring(37), got.Triggers.Fired[2])
	// with an otlp block after it
	s.OTLP = &OTLPPush{Endpoint: "http://c:4318", Pushed: 1}
	_, err = Parse(encode(t, s))
	require.NoError(t, err)
	// a summary without triggers has no block
	s.Triggers, s.OTLP = nil, nil
	assert.NotContains(t, string(encode(t, s)), "triggers")
}

func TestTheReaderRefusesABadTriggersBlock(t *testing.T) {
	s := sample(t)
	s.Triggers = &Triggers{Max: 4, Fired: []Firing{slowFiring(37)}}
	good := string(encode(t, s))
	firing := `{"update":37,"trigger":"slow","value":0.0685,"threshold":0.0521,"detail":"68.5 ms > 52.1 ms (3 x median)","trace":"update-000037-slow.jsonl","no_trace":""}`
	require.Contains(t, good, firing)
	for _, tc := range []struct{ name, from, to, msg string }{
		{"missing field", `,"no_trace":""}`, `}`, `triggers.fired[]: missing "no_trace"`},
		{"unknown field", `"no_trace":""}`, `"no_trace":"","why":1}`, `unknown field "why"`},
		{"value as another string", `"value":0.0685`, `"value":"nan"`, `value "nan": a number, or "NaN"`},
		{"update 0", `"update":37`, `"update":0`, "triggers.fired[0]: update must be >= 1"},
		{"both trace and why", `"no_trace":""`, `"no_trace":"cap"`, "triggers.fired[0]: give the trace written"},
		{"more than the cap", `"max":4`, `"max":0`, "triggers: 1 listed, more than the cap 0"},
		{"an empty block", firing, ``, "triggers: none fired"},
		{"null", `"detail":"68.5 ms > 52.1 ms (3 x median)"`, `"detail":null`, "null is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(good, tc.from, tc.to, 1)
			require.NotEqual(t, good, bad)
			_, err := Parse([]byte(bad))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}
