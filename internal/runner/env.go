package runner

import (
	"errors"
	"os"
	"path/filepath"
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
	EnvWatch         = "CANDLE_TRACE_RUN_WATCH"
	EnvMaxTraces     = "CANDLE_TRACE_RUN_MAX_TRACES"
	EnvFlightRecord  = "CANDLE_TRACE_RUN_FLIGHT_RECORDER"
	// EnvClaim is set by the first Python process that takes the capture
	// (pid:rank): its children see it and stay out.
	EnvClaim = "CANDLE_TRACE_RUN_CLAIM"
)

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
		e = e.unset("CANDLE_TRACE_PATH").unset(EnvClaim).unset(EnvWatch).unset(EnvMaxTraces).unset(EnvFlightRecord)
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
		if o.Watch != "" {
			e = e.set(EnvWatch, o.Watch).set(EnvMaxTraces, strconv.Itoa(o.MaxTraces))
			if o.NoFlightRecorder {
				e = e.set(EnvFlightRecord, "0")
			}
		}
		return e, nil
	}
	if o.Aggregate != "" {
		return nil, errors.New("--aggregate needs a Python command (the PyTorch integration writes the summary)")
	}
	if o.Watch != "" {
		return nil, errors.New("--watch needs a Python command (the PyTorch integration watches each optimizer step)")
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
