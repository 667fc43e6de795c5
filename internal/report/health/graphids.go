package health

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// checkGraphIDs reproduces a failure of `candle-graph summary` that is not a
// health issue: on a valid, complete capture it builds a graph whose nodes
// are the span ids, `<span>/op/<n>` for the n-th op of a span, and
// `tensor/<id>` for each known tensor, and it refuses the trace when two of
// these collide. Only a span id can collide with a synthesized id.
func (a *Checker) checkGraphIDs() {
	if a.Terminal == nil || a.Terminal.outcome != trace.OutcomeComplete {
		return
	}
	collide := func(s *Span, what string) {
		a.errorAt(int(s.line), trace.CodeGraphNodeIDCollision, fmt.Sprintf("span id `%s` collides with the synthesized graph node id of %s", s.ID, what))
	}
	for _, s := range a.Spans {
		if t, ok := strings.CutPrefix(s.ID, "tensor/"); ok && a.knownTensor(t) {
			collide(s, "tensor `"+t+"`")
		}
		for i := strings.Index(s.ID, "/op/"); i >= 0; {
			if n, ok := opIndex(s.ID[i+4:]); ok {
				if p, ok := a.SpanByID[s.ID[:i]]; ok && uint64(p.refs.opCount) > n {
					collide(s, fmt.Sprintf("op %d of span `%s`", n, p.ID))
				}
			}
			j := strings.Index(s.ID[i+1:], "/op/")
			if j < 0 {
				break
			}
			i += 1 + j
		}
		// An op node of a span named "tensor" or "tensor/..." can equal a
		// tensor node.
		var prefix string
		switch {
		case s.ID == "tensor":
			prefix = ""
		case strings.HasPrefix(s.ID, "tensor/"):
			prefix = s.ID[len("tensor/"):] + "/"
		default:
			continue
		}
		for n := uint32(0); n < s.refs.opCount; n++ {
			if t := prefix + "op/" + strconv.FormatUint(uint64(n), 10); a.knownTensor(t) {
				a.errorAt(int(s.line), trace.CodeGraphNodeIDCollision, fmt.Sprintf("op %d of span `%s` collides with the graph node id of tensor `%s`", n, s.ID, t))
			}
		}
	}
}

func (a *Checker) knownTensor(id string) bool {
	_, ok := a.tensors[maphash.String(a.seed, id)]
	return ok
}

// opIndex parses the canonical decimal that format! writes for a usize.
func opIndex(s string) (uint64, bool) {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, ok := trace.ParseU64([]byte(s))
	return n, ok
}
