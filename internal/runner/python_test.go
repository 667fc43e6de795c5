package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPython(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o755))
		return p
	}
	venvPython := write("python3.11", "")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "venv", "bin"), 0o755))
	link := filepath.Join(dir, "venv", "bin", "py")
	require.NoError(t, os.Symlink(venvPython, link))
	tests := []struct {
		name   string
		cmd    string
		want   bool
		interp string
	}{
		{"by name", venvPython, true, venvPython},
		{"a link to a python", link, true, link},
		{"env shebang (torchrun, console scripts)", write("torchrun", "#!/usr/bin/env python3\nimport sys\n"), true, "python3"},
		{"env -S shebang", write("tool", "#!/usr/bin/env -S python3 -u\n"), true, "python3"},
		{"a venv's python in the shebang", write("train", "#!/opt/venv/bin/python\n"), true, "/opt/venv/bin/python"},
		{"a shell script", write("run.sh", "#!/bin/sh\nexec python3 x.py\n"), false, ""},
		{"a binary", write("a.out", "\x7fELF\x02\x01"), false, ""},
		{"not found", filepath.Join(dir, "missing"), false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, interp := Python(tc.cmd)
			assert.Equal(t, tc.want, ok)
			assert.Equal(t, tc.interp, interp)
		})
	}
}

func TestSkipsSitecustomize(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"train.py", "-I"}, ""},
		{[]string{"-u", "train.py"}, ""},
		{[]string{"-I", "train.py"}, "-I"},
		{[]string{"-uS", "train.py"}, "-S"},
		{[]string{"-W", "ignore", "-E", "-m", "train"}, "-E"},
		{[]string{"-Wignore", "-m", "train", "-I"}, ""},
		{[]string{"-X", "importtime", "-c", "pass"}, ""},
		{[]string{"-c", "import sys", "-I"}, ""},
		{nil, ""},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, SkipsSitecustomize(tc.args), "%v", tc.args)
	}
}
