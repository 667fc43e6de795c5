package runner

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Library and shim file names, as the build and the Python package ship them.
const (
	LibName     = "libcandle_trace.so"
	PreloadName = "libcandle_trace_preload.so"
)

// Libraries is what the run needs from the installation.
type Libraries struct {
	Lib     string // libcandle_trace.so
	Preload string // the drop-in shim next to it ("" when absent)
	From    string // where they were found, for messages
	// PythonPath: a folder to put on the child's PYTHONPATH so that it
	// imports the candle_trace package matching Lib ("" when the
	// interpreter imports one already).
	PythonPath string
}

// Locator finds the libraries. Its fields are the environment it looks at,
// so that tests can give it another one.
type Locator struct {
	Getenv func(string) string
	Exe    string // this executable
	Cwd    string
	// PackageDir: the folder of the candle_trace package python imports
	// ("" when it imports none).
	PackageDir func(python string) string
}

// DefaultLocator looks at this process's environment and executable.
func DefaultLocator() Locator {
	exe, _ := os.Executable()
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	cwd, _ := os.Getwd()
	return Locator{Getenv: os.Getenv, Exe: exe, Cwd: cwd, PackageDir: pythonPackageDir}
}

// pythonPackageDir asks python where it would import candle_trace from,
// without importing it (find_spec runs none of the package's code).
func pythonPackageDir(python string) string {
	out, err := exec.Command(python, "-c",
		"import importlib.util as u; s = u.find_spec('candle_trace'); "+
			"print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// repoRoot is the source checkout above dir (a go.mod next to
// bindings/python/candle_trace), or "".
func repoRoot(dir string) string {
	for dir != "" {
		if isFile(filepath.Join(dir, "go.mod")) &&
			isFile(filepath.Join(dir, "bindings", "python", "candle_trace", "__init__.py")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
	return ""
}

// Locate finds the library: $CANDLE_TRACE_LIB, else next to this
// executable, else inside the candle_trace package python imports, else a
// source checkout's build/ (above this executable or the working directory).
// python is the interpreter the child runs ("" for a program that is none;
// python3 is asked then). needPython: the child imports candle_trace.
func (l Locator) Locate(python string, needPython bool) (*Libraries, error) {
	if python == "" {
		python = "python3"
	}
	pkg, pkgAsked := "", false
	packageDir := func() string { // asked once, and only when needed
		if !pkgAsked && l.PackageDir != nil {
			pkg, pkgAsked = l.PackageDir(python), true
		}
		return pkg
	}
	var repos []string
	for _, d := range []string{filepath.Dir(l.Exe), l.Cwd} {
		if r := repoRoot(d); r != "" {
			repos = append(repos, r)
		}
	}

	libs := &Libraries{}
	if env := l.Getenv("CANDLE_TRACE_LIB"); env != "" {
		if !isFile(env) {
			return nil, fmt.Errorf("CANDLE_TRACE_LIB=%s: no such file", env)
		}
		libs.Lib, libs.From = env, "$CANDLE_TRACE_LIB"
	}
	places := []struct {
		dir  func() string
		from string
	}{
		{func() string { return filepath.Dir(l.Exe) }, "next to " + l.Exe},
		{packageDir, "the candle_trace package"},
	}
	for _, r := range repos {
		r := r
		places = append(places, struct {
			dir  func() string
			from string
		}{func() string { return filepath.Join(r, "build") }, "the checkout's build/"})
	}
	var tried []string
	for _, p := range places {
		if libs.Lib != "" {
			break
		}
		d := p.dir()
		if d == "" {
			continue
		}
		tried = append(tried, d)
		if isFile(filepath.Join(d, LibName)) {
			libs.Lib, libs.From = filepath.Join(d, LibName), p.from+" ("+d+")"
		}
	}
	if libs.Lib == "" {
		return nil, fmt.Errorf("%s not found: set CANDLE_TRACE_LIB, pip install bindings/python, "+
			"or run `make lib` in the checkout (looked in %s)", LibName, strings.Join(tried, ", "))
	}
	if p := filepath.Join(filepath.Dir(libs.Lib), PreloadName); isFile(p) {
		libs.Preload = p
	}
	if !needPython {
		return libs, nil
	}
	// The Python package that matches the library: a checkout's, when the
	// library is that checkout's build, else the one python imports, else
	// a checkout's.
	for _, r := range repos {
		if filepath.Dir(libs.Lib) == filepath.Join(r, "build") {
			libs.PythonPath = filepath.Join(r, "bindings", "python")
			return libs, nil
		}
	}
	if packageDir() != "" {
		return libs, nil
	}
	if len(repos) > 0 {
		libs.PythonPath = filepath.Join(repos[0], "bindings", "python")
		return libs, nil
	}
	return nil, fmt.Errorf("%s imports no candle_trace package: pip install bindings/python", python)
}
