package chrome

import (
	"fmt"
	"os"
	"sort"
	"strconv"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// MergeInput is one rank's trace in a merge, as read from its meta record.
type MergeInput struct {
	Path     string `json:"path"`
	Rank     int64  `json:"rank"`
	RankFrom string `json:"rank_from"` // "meta.process.rank" or "file order"
	// WallNS is meta.clock.wall_unix_ns_at_open; OffsetNS is how far this
	// rank's clock starts after the earliest one.
	WallNS   uint64        `json:"wall_unix_ns_at_open,omitempty"`
	HasWall  bool          `json:"has_wall_clock"`
	OffsetNS uint64        `json:"offset_ns"`
	HostPID  int64         `json:"pid"`
	Result   *ExportResult `json:"-"`
}

// MergeResult describes a merged timeline.
type MergeResult struct {
	Inputs   []MergeInput `json:"inputs"`
	Warnings []string     `json:"warnings,omitempty"`
	Events   int          `json:"events"`
}

// PlanMerge reads the meta record of each trace and places it: its rank
// (meta.process.rank, else its position among the files) and its offset
// from the earliest meta.clock.wall_unix_ns_at_open. Two traces claiming
// the same rank are an error; a trace without a wall clock cannot be
// aligned and starts at 0 (with a warning).
func PlanMerge(paths []string) ([]MergeInput, []string, error) {
	var inputs []MergeInput
	var warnings []string
	byRank := map[int64]string{}
	for i, p := range paths {
		m, err := readMeta(p)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		in := MergeInput{Path: p, Rank: int64(i), RankFrom: "file order"}
		if r, err := strconv.ParseInt(m.Process["rank"], 10, 64); err == nil && r >= 0 {
			in.Rank, in.RankFrom = r, "meta.process.rank"
		}
		if prev, dup := byRank[in.Rank]; dup {
			return nil, nil, fmt.Errorf("%s and %s both are rank %d (meta.process.rank, else file order); merge one trace per rank", prev, p, in.Rank)
		}
		byRank[in.Rank] = p
		if w, err := strconv.ParseUint(m.Clock["wall_unix_ns_at_open"], 10, 64); err == nil {
			in.WallNS, in.HasWall = w, true
		} else {
			warnings = append(warnings, fmt.Sprintf("%s has no meta.clock.wall_unix_ns_at_open: it starts at 0, not aligned with the others", p))
		}
		inputs = append(inputs, in)
	}
	var earliest uint64
	first := true
	for _, in := range inputs {
		if in.HasWall && (first || in.WallNS < earliest) {
			earliest, first = in.WallNS, false
		}
	}
	for i := range inputs {
		if inputs[i].HasWall {
			inputs[i].OffsetNS = inputs[i].WallNS - earliest
		}
	}
	sort.SliceStable(inputs, func(i, j int) bool { return inputs[i].Rank < inputs[j].Rank })
	return inputs, warnings, nil
}

// Merge writes one Chrome trace for a multi-process job: one process per
// rank (pid rank+1, its devices after it), timestamps shifted by each
// rank's offset. Traces are exported one after the other, each in one pass.
func Merge(paths []string, w *ChromeWriter) (*MergeResult, error) {
	return MergeWith(paths, w, nil)
}

// MergeWith is Merge with the offsets of the ranks in offsets (by rank)
// given rather than taken from the wall clocks: a job clock refined by the
// collectives' end times (package job). Ranks it leaves out keep theirs.
func MergeWith(paths []string, w *ChromeWriter, offsets map[int64]uint64) (*MergeResult, error) {
	inputs, warnings, err := PlanMerge(paths)
	if err != nil {
		return nil, err
	}
	for i := range inputs {
		if off, ok := offsets[inputs[i].Rank]; ok {
			inputs[i].OffsetNS = off
		}
	}
	res := &MergeResult{Warnings: warnings}
	for i := range inputs {
		in := &inputs[i]
		in.HostPID = in.Rank + 1
		opts := ChromeOptions{
			HostPID:       in.HostPID,
			DevicePIDBase: DefaultDevicePIDBase + in.Rank<<8,
			OffsetNS:      in.OffsetNS,
			Label:         fmt.Sprintf("rank %d: ", in.Rank),
			SortIndex:     int(in.Rank) << 8,
		}
		r, err := ExportChromeFile(in.Path, w, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Path, err)
		}
		in.Result = r
		res.Events += r.Events
	}
	res.Inputs = inputs
	return res, nil
}

// readMeta reads the first record of a trace, which must be its meta.
func readMeta(path string) (*trace.Meta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := trace.NewStream(f, 0)
	k, ok := st.Next()
	switch {
	case st.Err != nil:
		return nil, st.Err
	case !ok && st.Stop != nil:
		return nil, fmt.Errorf("line %d: %s: %s", st.Stop.Line, st.Stop.Code, st.Stop.Message)
	case !ok:
		return nil, fmt.Errorf("no meta record: not a candle-graph trace")
	case k != trace.KindMeta:
		return nil, fmt.Errorf("line %d: the first record is %s; a trace starts with a meta record", st.Line, k)
	}
	return st.Decoded.Meta, nil
}
