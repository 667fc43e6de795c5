package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/candle-trace/candle-trace/internal/cuda"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The device collectors of each session (ct_device_start / ct_device_stop).
// ct_finish and ct_finish_failed flush them before the terminal line and
// stop them once the session is gone.
var (
	devMu      sync.Mutex
	collectors = map[uint64]*cuda.Collectors{}
)

// deviceStart starts the collectors options asks for on s; a session runs
// at most one set at a time.
func deviceStart(s *session.Session, options []byte) error {
	o, err := cuda.ParseStartOptions(options)
	if err != nil {
		return err
	}
	devMu.Lock()
	defer devMu.Unlock()
	if _, ok := collectors[s.Handle()]; ok {
		return &session.Error{Code: session.State, Msg: "ct_device_start: device collectors already run on this session; ct_device_stop them first"}
	}
	c, err := cuda.Start(s, o)
	if err != nil {
		return err
	}
	collectors[s.Handle()] = c
	return nil
}

// deviceStop stops the collectors of s and writes what they hold; without
// collectors it does nothing.
func deviceStop(s *session.Session) error {
	devMu.Lock()
	c := collectors[s.Handle()]
	delete(collectors, s.Handle())
	devMu.Unlock()
	if c == nil {
		return nil
	}
	return c.Stop()
}

// finishing runs end (Finish or FinishFailed) with the collectors of s
// flushed first, so their last samples precede the terminal line, and
// stopped after when the session is gone (a refused Finish leaves them
// running with the session).
func finishing(s *session.Session, end func() error) error {
	devMu.Lock()
	c := collectors[s.Handle()]
	devMu.Unlock()
	if c != nil {
		_ = c.Flush() // a refusal here is the session's and end reports it
	}
	err := end()
	if c != nil {
		if _, lerr := session.Lookup(s.Handle()); lerr != nil {
			devMu.Lock()
			delete(collectors, s.Handle())
			devMu.Unlock()
			_ = c.Stop() // its last sample is refused: the session is gone
		}
	}
	return err
}

// DeviceCollectEnv names the collectors the drop-in session starts
// ("nvml", "cupti" or "nvml,cupti"); DeviceIntervalEnv sets interval_ms.
const (
	DeviceCollectEnv  = "CANDLE_TRACE_DEVICE_COLLECT"
	DeviceIntervalEnv = "CANDLE_TRACE_DEVICE_INTERVAL_MS"
)

// ambientDeviceOptions builds ct_device_start options from the environment;
// nil when no collector is asked for.
func ambientDeviceOptions() ([]byte, error) {
	collect := strings.TrimSpace(os.Getenv(DeviceCollectEnv))
	if collect == "" {
		return nil, nil
	}
	var names []string
	for _, n := range strings.Split(collect, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, strconv.Quote(n))
		}
	}
	opts := fmt.Sprintf(`{"collect":[%s]`, strings.Join(names, ","))
	if ms := strings.TrimSpace(os.Getenv(DeviceIntervalEnv)); ms != "" {
		if _, err := strconv.ParseUint(ms, 10, 31); err != nil {
			return nil, fmt.Errorf("%s=%q is not a whole number of milliseconds", DeviceIntervalEnv, ms)
		}
		opts += `,"interval_ms":` + ms
	}
	return []byte(opts + "}"), nil
}
