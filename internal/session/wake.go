package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"sync"
	"syscall"
)

var wakeOnce sync.Once

// startWaker starts, once per process and only at the first Open, the
// goroutine that drains the rings when a producer thread signals that its
// ring is half full. Producers then rarely drain synchronously themselves.
func startWaker() {
	wakeOnce.Do(func() {
		fd := int(C.ct__wake_fd_open())
		if fd < 0 {
			return // producers fall back to draining when their ring is full
		}
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
				mu.Lock()
				drainLocked()
				for _, s := range live {
					s.maybeWrite()
				}
				mu.Unlock()
			}
		}()
	})
}
