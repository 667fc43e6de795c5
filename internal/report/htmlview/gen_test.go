package htmlview

import (
	"fmt"
	"io"
)

// regionTrace writes a valid, complete trace whose measured region is the
// middle of three stretches: `before` layers of warm-up, `inside` layers in
// the measured span, `after` layers past it. Each layer is a span with
// opsPerLayer ops, each op with a host-clock device interval and an
// alloc/free pair. Op names say where they are: warmup_op, measured_op,
// after_op; so do the layer spans' and the intervals' names.
func regionTrace(w io.Writer, before, inside, after, opsPerLayer int) {
	fmt.Fprintln(w, `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"region-1","correlation_id":"region::train/train-1","entrypoint":"region::train","phase":"train","timestamp":"2026-08-20T00:00:00.000Z","capture_step":1,"warmup_steps":0,"device":"cuda:0","measured_region_device_synchronized":true,"timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"complete","activations":"partial","tensors":"partial","gradients":"none","logical_memory":"complete","physical_memory":"partial","device_timing":"partial","required_semantic_labels":[]},"tags":{"producer":"go"},"producer":{"name":"candle-trace","version":"0.1.0","binding":"go"}}`)
	fmt.Fprintln(w, `{"kind":"span_start","id":"s1","name":"region::train","start_ns":0,"span_kind":"function","measured":false,"tid":1}`)
	ts, spanN, storage := uint64(100), 1, 0
	layers := func(parent string, n int, what string) {
		for range n {
			spanN++
			start := ts
			fmt.Fprintf(w, `{"kind":"span_start","id":"s%d","parent_id":"%s","name":"%s_layer","start_ns":%d,"span_kind":"module","measured":false,"tid":1}`+"\n", spanN, parent, what, ts)
			for i := range opsPerLayer {
				storage++
				ts += 10
				fmt.Fprintf(w, `{"kind":"op","span_id":"s%d","op_name":"%s_op","inputs":[],"shape":[32,128],"dtype":"f32","device":"cuda:0","duration_ns":%d,"timestamp_ns":%d,"input_dense_bytes":0}`+"\n", spanN, what, 40+i, ts)
				fmt.Fprintf(w, `{"kind":"device_interval","span_id":"s%d","device":"cuda:0","stream_id":"7","clock_id":"host-monotonic","backend":"cuda","start_ns":%d,"duration_ns":%d,"name":"%s_kernel"}`+"\n", spanN, ts+5, 30+i, what)
				fmt.Fprintf(w, `{"kind":"memory","timestamp_ns":%d,"storage_id":"cuda-%d","tensor_id":"t%d","span_id":"s%d","device":"cuda:0","bytes":16384,"action":"alloc","shape":[32,128],"dtype":"f32","category":"activation"}`+"\n", ts+20, storage, storage, spanN)
				fmt.Fprintf(w, `{"kind":"memory","timestamp_ns":%d,"storage_id":"cuda-%d","tensor_id":"t%d","span_id":"s%d","device":"cuda:0","bytes":16384,"action":"free","shape":[32,128],"dtype":"f32","category":"activation"}`+"\n", ts+30, storage, storage, spanN)
				ts += 60
			}
			ts += 10
			fmt.Fprintf(w, `{"kind":"span_end","id":"s%d","duration_ns":%d}`+"\n", spanN, ts-start)
			ts += 5
		}
	}
	layers("s1", before, "warmup")
	spanN++
	measured, mStart := spanN, ts
	fmt.Fprintf(w, `{"kind":"span_start","id":"s%d","parent_id":"s1","name":"region/step","start_ns":%d,"span_kind":"function","measured":true,"step":"forward","tid":1}`+"\n", measured, ts)
	ts += 5
	layers(fmt.Sprintf("s%d", measured), inside, "measured")
	ts += 5
	fmt.Fprintf(w, `{"kind":"span_end","id":"s%d","duration_ns":%d}`+"\n", measured, ts-mStart)
	ts += 5
	layers("s1", after, "after")
	fmt.Fprintf(w, `{"kind":"span_end","id":"s1","duration_ns":%d}`+"\n", ts+5)
	fmt.Fprintf(w, `{"kind":"terminal","outcome":"complete","timestamp_ns":%d}`+"\n", ts+5)
}
