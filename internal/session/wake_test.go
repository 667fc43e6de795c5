package session

import (
	"regexp"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The drainer waits for its wake-ups in Go's network poller ("IO wait"),
// never in a blocking read(2) ("syscall"), which would keep the runtime's
// monitor polling and its one P handed from thread to thread.
func TestDrainerWaitsInThePollerNotInASystemCall(t *testing.T) {
	openT(t, trainRun)
	require.NotNil(t, wakeFile, "the eventfd went to the poller")
	flags, err := fcntlGetFl(int(wakeFd.Load()))
	require.NoError(t, err)
	require.NotZero(t, flags&syscall.O_NONBLOCK)

	state := regexp.MustCompile(`(?m)^goroutine \d+ \[([^\],]+)[^\]]*\]:\n(?:.+\n){0,40}?.*session\.drainOnWake`)
	for i := 0; i < 3; i++ {
		wakeDrainer() // a drain, then the wait again
		deadline := time.Now().Add(5 * time.Second)
		for {
			buf := make([]byte, 1<<20)
			// (a goroutine running on another thread shows no stack: no match)
			m := state.FindSubmatch(buf[:runtime.Stack(buf, true)])
			if m != nil && string(m[1]) == "IO wait" {
				break
			}
			if m != nil {
				require.NotEqual(t, "syscall", string(m[1]), "the drainer waits in a system call")
			}
			require.True(t, time.Now().Before(deadline), "the drainer did not go back to its wait (%q)", m)
			time.Sleep(time.Millisecond)
		}
	}
}

func fcntlGetFl(fd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
