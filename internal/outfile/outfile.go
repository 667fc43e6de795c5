// Package outfile decides what the library may do to the path it was given
// for its output (a trace, an aggregate summary): it never follows a final
// symbolic link, and it never replaces what is not a regular file.
package outfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

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

// CheckReplace says whether a file may be renamed over path: nothing is
// there, or a regular file is. A symbolic link (the rename would replace the
// link itself), a device, a FIFO, a socket or a directory is refused.
func CheckReplace(path string) error {
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
	return nil
}
