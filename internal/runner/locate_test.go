package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLocate(t *testing.T) {
	root := t.TempDir()
	touch := func(parts ...string) string {
		p := filepath.Join(append([]string{root}, parts...)...)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		return p
	}
	repoLib := touch("repo", "build", LibName)
	touch("repo", "build", PreloadName)
	touch("repo", "go.mod")
	touch("repo", "bindings", "python", "candle_trace", "__init__.py")
	pkgLib := touch("site", "candle_trace", LibName)
	exeLib := touch("bin", LibName)
	envLib := touch("env", LibName)
	none := func(string) string { return "" }
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "CANDLE_TRACE_LIB" {
				return v
			}
			return ""
		}
	}
	pkg := func(string) string { return filepath.Dir(pkgLib) }
	tests := []struct {
		name       string
		loc        Locator
		python     bool
		lib        string
		preload    bool
		pythonPath string
		err        string
	}{
		{"$CANDLE_TRACE_LIB first", Locator{Getenv: env(envLib), Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: pkg}, true, envLib, false, "", ""},
		{"next to the executable", Locator{Getenv: none, Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: pkg}, false, exeLib, false, "", ""},
		{"in the Python package", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"), PackageDir: pkg}, true, pkgLib, false, "", ""},
		{"a checkout's build, with its bindings", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"),
			Cwd: filepath.Join(root, "repo", "examples"), PackageDir: none}, true, repoLib, true, filepath.Join(root, "repo", "bindings", "python"), ""},
		{"the executable in a checkout's build", Locator{Getenv: none, Exe: filepath.Join(root, "repo", "build", "candle-trace"), PackageDir: pkg},
			true, repoLib, true, filepath.Join(root, "repo", "bindings", "python"), ""},
		{"a missing $CANDLE_TRACE_LIB", Locator{Getenv: env("/no/lib.so"), Exe: exeLib}, false, "", false, "", "CANDLE_TRACE_LIB=/no/lib.so: no such file"},
		{"nothing anywhere", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"), PackageDir: none}, false, "", false, "",
			LibName + " not found: set CANDLE_TRACE_LIB, pip install bindings/python, or run `make lib`"},
		{"a library but no package", Locator{Getenv: none, Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: none}, true, "", false, "",
			"imports no candle_trace package: pip install bindings/python"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			libs, err := tc.loc.Locate("python3", tc.python)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.lib, libs.Lib)
			assert.Equal(t, tc.preload, libs.Preload != "", libs.Preload)
			assert.Equal(t, tc.pythonPath, libs.PythonPath)
			assert.True(t, strings.HasSuffix(libs.Lib, LibName))
		})
	}
}
