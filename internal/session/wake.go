package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var wakeOnce sync.Once

// startWaker starts, once per process and only at the first Open, the
// drainer: the goroutine that drains the rings when a producer thread
// signals that its ring is half full, or full (the producer then waits for
// it: fastpath.c never drains on the application's thread).
func startWaker() {
	wakeOnce.Do(func() {
		fd := int(C.ct__wake_fd_open())
		if fd < 0 {
			// No eventfd: drain on a short tick instead, so a producer
			// waiting for room is never left waiting for long.
			go func() {
				for range time.Tick(time.Millisecond) {
					drainAndWrite()
				}
			}()
			return
		}
		wakeFd.Store(int32(fd))
		go drainOnWake(fd, pollWakes(fd))
	})
}

func drainAndWrite() {
	mu.Lock()
	drainerWrites = true
	drainLocked()
	for _, s := range live {
		s.maybeWrite()
	}
	drainerWrites = false
	mu.Unlock()
}

// wakeFd is the drainer's eventfd; -1 while there is none.
var wakeFd atomic.Int32

func init() { wakeFd.Store(-1) }

// wakeDrainer asks the drainer to run (to write what an application thread
// buffered); with no eventfd, its tick comes soon anyway.
func wakeDrainer() {
	if fd := int(wakeFd.Load()); fd >= 0 {
		one := [8]byte{1}
		syscall.Write(fd, one[:])
	}
}

// pollWakes makes the eventfd fd one Go's network poller waits on
// (wakeFile), where it can; false leaves fd blocking.
func pollWakes(fd int) bool {
	if syscall.SetNonblock(fd, true) != nil {
		return false
	}
	wakeFile = os.NewFile(uintptr(fd), "candle-trace-drainer-wake")
	return true
}

// drainOnWake drains whenever the eventfd fd counts a wake-up. It waits in
// Go's network poller (wakeFile), not in a blocking read(2): a goroutine
// blocked in a system call keeps the runtime's monitor thread polling every
// 20 us, and with one P it takes the P away (a thread woken and parked
// again) at each wait -- with the trace's raw writes (rawWrite), a fifth of
// the process's CPU in a burst of spans. Where the poller does not take the
// descriptor (a read then says EAGAIN), a blocking read does.
func drainOnWake(fd int, polled bool) {
	var buf [8]byte
	for polled {
		_, err := wakeFile.Read(buf[:])
		if err == nil {
			yieldToProducers()
			drainAndWrite()
			continue
		}
		if !errors.Is(err, syscall.EAGAIN) || syscall.SetNonblock(fd, false) != nil {
			return
		}
		polled = false
	}
	for {
		_, err := syscall.Read(fd, buf[:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		yieldToProducers()
		drainAndWrite()
	}
}

// wakeFile keeps the drainer's eventfd open for the process (an os.File
// closes its descriptor when collected); its Fd method would make the
// descriptor blocking again, so nothing calls it.
var wakeFile *os.File
