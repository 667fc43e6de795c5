package job

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testMeta is a meta record candle-graph accepts, with the fields the job
// view reads.
func testMeta(extra string) string {
	return `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"m::train/update-4","entrypoint":"m::train","phase":"train","timestamp":"2027-01-15T08:00:00.000Z","capture_step":4,"warmup_steps":2,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"complete","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":{"job_id":"j"}` + extra + `}`
}

func TestReadKeepsWhatTheAnalysisNeeds(t *testing.T) {
	trace := strings.Join([]string{
		testMeta(`,"clock":{"host":"monotonic","wall_unix_ns_at_open":77},"process":{"pid":1,"rank":5,"world_size":8}`),
		`{"kind":"span_start","id":"s1","name":"m::train","start_ns":0,"span_kind":"function"}`,
		`{"kind":"span_start","id":"s2","parent_id":"s1","name":"update","start_ns":100,"span_kind":"function","measured":true}`,
		`{"kind":"span_start","id":"s3","parent_id":"s2","name":"M","start_ns":100,"span_kind":"module","step":"forward"}`,
		`{"kind":"span_start","id":"s4","parent_id":"s3","name":"M.fc","start_ns":110,"span_kind":"module","step":"forward"}`,
		`{"kind":"op","span_id":"s4","op_name":"aten::mm","inputs":[],"shape":[1],"dtype":"f32","device":"cpu","duration_ns":50,"timestamp_ns":120,"input_dense_bytes":4}`,
		`{"kind":"op","span_id":"s4","op_name":"aten::relu","inputs":[],"shape":[1],"dtype":"f32","device":"cpu","duration_ns":40,"timestamp_ns":150,"input_dense_bytes":4}`,
		`{"kind":"memory","span_id":"s4","timestamp_ns":121,"action":"alloc","storage_id":"a","device":"cpu","dtype":"f32","op_name":"aten::mm","bytes":4,"shape":[1]}`,
		`{"kind":"span_end","id":"s4","duration_ns":90}`,
		`{"kind":"span_end","id":"s3","duration_ns":100}`,
		`{"kind":"op","span_id":"s2","op_name":"c10d::allreduce_","inputs":[],"shape":[8],"dtype":"f32","device":"cpu","duration_ns":5,"timestamp_ns":200,"input_dense_bytes":32}`,
		`{"kind":"op","span_id":"s2","op_name":"nccl:all_reduce","inputs":[],"shape":[8],"dtype":"f32","device":"cuda:0","duration_ns":60,"timestamp_ns":201,"output_dense_bytes":32,"input_dense_bytes":32}`,
		`{"kind":"span_end","id":"s2","duration_ns":300}`,
		`{"kind":"span_end","id":"s1","duration_ns":500}`,
		`{"kind":"terminal","outcome":"complete","timestamp_ns":500}`,
	}, "\n")
	tr, err := Read(strings.NewReader(trace), 0, ForAnalysis)
	require.NoError(t, err)
	assert.Equal(t, int64(5), tr.Rank)
	assert.Equal(t, int64(8), tr.WorldSize)
	assert.Equal(t, "j", tr.JobID)
	assert.Equal(t, "meta.process.rank", tr.RankFrom)
	assert.Equal(t, uint64(4), tr.CaptureStep)
	assert.Equal(t, uint64(77), tr.WallNS)
	assert.True(t, tr.Complete)
	require.NotNil(t, tr.Measured)
	assert.Equal(t, Span{ID: "s2", Name: "update", StartNS: 100, EndNS: 400, Measured: true, closed: true}, *tr.Measured)
	require.Len(t, tr.Phases, 1, "M.fc lies inside M: one phase span")
	assert.Equal(t, "s3", tr.Phases[0].ID)
	assert.Equal(t, []Collective{{Name: "nccl:all_reduce", Bytes: 32, EnterNS: 201, EndNS: 261}}, tr.Collectives)
	assert.Equal(t, 2, tr.Ops, "the c10d:: op is part of the collective, not compute")
	assert.Equal(t, []interval{{120, 190}}, tr.Busy)

	cut := trace[:strings.Index(trace, `{"kind":"span_end","id":"s2"`)+10]
	tr, err = Read(strings.NewReader(cut), 0, ForAnalysis)
	require.NoError(t, err, "a trace cut short is read to the cut")
	assert.Nil(t, tr.Measured, "the measured region never closed")
	assert.False(t, tr.Complete)

	// The job clock keeps the meta and the collectives alone.
	tr, err = Read(strings.NewReader(trace), 0, ForClock)
	require.NoError(t, err)
	assert.Equal(t, int64(5), tr.Rank)
	assert.Equal(t, uint64(77), tr.WallNS)
	assert.True(t, tr.Complete)
	assert.Nil(t, tr.Measured)
	assert.Empty(t, tr.Phases)
	assert.Equal(t, []Collective{{Name: "nccl:all_reduce", Bytes: 32, EnterNS: 201, EndNS: 261}}, tr.Collectives)
	assert.Zero(t, tr.Ops)
	assert.Empty(t, tr.Busy)
}

// TestReadRefuses: a line the reader cannot read is an error that says
// where; the lines a detail skims (memory records; for the job clock, ops
// other than collectives) are not checked.
func TestReadRefuses(t *testing.T) {
	meta := testMeta(`,"process":{"pid":1,"rank":1}`)
	op := `{"kind":"op","span_id":"s1","op_name":"gloo:all_reduce","inputs":[],"shape":[8],"dtype":"f32","device":"cpu","duration_ns":60,"timestamp_ns":201,"input_dense_bytes":32}`
	tests := []struct {
		name    string
		lines   []string
		detail  Detail
		wantErr string // "" when read
	}{
		{"empty", nil, ForAnalysis, "no meta record"},
		{"op first", []string{op}, ForClock, "line 1: the first record is op; a trace starts with a meta record"},
		{"meta refused", []string{`{"kind":"meta","schema":"candle-graph/trace/10"}`}, ForAnalysis, "line 1: missing_field: meta: missing field `run_id`"},
		{"broken collective", []string{meta, `{"kind":"op","op_name":"gloo:all_reduce","duration_ns":"x"}`, op}, ForClock, "line 2: "},
		{"broken span", []string{meta, `{"kind":"span_start","id":"s1"}`}, ForAnalysis, "line 2: missing_field: span_start: missing field `name`"},
		{"broken aten op, analysis", []string{meta, `{"kind":"op","op_name":"aten::mm"}`, op}, ForAnalysis, "line 2: missing_field: op: missing field"},
		{"broken aten op, clock", []string{meta, `{"kind":"op","op_name":"aten::mm"}`, op}, ForClock, ""},
		{"broken memory, analysis", []string{meta, `{"kind":"memory","bytes":-1}`, op}, ForAnalysis, ""},
		{"broken memory, clock", []string{meta, `{"kind":"memory","bytes":-1}`, op}, ForClock, ""},
		{"memory laid out otherwise", []string{meta, `{ "kind":"memory","bytes":-1}`, op}, ForClock, "line 2: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := Read(strings.NewReader(strings.Join(tt.lines, "\n")), 3, tt.detail)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(1), tr.Rank)
			assert.Equal(t, []Collective{{Name: "gloo:all_reduce", Bytes: 32, EnterNS: 201, EndNS: 261}}, tr.Collectives)
		})
	}
}
