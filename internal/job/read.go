package job

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/trace"
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

// Detail is how much of a rank's trace a read keeps.
type Detail int

const (
	// ForAnalysis keeps everything Analyze uses: the meta, the spans, the
	// collectives and the other ops' times (Busy).
	ForAnalysis Detail = iota
	// ForClock keeps what Align uses: the meta and the collectives. The other
	// lines (most of a trace) are skimmed over, not decoded
	// (trace.RecordVisitor.Skim): the merge's job clock.
	ForClock
)

// ReadFile reads one rank's trace; index is its position among the job's
// files (its rank when the meta has none).
func ReadFile(path string, index int, detail Detail) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Read(f, index, detail)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t.Path = path
	return t, nil
}

// reading is one rank's trace as the stream hands it over.
type reading struct {
	t     *Trace
	spans map[string]int // id -> index in all
	all   []Span
}

// Read reads one rank's trace from r with the streaming reader every
// command shares (trace.StreamRecords). A trace cut short (a killed
// writer) is read to the cut; spans still open there are left out. A line
// that cannot be read is an error: what follows it is unknown.
func Read(r io.Reader, index int, detail Detail) (*Trace, error) {
	rd := &reading{t: &Trace{Rank: int64(index), RankFrom: "file order"}, spans: map[string]int{}}
	v := trace.RecordVisitor{Meta: rd.meta, Op: rd.op, Terminal: rd.terminal, Skim: true}
	switch detail {
	case ForAnalysis:
		v.SpanStart, v.SpanEnd = rd.spanStart, rd.spanEnd
	case ForClock:
		v.OpNamed = func(name []byte) bool { return IsCollective(string(name)) }
	}
	res, err := trace.StreamRecords(r, v, 0)
	if err != nil {
		return nil, err
	}
	if res.Stop != nil {
		return nil, fmt.Errorf("line %d: %s: %s", res.Stop.Line, res.Stop.Code, res.Stop.Message)
	}
	rd.t.finish(rd.all)
	return rd.t, nil
}

func (rd *reading) meta(m *trace.Meta) error {
	t := rd.t
	t.RunID, t.JobID, t.Entrypoint, t.CaptureStep = m.RunID, m.Tags["job_id"], m.Entrypoint, m.CaptureStep
	if w, err := strconv.ParseUint(m.Clock["wall_unix_ns_at_open"], 10, 64); err == nil {
		t.WallNS, t.HasWall = w, true
	}
	if r, err := strconv.ParseUint(m.Process["rank"], 10, 63); err == nil {
		t.Rank, t.RankFrom = int64(r), "meta.process.rank"
	}
	if w, err := strconv.ParseUint(m.Process["world_size"], 10, 63); err == nil {
		t.WorldSize = int64(w)
	}
	return nil
}

func (rd *reading) spanStart(s *trace.SpanStartRecord) error {
	if s.Measured || s.Step != "" {
		rd.spans[string(s.ID)] = len(rd.all)
		rd.all = append(rd.all, Span{ID: string(s.ID), Name: string(s.Name), Step: s.Step, StartNS: s.StartNS, Measured: s.Measured})
	}
	return nil
}

func (rd *reading) spanEnd(e *trace.SpanEndRecord) error {
	if i, ok := rd.spans[string(e.ID)]; ok {
		s := &rd.all[i]
		s.EndNS, s.closed = s.StartNS+e.DurationNS, true
	}
	return nil
}

// op keeps a collective, and the time of any other op: when the rank was
// computing (the c10d:: op that enqueues a collective is part of it).
func (rd *reading) op(o *trace.OpRecord) error {
	t := rd.t
	switch name := string(o.Name); {
	case IsCollective(name):
		b := o.InputBytes
		if o.HasOutputBytes && o.OutputBytes > b {
			b = o.OutputBytes
		}
		t.Collectives = append(t.Collectives, Collective{Name: name, Bytes: b, EnterNS: o.TimestampNS, EndNS: o.TimestampNS + o.DurationNS})
	case strings.HasPrefix(name, "c10d::") || o.DurationNS == 0:
	default:
		t.Ops++
		t.Busy = append(t.Busy, interval{int64(o.TimestampNS), int64(o.TimestampNS + o.DurationNS)})
		if len(t.Busy) >= t.mergeAt { // overlapping ops (threads, nesting) fold as the list grows
			t.Busy = merge(t.Busy)
			t.mergeAt = max(2*len(t.Busy), 1<<16)
		}
	}
	return nil
}

func (rd *reading) terminal(e *trace.TerminalRecord) error {
	rd.t.Complete = e.Outcome == "complete"
	return nil
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
