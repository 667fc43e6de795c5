// Package outfile decides what the library may do to the path it was given
// for its output (a trace, an aggregate summary). It never follows a final
// symbolic link, never replaces what is not a regular file, and never
// truncates or replaces a file that is not its own: one that is empty or
// whose first bytes the caller's Own recognizes.
package outfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Own tells the library's own files from others by their first bytes (at
// most SniffBytes of them, never none: an empty file is always reusable).
type Own func(prefix []byte) bool

// SniffBytes is how much of an existing file Own is shown.
const SniffBytes = 512

// kind names what a non-regular file is, for messages.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}

// checkOwn refuses a regular file with content that own does not recognize.
func checkOwn(f *os.File, own Own, verb string) error {
	buf := make([]byte, SniffBytes)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("it exists and cannot be read to check that it is ours (%w); refusing to %s it", err, verb)
	}
	if n == 0 || own(buf[:n]) {
		return nil
	}
	head := buf[:min(n, 32)]
	return fmt.Errorf("it exists and is not a candle-trace trace or summary (it starts with %q); refusing to %s it: remove it or choose another path", head, verb)
}

// CheckReplace says whether a file may be renamed over path: nothing is
// there, or a regular file that is empty or own's. A symbolic link (the
// rename would replace the link itself), a device, a FIFO, a socket or a
// directory is refused, and so is anyone else's file.
func CheckReplace(path string, own Own) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if m := st.Mode(); !m.IsRegular() {
		return fmt.Errorf("it is %s, not a regular file, and renaming a file over its path would replace it; give the path of a regular file", kind(m))
	}
	return checkOwnAt(path, st, own, "replace")
}

// checkOwnAt runs checkOwn on the regular file at path, opened for reading
// only, which must still be the file st describes.
func checkOwnAt(path string, st fs.FileInfo, own Own, verb string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if now, err := f.Stat(); err != nil || !os.SameFile(st, now) {
		return errChanged
	}
	return checkOwn(f, own, verb)
}

// CheckCreate says whether Create would accept path, without creating,
// truncating or opening anything for writing: nothing stands there, or a
// character device or a FIFO, or a regular file this process may write that
// is empty or own's. When nothing is there, the folder need not exist yet,
// but the nearest folder that does must be one this process may create
// files in. A buffered session checks its path so at ct_open and creates
// the file only at ct_finish (with Create, which checks again).
func CheckCreate(path string, own Own) error {
	_, err := CheckCreateIn(path, own, "")
	return err
}

// CheckCreateIn is CheckCreate for a caller that checks one path after
// another in the same folder (a flight recorder's update after update):
// usable is a folder an earlier check found usable ("" for none). A path
// that does not exist yet in that folder costs one lstat instead of the
// folder's checks. It returns the folder it found usable, "" when it
// checked none (the path exists). A folder made unusable since is then
// found only by Create.
func CheckCreateIn(path string, own Own, usable string) (string, error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		dir := filepath.Dir(path)
		if usable != "" && dir == usable {
			return dir, nil
		}
		if err := checkFolder(dir); err != nil {
			return "", err
		}
		return dir, nil
	}
	if err != nil {
		return "", err
	}
	return "", checkExisting(path, st, own)
}

// checkExisting is CheckCreate of a path where st stands.
func checkExisting(path string, st fs.FileInfo, own Own) error {
	m := st.Mode()
	switch {
	case m&fs.ModeSymlink != 0:
		return errors.New("it is a symbolic link, which candle-trace does not follow; give the path of the file itself")
	case m&fs.ModeNamedPipe != 0 || m&fs.ModeCharDevice != 0:
		return nil
	case !m.IsRegular():
		return fmt.Errorf("it is %s; a trace is written to a regular file, a character device or a FIFO", kind(m))
	}
	if err := checkOwnAt(path, st, own, "overwrite"); err != nil {
		return err
	}
	if err := syscall.Access(path, accessW); err != nil {
		return fmt.Errorf("it exists and this process may not write it: %w", err)
	}
	return nil
}

// access(2) modes.
const (
	accessW = 0x2
	accessX = 0x1
)

// checkFolder says whether MkdirAll(dir) could succeed and a file be created
// in dir: its nearest existing ancestor is a folder this process may write
// and search.
func checkFolder(dir string) error {
	for d := dir; ; {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("%s is not a directory, so its folder cannot be made", d)
			}
			if err := syscall.Access(d, accessW|accessX); err != nil {
				return fmt.Errorf("cannot create files in folder %s: %w", d, err)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("folder %s: %w", d, err)
		}
		parent := filepath.Dir(d)
		if parent == d {
			return nil
		}
		d = parent
	}
}

// File is an output file opened by Create.
type File struct {
	*os.File
	created bool
	// replace: the path of an own file (a trace) that this one, a new file
	// beside it, replaces at its first write, by a rename: a process killed
	// before that (inside ct_open) leaves the old file as it was, never an
	// emptied one. orig is that file as checked; "" once replaced.
	replace string
	orig    fs.FileInfo
}

// Write writes b and, at the first write of a file that replaces an own
// one, puts it in that file's place.
func (f *File) Write(b []byte) (int, error) {
	n, err := f.File.Write(b)
	if err == nil && f.replace != "" {
		err = f.commit()
	}
	return n, err
}

// Settled says whether f is at its path for good (nothing left to replace).
func (f *File) Settled() bool { return f.replace == "" }

// WriteString is Write of s (os.File's would bypass the replacement).
func (f *File) WriteString(s string) (int, error) { return f.Write([]byte(s)) }

// commit renames the new file over the one it replaces, if that is still
// the file checked (else errChanged, and the new file stays unnamed there).
func (f *File) commit() error {
	now, err := os.Lstat(f.replace)
	if err != nil || !os.SameFile(f.orig, now) {
		return fmt.Errorf("%s: %w", f.replace, errChanged)
	}
	if err := os.Rename(f.File.Name(), f.replace); err != nil {
		return err
	}
	f.replace = ""
	return nil
}

// Discard closes f and removes it when Create made it (and it is still the
// file at its path): a trace that could not start leaves nothing behind,
// and what was there before is never deleted. A regular file Create found
// (empty or own's, so truncated then) is emptied again: what was written
// since goes, and an empty file claims nothing.
func (f *File) Discard() {
	if f.replace != "" {
		// Never put in place: the file it would replace is untouched.
		f.Close()
		os.Remove(f.File.Name())
		return
	}
	st, err := f.Stat()
	if err == nil && !f.created && st.Mode().IsRegular() {
		_ = f.Truncate(0)
	}
	f.Close()
	if err != nil || !f.created {
		return
	}
	if now, err := os.Lstat(f.Name()); err == nil && os.SameFile(st, now) {
		os.Remove(f.Name())
	}
}

// Create opens path for writing a stream (a trace) from its start. A new
// file is created (0644); an existing regular file is replaced only when it
// is empty or own's, anyone else's is refused: an empty one is written in
// place, an own one is replaced by a new file beside it that takes its name
// at the first write (File.Write), so that a kill before leaves it whole. A character device or a FIFO
// is written as it is (nothing to truncate or replace). A final symbolic
// link is never followed; it, a directory, a socket or a block device is
// refused.
func Create(path string, own Own) (*File, error) {
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
		if err == nil {
			return &File{File: f, created: true}, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		nf, err := openExisting(path, own)
		// Removed or replaced while it was looked at: look again.
		if (errors.Is(err, fs.ErrNotExist) || errors.Is(err, errChanged)) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return nf, nil
	}
}

var errChanged = errors.New("it changed while it was opened")

func openExisting(path string, own Own) (*File, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	m := st.Mode()
	stream := m&fs.ModeNamedPipe != 0 || m&fs.ModeCharDevice != 0
	if !m.IsRegular() && !stream {
		if m&fs.ModeSymlink != 0 {
			return nil, errors.New("it is a symbolic link, which candle-trace does not follow; give the path of the file itself")
		}
		return nil, fmt.Errorf("it is %s; a trace is written to a regular file, a character device or a FIFO", kind(m))
	}
	flags := os.O_RDWR
	if stream {
		flags = os.O_WRONLY
	}
	f, err := os.OpenFile(path, flags|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if now, err := f.Stat(); err != nil || !os.SameFile(st, now) {
		f.Close()
		return nil, errChanged
	}
	if stream || st.Size() == 0 {
		return &File{File: f}, nil
	}
	if err := checkOwn(f, own, "overwrite"); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	nf, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.new")
	if err != nil {
		return nil, err
	}
	if err := nf.Chmod(m.Perm()); err != nil {
		nf.Close()
		os.Remove(nf.Name())
		return nil, err
	}
	return &File{File: nf, replace: path, orig: st}, nil
}
