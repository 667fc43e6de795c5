package job

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Backends are the prefixes of the op names that are collectives: the
// record-function names torch.distributed's process groups give their work.
var Backends = []string{"gloo:", "nccl:", "mpi:", "ucc:", "xccl:"}

// IsCollective tells whether an op name is a collective's.
func IsCollective(opName string) bool {
	for _, b := range Backends {
		if strings.HasPrefix(opName, b) {
			return true
		}
	}
	return false
}

// Span is a span of a rank's trace that the analysis needs: the measured
// region and the spans with a step tag. Times are the session clock's.
type Span struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Step     string `json:"step,omitempty"`
	StartNS  uint64 `json:"start_ns"`
	EndNS    uint64 `json:"end_ns"`
	Measured bool   `json:"measured,omitempty"`
	closed   bool
}

// Collective is one collective a rank took part in.
type Collective struct {
	Name    string `json:"name"`
	Bytes   uint64 `json:"bytes"`
	EnterNS uint64 `json:"enter_ns"` // session clock: when the rank entered it
	EndNS   uint64 `json:"end_ns"`   // when it completed on this rank
}

// Trace is what the analysis reads of one rank's trace.
type Trace struct {
	Path      string `json:"path"`
	Rank      int64  `json:"rank"`
	RankFrom  string `json:"rank_from"` // "meta.process.rank" or "file order"
	WorldSize int64  `json:"world_size,omitempty"`
	RunID     string `json:"run_id"`
	// JobID is the meta's tag job_id ("" when it has none): the same on
	// every rank of one job (the Python binding writes it).
	JobID       string `json:"job_id,omitempty"`
	Entrypoint  string `json:"entrypoint"`
	CaptureStep uint64 `json:"capture_step"`
	WallNS      uint64 `json:"wall_unix_ns_at_open,omitempty"`
	HasWall     bool   `json:"has_wall_clock"`
	Complete    bool   `json:"complete"` // a terminal record says complete
	// Measured is the measured region (nil when the trace has none).
	Measured *Span `json:"measured,omitempty"`
	// Phases are the outermost spans with a step tag inside the measured
	// region, in time order.
	Phases      []Span       `json:"-"`
	Collectives []Collective `json:"-"`
	// Busy is when the rank ran an op other than a collective's (on any
	// thread), merged: what tells computing from waiting while a collective
	// is under way (DDP all-reduces buckets while backward goes on).
	Busy []interval `json:"-"`
	// Ops is how many such ops the trace holds.
	Ops     int `json:"ops"`
	mergeAt int // Busy's length at which it is merged next
}

// line is the union of the fields read from the lines that are decoded.
type line struct {
	Kind        string `json:"kind"`
	RunID       string `json:"run_id"`
	Entrypoint  string `json:"entrypoint"`
	CaptureStep uint64 `json:"capture_step"`
	Clock       struct {
		Wall json.RawMessage `json:"wall_unix_ns_at_open"`
	} `json:"clock"`
	Process struct {
		Rank      json.RawMessage `json:"rank"`
		WorldSize json.RawMessage `json:"world_size"`
	} `json:"process"`
	Tags struct {
		JobID string `json:"job_id"`
	} `json:"tags"`
	ID          string `json:"id"`
	Name        string `json:"name"`
	Step        string `json:"step"`
	Measured    bool   `json:"measured"`
	StartNS     uint64 `json:"start_ns"`
	DurationNS  uint64 `json:"duration_ns"`
	OpName      string `json:"op_name"`
	TimestampNS uint64 `json:"timestamp_ns"`
	OutBytes    uint64 `json:"output_dense_bytes"`
	InBytes     uint64 `json:"input_dense_bytes"`
	Outcome     string `json:"outcome"`
}

// wanted tells, from the raw bytes, whether a line may be one the analysis
// decodes: the meta and terminal, span lines, and ops whose name is a
// collective's. Everything else (most of a trace: ops, tensors, memory) is
// skipped without decoding; of the other ops only the times are scanned.
func wanted(raw []byte) bool {
	for _, k := range [][]byte{[]byte(`span_start`), []byte(`span_end`), []byte(`"meta"`), []byte(`"terminal"`)} {
		if bytes.Contains(raw, k) {
			return true
		}
	}
	if !bytes.Contains(raw, []byte(`"op_name"`)) {
		return false
	}
	for _, b := range Backends {
		if bytes.Contains(raw, []byte(`"`+b)) {
			return true
		}
	}
	return false
}

// ReadFile reads one rank's trace; index is its position among the job's
// files (its rank when the meta has none).
func ReadFile(path string, index int) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Read(f, index)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t.Path = path
	return t, nil
}

// Read reads one rank's trace from r. A trace cut short (a killed writer)
// is read to the cut; spans still open there are left out.
func Read(r io.Reader, index int) (*Trace, error) {
	t := &Trace{Rank: int64(index), RankFrom: "file order"}
	br := bufio.NewReaderSize(r, 1<<20)
	spans := map[string]int{} // id -> index in all
	var all []Span
	n := 0
	for {
		raw, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull { // a line over the buffer: read it whole
			rest, rerr := br.ReadBytes('\n')
			raw, err = append(append([]byte(nil), raw...), rest...), rerr
		}
		if len(bytes.TrimSpace(raw)) > 0 {
			n++
			if n > 1 && isOp(raw) && !wanted(raw) {
				t.busyOp(raw)
			} else if n == 1 || wanted(raw) {
				var l line
				if jerr := json.Unmarshal(raw, &l); jerr != nil {
					if err == io.EOF { // the cut last line of a killed writer
						break
					}
					return nil, fmt.Errorf("line %d: %v", n, jerr)
				}
				if n == 1 && l.Kind != "meta" {
					return nil, fmt.Errorf("line 1 is %q, not the meta record", l.Kind)
				}
				t.take(&l, spans, &all)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("empty file: not a trace")
	}
	t.finish(all)
	return t, nil
}

func (t *Trace) take(l *line, spans map[string]int, all *[]Span) {
	switch l.Kind {
	case "meta":
		t.RunID, t.JobID, t.Entrypoint, t.CaptureStep = l.RunID, l.Tags.JobID, l.Entrypoint, l.CaptureStep
		if w, ok := uintOf(l.Clock.Wall); ok {
			t.WallNS, t.HasWall = w, true
		}
		if r, ok := uintOf(l.Process.Rank); ok {
			t.Rank, t.RankFrom = int64(r), "meta.process.rank"
		}
		if w, ok := uintOf(l.Process.WorldSize); ok {
			t.WorldSize = int64(w)
		}
	case "span_start":
		if l.Measured || l.Step != "" {
			spans[l.ID] = len(*all)
			*all = append(*all, Span{ID: l.ID, Name: l.Name, Step: l.Step, StartNS: l.StartNS, Measured: l.Measured})
		}
	case "span_end":
		if i, ok := spans[l.ID]; ok {
			s := &(*all)[i]
			s.EndNS, s.closed = s.StartNS+l.DurationNS, true
		}
	case "op":
		if IsCollective(l.OpName) {
			b := l.InBytes
			if l.OutBytes > b {
				b = l.OutBytes
			}
			t.Collectives = append(t.Collectives, Collective{Name: l.OpName, Bytes: b, EnterNS: l.TimestampNS, EndNS: l.TimestampNS + l.DurationNS})
		}
	case "terminal":
		t.Complete = l.Outcome == "complete"
	}
}

// finish picks the measured region and the phases out of the spans read,
// and orders the collectives by when the rank entered them.
func (t *Trace) finish(all []Span) {
	var tagged []Span
	for _, s := range all {
		if !s.closed {
			continue
		}
		if s.Measured && t.Measured == nil {
			m := s
			t.Measured = &m
		}
		if s.Step != "" {
			tagged = append(tagged, s)
		}
	}
	t.Phases = outermost(tagged, t.Measured)
	sortCollectives(t.Collectives)
	t.Busy = merge(t.Busy)
}

// busyOp takes the time of an op that is no collective (the c10d:: op that
// enqueues one is part of it). The two numbers are scanned, not decoded.
func (t *Trace) busyOp(raw []byte) {
	if bytes.Contains(raw, []byte(`"c10d::`)) {
		return
	}
	ts, ok1 := scanUint(raw, `"timestamp_ns"`)
	d, ok2 := scanUint(raw, `"duration_ns"`)
	if !ok1 || !ok2 || d == 0 {
		return
	}
	t.Ops++
	t.Busy = append(t.Busy, interval{int64(ts), int64(ts + d)})
	if len(t.Busy) >= t.mergeAt { // overlapping ops (threads, nesting) fold as the list grows
		t.Busy = merge(t.Busy)
		t.mergeAt = max(2*len(t.Busy), 1<<16)
	}
}

// isOp tells from the raw bytes whether the line's "kind" is "op".
func isOp(raw []byte) bool {
	i := bytes.Index(raw, []byte(`"kind"`))
	if i < 0 {
		return false
	}
	return bytes.HasPrefix(bytes.TrimLeft(raw[i+6:], " \t:"), []byte(`"op"`))
}

// scanUint reads the integer after key (`"name"`) in the raw bytes.
func scanUint(raw []byte, key string) (uint64, bool) {
	i := bytes.Index(raw, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(raw[i+len(key):], " \t:")
	var v uint64
	j := 0
	for ; j < len(rest) && rest[j] >= '0' && rest[j] <= '9'; j++ {
		d := uint64(rest[j] - '0')
		if v > (math.MaxUint64-d)/10 { // past what a u64 field holds
			return 0, false
		}
		v = v*10 + d
	}
	return v, j > 0
}

// outermost returns the spans (in time order) that lie inside the measured
// region and inside no other of the spans: a module's backward inside the
// backward call counts once, as the call.
func outermost(spans []Span, m *Span) []Span {
	if m == nil {
		return nil
	}
	sortSpans(spans)
	var out []Span
	var end uint64
	for _, s := range spans {
		if s.StartNS < m.StartNS || s.EndNS > m.EndNS {
			continue
		}
		if len(out) > 0 && s.StartNS < end {
			continue // inside (or across) the last outermost span
		}
		out = append(out, s)
		if s.EndNS > end {
			end = s.EndNS
		}
	}
	return out
}

// uintOf reads a JSON integer >= 0 (absent or null: false).
func uintOf(raw json.RawMessage) (uint64, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	return v, err == nil
}
