package runner

import (
	"bytes"
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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

// SkipsSitecustomize returns the interpreter flag among args (those before
// the script, -m or -c) that keeps Python from importing the injected
// sitecustomize: -I (isolated) and -E ignore PYTHONPATH, -S skips site. ""
// when there is none.
func SkipsSitecustomize(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return ""
		}
		if strings.HasPrefix(a, "--") {
			continue // --version and the like
		}
		for _, c := range a[1:] {
			switch c {
			case 'I', 'E', 'S':
				return "-" + string(c)
			case 'c', 'm':
				return "" // what follows is the program
			case 'W', 'X':
				if len(a) == 2 {
					i++ // the option's value is the next argument
				}
				goto next
			}
		}
	next:
	}
	return ""
}
