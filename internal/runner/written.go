package runner

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Files is what a path pattern matches now (%p and %r as wildcards), with
// each file's modification time and size.
type Files map[string]fileState

type fileState struct {
	mod  time.Time
	size int64
}

// Snapshot lists the files pattern matches.
func Snapshot(pattern string) Files {
	glob := strings.NewReplacer("%p", "*", "%r", "*", "%%", "%").Replace(pattern)
	matches, _ := filepath.Glob(glob)
	out := Files{}
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && st.Mode().IsRegular() {
			out[m] = fileState{st.ModTime(), st.Size()}
		}
	}
	return out
}

// Written lists, sorted, the files pattern matches that are new or changed
// since before: an earlier run's traces under the same pattern are not this
// run's. (A comparison of times with the start would not do: file times
// come from a coarse clock, a few milliseconds behind time.Now.)
func Written(pattern string, before Files) []string {
	var out []string
	for p, st := range Snapshot(pattern) {
		if old, ok := before[p]; !ok || old != st {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// Patterns are the path patterns a run's files may match, absolute: the
// traces, a torchrun rank's traces (-rank%r before the extension, added by
// candle_trace/torch/_run.py when the pattern has no %r) and the summary.
func Patterns(o *Options, python bool) []string {
	if o.Watch != "" {
		out := []string{WatchPattern(o.Watch)}
		if o.Aggregate != "" {
			out = append(out, o.Aggregate)
		}
		return out
	}
	out := []string{o.Output}
	if python && !strings.Contains(o.Output, "%r") {
		out = append(out, rankPattern(o.Output))
	}
	if o.Aggregate != "" {
		out = append(out, o.Aggregate)
	}
	return out
}

// WatchPattern is what a watched run's traces match: the .jsonl files of
// its folder, whose rank placeholders ({rank}, %r, {world_size}; the
// Python binding puts the rank in) are wildcards.
func WatchPattern(folder string) string {
	folder = strings.NewReplacer("{rank}", "%r", "{world_size}", "%r").Replace(folder)
	return filepath.Join(folder, "*.jsonl")
}

// SnapshotAll is Snapshot of each pattern, in one set.
func SnapshotAll(patterns []string) Files {
	out := Files{}
	for _, p := range patterns {
		for k, v := range Snapshot(p) {
			out[k] = v
		}
	}
	return out
}

// rankPattern is what a torchrun rank writes under a pattern without %r:
// -rank%r before the extension, as the Python binding's profile names a
// rank's file.
func rankPattern(p string) string {
	ext := filepath.Ext(p)
	return strings.TrimSuffix(p, ext) + "-rank%r" + ext
}

// union is a and b sorted, each name once (a rank's file can match both
// patterns).
func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(a, b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
