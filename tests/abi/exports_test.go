// Package abi checks the built library from the outside: what it exports.
package abi

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

var (
	comments   = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	directives = regexp.MustCompile(`(?m)^\s*#.*$`)
	functions  = regexp.MustCompile(`\b(ct_[a-z0-9_]+)\s*\(`)
)

// headerFunctions parses the functions include/candle_trace.h declares:
// every ct_name( outside comments and preprocessor lines.
func headerFunctions(t *testing.T, root string) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "include", "candle_trace.h"))
	require.NoError(t, err)
	code := directives.ReplaceAll(comments.ReplaceAll(src, nil), nil)
	seen := map[string]bool{}
	for _, m := range functions.FindAllSubmatch(code, -1) {
		seen[string(m[1])] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// dynamicSymbols is what `nm -D --defined-only lib` lists.
func dynamicSymbols(t *testing.T, lib string) []string {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	require.NoError(t, err, "nm -D --defined-only %s", lib)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			seen[f[len(f)-1]] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// minus is what a holds and b does not.
func minus(a, b []string) []string {
	in := map[string]bool{}
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	return out
}

// library finds a built library: $env, else build/rel. Missing, the test
// is skipped, except in CI (make test-go builds both).
func library(t *testing.T, root, env, rel string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join(root, rel)
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (make lib): %v", p, err)
		}
		t.Skipf("%s is not built (make lib); set %s to check another", p, env)
	}
	return p
}

// The library exports exactly the functions of the header: no runtime,
// cgo or internal symbol (ct__slots, ctgo_*, test hooks) is visible. The
// benchmark build adds its hooks and nothing else.
func TestExportsAreTheHeadersFunctions(t *testing.T) {
	root := testutil.ModuleRoot(t)
	api := headerFunctions(t, root)
	require.Contains(t, api, "ct_open", "the header parse found the API")
	require.Contains(t, api, "ct_ambient_session")
	hooks := []string{"ctbench_naive_span_begin", "ctbench_naive_span_end", "ctdebug_runtime"}
	tests := []struct {
		name, env, rel string
		want           []string
	}{
		{"library", "CANDLE_TRACE_LIB", "build/libcandle_trace.so", api},
		{"benchmark library", "CANDLE_TRACE_BENCH_LIB", "build/bench/libcandle_trace.so", append(hooks, api...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := library(t, root, tc.env, tc.rel)
			got := dynamicSymbols(t, lib)
			extra := minus(got, tc.want)
			assert.Empty(t, extra, "%s exports %d symbols that are not the header's functions", lib, len(extra))
			assert.Empty(t, minus(tc.want, got), "%s does not export these functions of the header", lib)
		})
	}
}
