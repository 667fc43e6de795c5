package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// Chromium returns a Chromium (or Chrome) binary for the browser tests:
// $CHROMIUM, else the first of chromium, chromium-browser, google-chrome on
// PATH. Without one the test is skipped, except in CI (CI set), where it
// fails: CI installs Debian's chromium (apt-get install chromium).
func Chromium(t testing.TB) string {
	t.Helper()
	if c := os.Getenv("CHROMIUM"); c != "" {
		return c
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium found ($CHROMIUM, or chromium on PATH); CI installs it: apt-get install --no-install-recommends chromium")
	}
	t.Skip("chromium not installed: apt-get install --no-install-recommends chromium")
	return ""
}
