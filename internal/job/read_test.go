package job

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScanUint(t *testing.T) {
	tests := []struct {
		line string
		want uint64
		ok   bool
	}{
		{`{"kind":"op","duration_ns":800}`, 800, true},
		{`{"kind": "op", "duration_ns" : 12 }`, 12, true},
		{`{"kind":"op","duration_ns":18446744073709551615}`, 18446744073709551615, true},
		{`{"kind":"op","duration_ns":18446744073709551616}`, 0, false},
		{`{"kind":"op","duration_ns":"8"}`, 0, false},
		{`{"kind":"op"}`, 0, false},
	}
	for _, tt := range tests {
		got, ok := scanUint([]byte(tt.line), `"duration_ns"`)
		assert.Equal(t, tt.ok, ok, tt.line)
		assert.Equal(t, tt.want, got, tt.line)
	}
	assert.True(t, isOp([]byte(`{"kind" : "op","x":1}`)))
	assert.False(t, isOp([]byte(`{"kind":"memory","op_name":"aten::mm"}`)))
	assert.False(t, isOp([]byte(`{"kind":"operation"}`)))
}

func TestReadKeepsWhatTheAnalysisNeeds(t *testing.T) {
	trace := strings.Join([]string{
		`{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","entrypoint":"m::train","capture_step":4,"clock":{"host":"monotonic","wall_unix_ns_at_open":77},"process":{"pid":1,"rank":5,"world_size":8}}`,
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
	tr, err := Read(strings.NewReader(trace), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(5), tr.Rank)
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
	tr, err = Read(strings.NewReader(cut), 0)
	require.NoError(t, err, "a trace cut short is read to the cut")
	assert.Nil(t, tr.Measured, "the measured region never closed")
	assert.False(t, tr.Complete)
}
