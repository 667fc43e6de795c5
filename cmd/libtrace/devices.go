package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/candle-trace/candle-trace/internal/cuda"
	"github.com/candle-trace/candle-trace/internal/session"
)

// deviceStart starts the collectors options asks for on s; the session owns
// them (it flushes them before its terminal line and stops them with it), and
// runs at most one set at a time.
func deviceStart(s *session.Session, options []byte) error {
	o, err := cuda.ParseStartOptions(options)
	if err != nil {
		return err
	}
	return s.StartDevices(func() (session.Devices, error) {
		c, err := cuda.Start(s, o)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return c, nil
	})
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
