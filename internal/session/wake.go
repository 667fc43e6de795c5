package session

/*
#include "fastpath.h"
*/
import "C"

import (
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
		go func() {
			var buf [8]byte
			for {
				_, err := syscall.Read(fd, buf[:])
				if err == syscall.EINTR {
					continue
				}
				if err != nil {
					return
				}
				drainAndWrite()
			}
		}()
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
