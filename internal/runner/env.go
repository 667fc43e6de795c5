package runner

import (
	"bytes"
	_ "embed"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The variables the injected sitecustomize reads (sitecustomize.py and
// candle_trace/torch/_run.py): the runner's options for a Python child.
const (
	EnvOutput        = "CANDLE_TRACE_RUN_OUTPUT"
	EnvCaptureStep   = "CANDLE_TRACE_RUN_CAPTURE_STEP"
	EnvDeviceCollect = "CANDLE_TRACE_RUN_DEVICE_COLLECT"
	EnvAggregate     = "CANDLE_TRACE_RUN_AGGREGATE"
	// EnvClaim is set by the first Python process that takes the capture
	// (pid:rank): its children see it and stay out.
	EnvClaim = "CANDLE_TRACE_RUN_CLAIM"
)

// sitecustomize is the file the runner puts first on a Python child's
// PYTHONPATH. It is embedded rather than shipped in the Python package so
// that the runner and what it injects are always the same version, and so
// that a folder holding only it goes on PYTHONPATH: nothing else of the
// package can shadow a module of the program.
//
//go:embed sitecustomize.py
var sitecustomize []byte

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// Python says whether the command runs a Python interpreter — python,
// python3.11, a virtualenv's python (by name, or the file it links to), or a
// script whose #! line names python (torchrun, a console script) — and
// which interpreter ("" when none).
func Python(command string) (bool, string) {
	path, err := exec.LookPath(command)
	if err != nil {
		return false, ""
	}
	if pythonName.MatchString(filepath.Base(command)) {
		return true, path
	}
	if r, err := filepath.EvalSymlinks(path); err == nil && pythonName.MatchString(filepath.Base(r)) {
		return true, path
	}
	f, err := os.Open(path)
	if err != nil {
		return false, ""
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := f.Read(head)
	line, _, _ := bytes.Cut(head[:n], []byte("\n"))
	if !bytes.HasPrefix(line, []byte("#!")) {
		return false, ""
	}
	fields := strings.Fields(string(line[2:]))
	if len(fields) > 0 && filepath.Base(fields[0]) == "env" {
		fields = fields[1:]
		for len(fields) > 0 && strings.HasPrefix(fields[0], "-") { // env -S
			fields = fields[1:]
		}
	}
	if len(fields) > 0 && pythonName.MatchString(filepath.Base(fields[0])) {
		return true, fields[0]
	}
	return false, ""
}

// WriteSitecustomize writes the injected sitecustomize.py into a new
// private folder and returns it; the caller removes it.
func WriteSitecustomize() (string, error) {
	dir, err := os.MkdirTemp("", "candle-trace-run-")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sitecustomize.py"), sitecustomize, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// env is an environment as an ordered list with set/unset by name.
type env []string

func (e env) get(name string) string {
	for i := len(e) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(e[i], "="); k == name {
			return v
		}
	}
	return ""
}

func (e env) unset(name string) env {
	out := e[:0:0]
	for _, kv := range e {
		if k, _, _ := strings.Cut(kv, "="); k != name {
			out = append(out, kv)
		}
	}
	return out
}

func (e env) set(name, value string) env { return append(e.unset(name), name+"="+value) }

// prepend puts value before the variable's current value, sep between.
func (e env) prepend(name, value, sep string) env {
	if old := e.get(name); old != "" {
		value += sep + old
	}
	return e.set(name, value)
}

// Environ is the child's environment: base (this process's) with the
// capture set up (the paths in o absolute: the child may change directory).
// python: the command is a Python process (siteDir holds
// the sitecustomize); otherwise the drop-in.
func Environ(base []string, o *Options, libs *Libraries, python bool, siteDir string) ([]string, error) {
	out := o.Output
	collect, _ := o.Collectors() // checked by Parse
	e := env(append([]string(nil), base...)).set("CANDLE_TRACE_LIB", libs.Lib)
	if python {
		if o.Match != "" {
			return nil, errors.New("--match is for the drop-in: a Python command is traced in its " +
				"main process (and each torchrun rank) by the PyTorch integration")
		}
		// The library opens a whole-process session of its own when it loads
		// with CANDLE_TRACE_PATH set; under the integration it must not.
		e = e.unset("CANDLE_TRACE_PATH").unset(EnvClaim)
		py := siteDir
		if libs.PythonPath != "" {
			py += string(os.PathListSeparator) + libs.PythonPath
		}
		e = e.prepend("PYTHONPATH", py, string(os.PathListSeparator))
		e = e.set(EnvOutput, out).set(EnvCaptureStep, strconv.Itoa(o.CaptureStep))
		dc := "auto"
		if collect != nil {
			dc = strings.Join(collect, ",")
			if dc == "" {
				dc = "none"
			}
		}
		e = e.set(EnvDeviceCollect, dc)
		if o.Aggregate != "" {
			e = e.set(EnvAggregate, o.Aggregate)
		}
		return e, nil
	}
	if o.Aggregate != "" {
		return nil, errors.New("--aggregate needs a Python command (the PyTorch integration writes the summary)")
	}
	if libs.Preload == "" {
		return nil, errors.New(PreloadName + " not found next to " + libs.Lib + " (make build/" + PreloadName + ")")
	}
	match := o.Match
	if match == "" {
		match = filepath.Base(o.Command[0])
	}
	e = e.set("CANDLE_TRACE_PATH", out).set("CANDLE_TRACE_MATCH", match)
	e = e.prepend("LD_PRELOAD", libs.Preload, ":")
	if len(collect) > 0 {
		e = e.set("CANDLE_TRACE_DEVICE_COLLECT", strings.Join(collect, ","))
	}
	return e, nil
}
