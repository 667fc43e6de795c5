package outfile

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ours stands for the library's recognizer in these tests.
func ours(prefix []byte) bool { return bytes.HasPrefix(prefix, []byte("OURS")) }

func TestCreate(t *testing.T) {
	tests := []struct {
		name    string
		make    func(t *testing.T, path string) // nil: nothing there
		msg     string                          // "" = opened
		created bool
	}{
		{"new file", nil, "", true},
		{"empty file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, nil, 0o600)) }, "", false},
		{"our file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("OURS old"), 0o600)) }, "", false},
		{"someone else's file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("theirs"), 0o600)) },
			`it exists and is not a candle-trace trace or summary (it starts with "theirs"); refusing to overwrite it`, false},
		{"symlink to our file", func(t *testing.T, p string) {
			target := p + ".target"
			require.NoError(t, os.WriteFile(target, []byte("OURS"), 0o600))
			require.NoError(t, os.Symlink(target, p))
		}, "it is a symbolic link, which candle-trace does not follow", false},
		{"directory", func(t *testing.T, p string) { require.NoError(t, os.Mkdir(p, 0o755)) }, "it is a directory", false},
		{"socket", func(t *testing.T, p string) {
			l, err := net.Listen("unix", p)
			require.NoError(t, err)
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			t.Cleanup(func() { l.Close() })
		}, "it is a socket", false},
		{"character device", func(t *testing.T, p string) {
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3); err != nil { // a private /dev/null
				t.Skipf("mknod: %v", err)
			}
		}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			if tc.make != nil {
				tc.make(t, path)
			}
			before, _ := os.Lstat(path)
			f, err := Create(path, ours)
			if tc.msg != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.msg)
				after, lerr := os.Lstat(path)
				require.NoError(t, lerr)
				assert.True(t, os.SameFile(before, after))
				assert.Equal(t, before.Size(), after.Size())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.created, f.created)
			_, err = f.WriteString("OURS new\n")
			require.NoError(t, err)
			require.NoError(t, f.Close())
			if st, _ := os.Lstat(path); st.Mode().IsRegular() {
				data, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, "OURS new\n", string(data), "truncated, then written from the start")
			}
		})
	}
}

// A FIFO is written as a stream, never read or truncated.
func TestCreateWritesIntoAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	require.NoError(t, err)
	defer r.Close()
	f, err := Create(path, ours)
	require.NoError(t, err)
	_, err = f.WriteString("line\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	buf := make([]byte, 16)
	n, err := r.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "line\n", string(buf[:n]))
}

// Discard removes only a file Create made.
func TestDiscard(t *testing.T) {
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh")
	f, err := Create(fresh, ours)
	require.NoError(t, err)
	f.Discard()
	assert.NoFileExists(t, fresh)

	reused := filepath.Join(dir, "reused")
	require.NoError(t, os.WriteFile(reused, []byte("OURS"), 0o600))
	f, err = Create(reused, ours)
	require.NoError(t, err)
	f.Discard()
	assert.FileExists(t, reused)
}

func TestCheckReplace(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, path string)
		msg  string
	}{
		{"nothing", nil, ""},
		{"empty file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, nil, 0o600)) }, ""},
		{"our file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("OURS"), 0o600)) }, ""},
		{"someone else's file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("theirs"), 0o600)) },
			"is not a candle-trace trace or summary (it starts with \"theirs\"); refusing to replace it"},
		{"fifo", func(t *testing.T, p string) { require.NoError(t, syscall.Mkfifo(p, 0o600)) }, "it is a named pipe (FIFO), not a regular file"},
		{"symlink", func(t *testing.T, p string) { require.NoError(t, os.Symlink("elsewhere", p)) }, "it is a symbolic link, not a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			if tc.make != nil {
				tc.make(t, path)
			}
			err := CheckReplace(path, ours)
			if tc.msg == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// A reused file that Discard is given back is emptied: what this run wrote
// into it goes, and nothing that claims to be a trace stays.
func TestDiscardEmptiesAReusedFile(t *testing.T) {
	reused := filepath.Join(t.TempDir(), "reused")
	require.NoError(t, os.WriteFile(reused, []byte("OURS"), 0o600))
	f, err := Create(reused, ours)
	require.NoError(t, err)
	_, err = f.WriteString("OURS, half written")
	require.NoError(t, err)
	f.Discard()
	data, err := os.ReadFile(reused)
	require.NoError(t, err)
	assert.Empty(t, data)
}

// CheckCreate judges a path as Create would, and changes nothing.
func TestCheckCreate(t *testing.T) {
	tests := []struct {
		name string
		rel  string // the path under the test's folder
		make func(t *testing.T, dir string)
		msg  string
	}{
		{"nothing", "out", nil, ""},
		{"folders to make", "a/b/c/out", nil, ""},
		{"empty file", "out", func(t *testing.T, d string) { require.NoError(t, os.WriteFile(filepath.Join(d, "out"), nil, 0o600)) }, ""},
		{"our file", "out", func(t *testing.T, d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, "out"), []byte("OURS"), 0o600))
		}, ""},
		{"fifo", "out", func(t *testing.T, d string) { require.NoError(t, syscall.Mkfifo(filepath.Join(d, "out"), 0o600)) }, ""},
		{"someone else's file", "out", func(t *testing.T, d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, "out"), []byte("theirs"), 0o600))
		}, "is not a candle-trace trace or summary (it starts with \"theirs\"); refusing to overwrite it"},
		{"symlink", "out", func(t *testing.T, d string) { require.NoError(t, os.Symlink("elsewhere", filepath.Join(d, "out"))) },
			"it is a symbolic link, which candle-trace does not follow"},
		{"directory", "out", func(t *testing.T, d string) { require.NoError(t, os.Mkdir(filepath.Join(d, "out"), 0o755)) },
			"it is a directory"},
		{"parent is a file", "file/out", func(t *testing.T, d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o600))
		}, "is not a directory"},
		{"ancestor is a file", "file/sub/out", func(t *testing.T, d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o600))
		}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.make != nil {
				tc.make(t, dir)
			}
			before := listTree(t, dir)
			err := CheckCreate(filepath.Join(dir, tc.rel), ours)
			assert.Equal(t, before, listTree(t, dir), "CheckCreate changed the folder")
			if tc.msg == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// CheckCreateIn skips the folder's checks for a missing path in the folder
// an earlier check found usable, and checks everything else as CheckCreate.
func TestCheckCreateIn(t *testing.T) {
	tests := []struct {
		name       string
		rel        string // the path under the test's folder
		usable     string // under the test's folder; "" for none
		make       func(t *testing.T, dir string)
		wantFolder string // under the test's folder; "" for none
		msg        string
	}{
		{"first check of a folder", "no/out", "", makeUnusable, "", "is not a directory"},
		{"the usable folder is not checked again", "no/out", "no", makeUnusable, "no", ""},
		{"another folder is", "no/out", "other", makeUnusable, "", "is not a directory"},
		{"a folder to make", "a/b/out", "", nil, "a/b", ""},
		{"an existing path is always checked", "sub/out", "sub", func(t *testing.T, d string) {
			require.NoError(t, os.Mkdir(filepath.Join(d, "sub"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(d, "sub/out"), []byte("theirs"), 0o600))
		}, "", "refusing to overwrite it"},
		{"our file: no folder checked", "out", "", func(t *testing.T, d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, "out"), []byte("OURS"), 0o600))
		}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.make != nil {
				tc.make(t, dir)
			}
			usable := ""
			if tc.usable != "" {
				usable = filepath.Join(dir, tc.usable)
			}
			folder, err := CheckCreateIn(filepath.Join(dir, tc.rel), ours, usable)
			if tc.msg != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.msg)
				assert.Empty(t, folder)
				return
			}
			require.NoError(t, err)
			want := ""
			if tc.wantFolder != "" {
				want = filepath.Join(dir, tc.wantFolder)
			}
			assert.Equal(t, want, folder)
		})
	}
}

// makeUnusable puts a file where folder "no" would be: no file can be
// created under it, whoever the process is.
func makeUnusable(t *testing.T, dir string) {
	require.NoError(t, os.WriteFile(filepath.Join(dir, "no"), []byte("x"), 0o600))
}

// listTree names every entry under dir with its size and mode.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %d %v", p, info.Size(), info.Mode()))
		return nil
	}))
	return out
}

// An own file being replaced stays whole until the new one's first write:
// a process killed inside ct_open (after Create, before the meta line)
// leaves the old trace, never an empty file; a Discard before that write
// leaves it too, and nothing beside it.
func TestReplacingKeepsTheOldFileUntilTheFirstWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("OURS old\n"), 0o640))
	names := func() []string {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}

	f, err := Create(path, ours)
	require.NoError(t, err)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "OURS old\n", string(data), "killed here, the old trace is still there")
	f.Discard()
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "OURS old\n", string(data))
	assert.Equal(t, []string{"trace.jsonl"}, names())

	f, err = Create(path, ours)
	require.NoError(t, err)
	_, err = f.Write([]byte("OURS new\n"))
	require.NoError(t, err)
	_, err = f.Write([]byte("more\n"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "OURS new\nmore\n", string(data))
	assert.Equal(t, []string{"trace.jsonl"}, names())
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm(), "the replaced file's permissions are kept")
}
