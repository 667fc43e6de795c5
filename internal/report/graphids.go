package report

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
)

// checkGraphIDs reproduces a failure of `candle-graph summary` that is not a
// health issue: on a valid, complete capture it builds a graph whose nodes
// are the span ids, `<span>/op/<n>` for the n-th op of a span, and
// `tensor/<id>` for each known tensor, and it refuses the trace when two of
// these collide. Only a span id can collide with a synthesized id.
func (a *analyzer) checkGraphIDs() {
	if a.terminal == nil || a.terminal.outcome != outcomeComplete {
		return
	}
	collide := func(s *span, what string) {
		a.errorAt(int(s.line), CodeGraphNodeIDCollision, fmt.Sprintf("span id `%s` collides with the synthesized graph node id of %s", s.id, what))
	}
	for _, s := range a.spanList {
		if t, ok := strings.CutPrefix(s.id, "tensor/"); ok && a.knownTensor(t) {
			collide(s, "tensor `"+t+"`")
		}
		for i := strings.Index(s.id, "/op/"); i >= 0; {
			if n, ok := opIndex(s.id[i+4:]); ok {
				if p, ok := a.spans[s.id[:i]]; ok && uint64(p.refs.opCount) > n {
					collide(s, fmt.Sprintf("op %d of span `%s`", n, p.id))
				}
			}
			j := strings.Index(s.id[i+1:], "/op/")
			if j < 0 {
				break
			}
			i += 1 + j
		}
		// An op node of a span named "tensor" or "tensor/..." can equal a
		// tensor node.
		var prefix string
		switch {
		case s.id == "tensor":
			prefix = ""
		case strings.HasPrefix(s.id, "tensor/"):
			prefix = s.id[len("tensor/"):] + "/"
		default:
			continue
		}
		for n := uint32(0); n < s.refs.opCount; n++ {
			if t := prefix + "op/" + strconv.FormatUint(uint64(n), 10); a.knownTensor(t) {
				a.errorAt(int(s.line), CodeGraphNodeIDCollision, fmt.Sprintf("op %d of span `%s` collides with the graph node id of tensor `%s`", n, s.id, t))
			}
		}
	}
}

func (a *analyzer) knownTensor(id string) bool {
	_, ok := a.tensors[maphash.String(a.seed, id)]
	return ok
}

// opIndex parses the canonical decimal that format! writes for a usize.
func opIndex(s string) (uint64, bool) {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, ok := parseU64([]byte(s))
	return n, ok
}
