package runner

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"unsafe"
)

// Exit codes of the runner itself; otherwise it returns the child's.
const (
	ExitUsage    = 2   // bad flags
	ExitNotFound = 127 // the command or the library could not be found (as a shell says)
)

// forwarded are the signals passed on to the child. SIGINT and SIGQUIT only
// when they cannot have come from the terminal (see fromTerminal).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2}

// Runner runs one command; its fields are what tests replace.
type Runner struct {
	Locator Locator
	Environ []string
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer // the child's, and the runner's own lines
	// FromTerminal says whether a SIGINT/SIGQUIT the runner got was the
	// terminal's (then the child, in the same foreground process group, got
	// it too and it must not be sent twice).
	FromTerminal func() bool
}

// Main is `candle-trace run ARGS`: it returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	r := Runner{Locator: DefaultLocator(), Environ: os.Environ(), Stdin: os.Stdin,
		Stdout: stdout, Stderr: stderr, FromTerminal: fromTerminal}
	return r.Run(args)
}

// Run parses args, runs the command and returns its exit status (128+N
// when a signal N killed it).
func (r Runner) Run(args []string) int {
	o, err := Parse(args)
	if errors.Is(err, ErrHelp) {
		io.WriteString(r.Stdout, Usage)
		return 0
	}
	if err == nil {
		err = o.Absolute()
	}
	if err != nil {
		fmt.Fprintf(r.Stderr, "candle-trace run: %v\n\n", err)
		io.WriteString(r.Stderr, Usage)
		return ExitUsage
	}
	path, err := exec.LookPath(o.Command[0])
	if err != nil {
		fmt.Fprintf(r.Stderr, "candle-trace run: %v\n", err)
		return ExitNotFound
	}
	python, interpreter := Python(path)
	libs, err := r.Locator.Locate(interpreter, python)
	if err != nil {
		fmt.Fprintf(r.Stderr, "candle-trace run: %v\n", err)
		return ExitNotFound
	}
	siteDir := ""
	// Flags of the interpreter itself (a #! script's arguments are its own).
	if flag := SkipsSitecustomize(o.Command[1:]); python && interpreter == path && flag != "" {
		fmt.Fprintf(r.Stderr, "candle-trace run: python %s skips the sitecustomize that injects the "+
			"PyTorch integration: nothing will be traced\n", flag)
	}
	if python {
		if siteDir, err = WriteSitecustomize(); err != nil {
			fmt.Fprintf(r.Stderr, "candle-trace run: %v\n", err)
			return 1
		}
		defer os.RemoveAll(siteDir)
	}
	envv, err := Environ(r.Environ, o, libs, python, siteDir)
	if err != nil {
		fmt.Fprintf(r.Stderr, "candle-trace run: %v\n", err)
		return ExitUsage
	}
	before := SnapshotAll(Patterns(o, python))
	cmd := exec.Command(path, o.Command[1:]...)
	cmd.Args[0] = o.Command[0] // the name it was given, as a shell runs it
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = envv, r.Stdin, r.Stdout, r.Stderr
	code, err := r.wait(cmd)
	if err != nil {
		fmt.Fprintf(r.Stderr, "candle-trace run: %v\n", err)
		return ExitNotFound
	}
	Summarize(r.Stderr, o, python, before)
	return code
}

// wait starts cmd, forwards signals to it until it ends, and returns its
// exit status; the error is the one of a command that did not start.
func (r Runner) wait(cmd *exec.Cmd) (int, error) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				if (s == syscall.SIGINT || s == syscall.SIGQUIT) && r.FromTerminal != nil && r.FromTerminal() {
					continue
				}
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	_ = cmd.Wait() // the status says how it ended
	close(done)
	return exitStatus(cmd.ProcessState), nil
}

func exitStatus(st *os.ProcessState) int {
	if st == nil {
		return 1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := st.ExitCode(); code >= 0 {
		return code
	}
	return 1
}

// fromTerminal: this process is in the foreground process group of its
// controlling terminal, so a SIGINT (Ctrl-C) or SIGQUIT (Ctrl-\) it got
// went to the whole group, the child included.
func fromTerminal() bool {
	tty, err := os.Open("/dev/tty")
	if err != nil {
		return false // no controlling terminal: somebody sent it to us alone
	}
	defer tty.Close()
	var fg int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, tty.Fd(), syscall.TIOCGPGRP,
		uintptr(unsafe.Pointer(&fg))); errno != 0 {
		return false
	}
	return int(fg) == syscall.Getpgrp()
}
