package job

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkRead reads a rank trace of 300k ops (a real trace's mix: ops,
// their memory records, a collective every 1000 ops) from memory: the pass
// that the job view (analysis) and the merge's job clock (clock) add per
// rank.
func BenchmarkRead(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(testMeta(`,"clock":{"host":"monotonic","wall_unix_ns_at_open":1800000000000000000},"process":{"pid":1,"rank":0,"world_size":8}`) + "\n")
	buf.WriteString(`{"kind":"span_start","id":"s1","name":"m::train","start_ns":0,"span_kind":"function"}` + "\n")
	buf.WriteString(`{"kind":"span_start","id":"s2","parent_id":"s1","name":"update","start_ns":10,"span_kind":"function","measured":true}` + "\n")
	const ops = 300_000
	for i := 0; i < ops; i++ {
		ts := 100 + uint64(i)*1000
		fmt.Fprintf(&buf, `{"kind":"op","span_id":"s2","op_name":"aten::addmm","inputs":["t%d","fc1.weight"],"output":"t%d","shape":[32,512],"dtype":"f32","device":"cpu","duration_ns":800,"timestamp_ns":%d,"output_dense_bytes":65536,"input_dense_bytes":1114112}`+"\n", i, i+1, ts)
		fmt.Fprintf(&buf, `{"kind":"memory","span_id":"s2","timestamp_ns":%d,"action":"alloc","storage_id":"cpu-7f%x","tensor_id":"t%d","device":"cpu","dtype":"f32","op_name":"aten::addmm","bytes":65536,"shape":[32,512],"category":"activation"}`+"\n", ts, i, i+1)
		if i%1000 == 999 {
			fmt.Fprintf(&buf, `{"kind":"op","span_id":"s2","op_name":"gloo:all_reduce","inputs":[],"shape":[262144],"dtype":"f32","device":"cpu","duration_ns":500,"timestamp_ns":%d,"output_dense_bytes":1048576,"input_dense_bytes":1048576}`+"\n", ts)
		}
	}
	fmt.Fprintf(&buf, `{"kind":"span_end","id":"s2","duration_ns":%d}`+"\n", ops*1000+200)
	fmt.Fprintf(&buf, `{"kind":"span_end","id":"s1","duration_ns":%d}`+"\n", ops*1000+400)
	buf.WriteString(`{"kind":"terminal","outcome":"complete","timestamp_ns":1}` + "\n")
	data := buf.Bytes()
	for _, d := range []struct {
		name   string
		detail Detail
		ops    int
	}{{"analysis", ForAnalysis, ops}, {"clock", ForClock, 0}} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				t, err := Read(bytes.NewReader(data), 0, d.detail)
				if err != nil || len(t.Collectives) != ops/1000 || t.Ops != d.ops {
					b.Fatalf("read: %v, %d collectives, %d ops", err, len(t.Collectives), t.Ops)
				}
			}
		})
	}
}
