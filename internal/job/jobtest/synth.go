// Package jobtest writes the traces of a synthetic multi-rank job, for the
// tests of package job and of the command line.
package jobtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Rank is one rank of a synthetic DDP update on a true (job) clock:
// the update starts at Start, runs forward, then backward, entering each
// collective along the way; a collective ends for every rank Xfer after the
// last rank entered it; backward returns when its compute and the last
// collective are done; then the optimizer. The trace's session clock starts
// at Open; its meta's wall clock says Open+AnchorErr.
type Rank struct {
	Rank                 int
	Open, AnchorErr      int64
	Start, Fwd, Bwd, Opt int64
	NoWall, NoRank       bool
	// NoOps leaves out the compute ops (one per phase: what tells computing
	// from waiting).
	NoOps bool
}

type Job struct {
	Ranks       []Rank
	Collectives []uint64 // bytes, entered in this order during backward
	Xfer        int64
	// Early has backward compute on after the last bucket is entered (by
	// default the last bucket is entered at the end of the compute).
	Early bool
	// JobID, when set, is every rank's job_id tag (what the Python binding
	// writes under torch.distributed).
	JobID string
}

// Enter is when rank r enters collective k (true clock): spread over its
// backward's compute as DDP's buckets are, the last one as the last
// gradient is ready, at the end of the compute.
func (m Job) Enter(r Rank, k int) int64 {
	if m.Early {
		return r.Start + r.Fwd + r.Bwd*int64(k+1)/int64(len(m.Collectives)+1)
	}
	return r.Start + r.Fwd + r.Bwd*int64(k+1)/int64(len(m.Collectives))
}

// End is when collective k ends, for every rank.
func (m Job) End(k int) int64 {
	var last int64
	for _, r := range m.Ranks {
		last = max(last, m.Enter(r, k))
	}
	return last + m.Xfer
}

// Write writes each rank's trace into dir and returns the paths.
func (m Job) Write(dir string) ([]string, error) {
	var paths []string
	for _, r := range m.Ranks {
		var b strings.Builder
		at := func(x int64) int64 { return x - r.Open } // true clock -> session clock
		process := fmt.Sprintf(`{"pid":%d,"rank":%d,"world_size":%d}`, 100+r.Rank, r.Rank, len(m.Ranks))
		if r.NoRank {
			process = fmt.Sprintf(`{"pid":%d}`, 100+r.Rank)
		}
		clock := fmt.Sprintf(`{"host":"monotonic","wall_unix_ns_at_open":%d}`, 1_800_000_000_000_000_000+r.Open+r.AnchorErr)
		if r.NoWall {
			clock = `{"host":"monotonic"}`
		}
		tags := `{}`
		if m.JobID != "" {
			tags = fmt.Sprintf(`{"job_id":%q}`, m.JobID)
		}
		fmt.Fprintf(&b, `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"run-%d","correlation_id":"m::train/update-3","entrypoint":"m::train","phase":"train","timestamp":"2027-01-15T08:00:00.000Z","capture_step":3,"warmup_steps":2,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"partial","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":%s,"clock":%s,"process":%s}`+"\n", r.Rank, tags, clock, process)
		bwdEnd := r.Start + r.Fwd + r.Bwd
		if len(m.Collectives) > 0 {
			bwdEnd = max(bwdEnd, m.End(len(m.Collectives)-1))
		}
		end := bwdEnd + r.Opt
		span := func(id, name, extra string, s, e int64) {
			fmt.Fprintf(&b, `{"kind":"span_start","id":"%s","parent_id":"s1","name":"%s","start_ns":%d,"span_kind":"function"%s}`+"\n", id, name, at(s), extra)
			fmt.Fprintf(&b, `{"kind":"span_end","id":"%s","duration_ns":%d}`+"\n", id, e-s)
		}
		fmt.Fprintf(&b, `{"kind":"span_start","id":"s1","name":"m::train","start_ns":0,"span_kind":"function"}`+"\n")
		span("s2", "update", `,"measured":true`, r.Start, end)
		span("s3", "M", `,"step":"forward"`, r.Start, r.Start+r.Fwd)
		span("s4", "backward", `,"step":"backward"`, r.Start+r.Fwd, bwdEnd)
		span("s5", "M.backward", `,"step":"backward"`, r.Start+r.Fwd, r.Start+r.Fwd+r.Bwd/2) // nested: not a phase of its own
		span("s6", "SGD.step", `,"step":"optimizer"`, bwdEnd, end)
		if !r.NoOps { // compute: forward, backward's own, optimizer
			op := func(name string, s, e int64) {
				fmt.Fprintf(&b, `{"kind":"op","span_id":"s2","op_name":"%s","inputs":[],"shape":[4],"dtype":"f32","device":"cpu","duration_ns":%d,"timestamp_ns":%d,"input_dense_bytes":16}`+"\n", name, e-s, at(s))
			}
			op("aten::addmm", r.Start, r.Start+r.Fwd)
			op("aten::mm", r.Start+r.Fwd, r.Start+r.Fwd+r.Bwd)
			op("aten::add_", bwdEnd, end)
		}
		for k, bytes := range m.Collectives {
			e := m.Enter(r, k)
			fmt.Fprintf(&b, `{"kind":"op","span_id":"s2","op_name":"c10d::allreduce_","inputs":[],"shape":[4],"dtype":"f32","device":"cpu","duration_ns":10,"timestamp_ns":%d,"input_dense_bytes":%d}`+"\n", at(e), bytes)
			fmt.Fprintf(&b, `{"kind":"op","span_id":"s2","op_name":"gloo:all_reduce","inputs":[],"shape":[%d],"dtype":"f32","device":"cpu","duration_ns":%d,"timestamp_ns":%d,"output_dense_bytes":%d,"input_dense_bytes":%d}`+"\n", bytes/4, m.End(k)-e, at(e), bytes, bytes)
		}
		fmt.Fprintf(&b, `{"kind":"span_end","id":"s1","duration_ns":%d}`+"\n", at(end)+1000)
		fmt.Fprintf(&b, `{"kind":"terminal","outcome":"complete","timestamp_ns":%d}`+"\n", at(end)+1000)
		p := filepath.Join(dir, fmt.Sprintf("trace-%d.jsonl", r.Rank))
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// Even is a job of n ranks alike: forward 10 ms, backward 20 ms, optimizer
// 2 ms, opened 1 ms apart, two buckets.
func Even(n int) Job {
	m := Job{Collectives: []uint64{4 << 20, 1 << 20}, Xfer: 500_000}
	for r := 0; r < n; r++ {
		m.Ranks = append(m.Ranks, Rank{Rank: r, Open: int64(r) * 1_000_000, Start: 50_000_000, Fwd: 10_000_000, Bwd: 20_000_000, Opt: 2_000_000})
	}
	return m
}
