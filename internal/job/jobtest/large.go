package jobtest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
)

// Large is a synthetic DDP job of big rank traces, for the benchmarks of
// merge and the job view: what a captured update of a real model looks
// like in bulk. Each rank's measured update is a forward (a third of the
// ops) and a backward (the rest), each op in a module span of 64 ops with
// its output's alloc and, two ops later, its free; during backward the rank
// enters a gloo all-reduce of 4 MiB every 1000 ops, which ends on every rank
// Xfer after the last rank entered it. Rank Slow computes 10% slower.
type Large struct {
	Ranks int
	// Ops is every rank's number of ops; OpsFor gives the number that
	// makes a rank trace about a given size.
	Ops  int
	Slow int
	// JobID is every rank's job_id tag ("": none).
	JobID string
}

const (
	largeOpNS   = 1000    // an op every µs on the fast ranks
	largeXferNS = 200_000 // an all-reduce ends 200 µs after the last rank entered it
	largeEvery  = 1000    // ops between collectives
	largeModule = 64      // ops per module span
	largeStart  = 1_000_000
)

// bytesPerOp is what an op costs a trace (its op line, its memory lines,
// its share of span and collective lines), measured on this generator.
const bytesPerOp = 658

// OpsFor is the number of ops that makes a rank trace of about size bytes.
func OpsFor(size int64) int { return int(size / bytesPerOp) }

// opNS is how long an op of rank r takes.
func (m Large) opNS(r int) uint64 {
	if r == m.Slow {
		return largeOpNS * 11 / 10
	}
	return largeOpNS
}

// startOf is when op i of rank r starts, on the job's true clock (every
// rank starts its update at largeStart).
func (m Large) startOf(r, i int) uint64 { return largeStart + uint64(i)*m.opNS(r) }

// collectives are the ops after which each all-reduce is entered, and when
// each ends (true clock): after the slowest rank entered it.
func (m Large) collectives() (after []int, end []uint64) {
	for i := m.Ops / 3; i < m.Ops; i++ {
		if (i-m.Ops/3)%largeEvery == largeEvery-1 || i == m.Ops-1 { // the last bucket: when the last gradient is ready
			after = append(after, i)
			var last uint64
			for r := 0; r < m.Ranks; r++ {
				last = max(last, m.startOf(r, i+1))
			}
			end = append(end, last+largeXferNS)
		}
	}
	return after, end
}

// Write writes trace-<rank>.jsonl for every rank into dir and returns the
// paths. Rank r's session opens r ms before the job's true clock's zero
// (the ranks start their processes apart), and its wall anchor says so.
func (m Large) Write(dir string) ([]string, error) {
	var paths []string
	for r := 0; r < m.Ranks; r++ {
		p := filepath.Join(dir, fmt.Sprintf("trace-%d.jsonl", r))
		if err := m.writeRank(p, r); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func (m Large) writeRank(path string, r int) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	open := uint64(r) * 1_000_000 // the session clock is the true clock plus this
	at := func(x uint64) uint64 { return x + open }
	tags := `{}`
	if m.JobID != "" {
		tags = fmt.Sprintf(`{"job_id":%q}`, m.JobID)
	}
	fmt.Fprintf(w, `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"run-%d","correlation_id":"m::train/update-3","entrypoint":"m::train","phase":"train","timestamp":"2027-01-15T08:00:00.000Z","capture_step":3,"warmup_steps":2,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"complete","activations":"partial","logical_memory":"complete","physical_memory":"none","device_timing":"none","required_semantic_labels":[]},"tags":%s,"clock":{"host":"monotonic","wall_unix_ns_at_open":%d},"process":{"pid":%d,"hostname":"node%d","rank":%d,"world_size":%d}}`+"\n",
		r, tags, 1_800_000_000_000_000_000-open, 100+r, r/8, r, m.Ranks)
	after, ends := m.collectives()
	opsEnd := m.startOf(r, m.Ops)
	updEnd := max(opsEnd, ends[len(ends)-1]) + 1000
	fwdEnd := m.startOf(r, m.Ops/3)
	fmt.Fprintf(w, `{"kind":"span_start","id":"s1","name":"m::train","start_ns":0,"span_kind":"function"}`+"\n")
	fmt.Fprintf(w, `{"kind":"span_start","id":"s2","parent_id":"s1","name":"update","start_ns":%d,"span_kind":"function","measured":true}`+"\n", at(largeStart))
	fmt.Fprintf(w, `{"kind":"span_start","id":"s3","parent_id":"s2","name":"M","start_ns":%d,"span_kind":"module","step":"forward"}`+"\n", at(largeStart))
	phase, next, k := "s3", 5, 0
	module, modStart := "", uint64(0)
	for i := 0; i < m.Ops; i++ {
		if i == m.Ops/3 { // forward ends, backward begins
			if module != "" {
				fmt.Fprintf(w, `{"kind":"span_end","id":"%s","duration_ns":%d}`+"\n", module, fwdEnd-modStart)
				module = ""
			}
			fmt.Fprintf(w, `{"kind":"span_end","id":"s3","duration_ns":%d}`+"\n", fwdEnd-largeStart)
			fmt.Fprintf(w, `{"kind":"span_start","id":"s4","parent_id":"s2","name":"backward","start_ns":%d,"span_kind":"function","step":"backward"}`+"\n", at(fwdEnd))
			phase = "s4"
		}
		s := m.startOf(r, i)
		if module == "" || (i%largeModule == 0) {
			if module != "" {
				fmt.Fprintf(w, `{"kind":"span_end","id":"%s","duration_ns":%d}`+"\n", module, s-modStart)
			}
			module, modStart = fmt.Sprintf("s%d", next), s
			next++
			fmt.Fprintf(w, `{"kind":"span_start","id":"%s","parent_id":"%s","name":"layer%d","start_ns":%d,"span_kind":"module"}`+"\n", module, phase, (i/largeModule)%48, at(s))
		}
		d := m.opNS(r) * 8 / 10
		fmt.Fprintf(w, `{"kind":"op","span_id":"%s","op_name":"aten::addmm","inputs":["t%d","layer%d.weight"],"output":"t%d","shape":[32,512],"dtype":"f32","device":"cpu","duration_ns":%d,"timestamp_ns":%d,"output_dense_bytes":65536,"input_dense_bytes":1114112}`+"\n", module, i, (i/largeModule)%48, i+1, d, at(s))
		fmt.Fprintf(w, `{"kind":"memory","span_id":"%s","timestamp_ns":%d,"action":"alloc","storage_id":"cpu-%x","tensor_id":"t%d","device":"cpu","dtype":"f32","op_name":"aten::addmm","bytes":65536,"shape":[32,512],"category":"activation"}`+"\n", module, at(s), i+1, i+1)
		if i >= 2 {
			fmt.Fprintf(w, `{"kind":"memory","span_id":"%s","timestamp_ns":%d,"action":"free","storage_id":"cpu-%x","tensor_id":"t%d","device":"cpu","dtype":"f32","bytes":65536,"category":"activation"}`+"\n", module, at(s+d), i-1, i-1)
		}
		if k < len(after) && after[k] == i { // a bucket is ready: its all-reduce
			enter := m.startOf(r, i+1)
			fmt.Fprintf(w, `{"kind":"op","span_id":"s2","op_name":"c10d::allreduce_","inputs":[],"shape":[1048576],"dtype":"f32","device":"cpu","duration_ns":10,"timestamp_ns":%d,"input_dense_bytes":4194304}`+"\n", at(enter))
			fmt.Fprintf(w, `{"kind":"op","span_id":"s2","op_name":"gloo:all_reduce","inputs":[],"shape":[1048576],"dtype":"f32","device":"cpu","duration_ns":%d,"timestamp_ns":%d,"output_dense_bytes":4194304,"input_dense_bytes":4194304}`+"\n", ends[k]-enter, at(enter))
			k++
		}
	}
	fmt.Fprintf(w, `{"kind":"memory","span_id":"s2","timestamp_ns":%d,"action":"free","storage_id":"cpu-%x","tensor_id":"t%d","device":"cpu","dtype":"f32","bytes":65536,"category":"activation"}`+"\n", at(opsEnd), m.Ops-1, m.Ops-1)
	fmt.Fprintf(w, `{"kind":"memory","span_id":"s2","timestamp_ns":%d,"action":"free","storage_id":"cpu-%x","tensor_id":"t%d","device":"cpu","dtype":"f32","bytes":65536,"category":"activation"}`+"\n", at(opsEnd), m.Ops, m.Ops)
	fmt.Fprintf(w, `{"kind":"span_end","id":"%s","duration_ns":%d}`+"\n", module, opsEnd-modStart)
	fmt.Fprintf(w, `{"kind":"span_end","id":"s4","duration_ns":%d}`+"\n", updEnd-1000-fwdEnd)
	fmt.Fprintf(w, `{"kind":"span_end","id":"s2","duration_ns":%d}`+"\n", updEnd-largeStart)
	fmt.Fprintf(w, `{"kind":"span_end","id":"s1","duration_ns":%d}`+"\n", at(updEnd)+1000)
	fmt.Fprintf(w, `{"kind":"terminal","outcome":"complete","timestamp_ns":%d}`+"\n", at(updEnd)+1000)
	return w.Flush()
}
