package logmon

import (
	"errors"
	"fmt"
)

// Defaults of Nomad's logs block.
const (
	DefaultMaxFiles      = 10
	DefaultMaxFileSizeMB = 10
)

// ErrInvalidConfig is returned for a Config that Validate refuses.
var ErrInvalidConfig = errors.New("invalid log configuration")

// Config is the rotation policy of one task's logs: the same for stdout
// and stderr, but applied to each stream separately.
type Config struct {
	// MaxFiles is how many files of a stream are kept: after a
	// rotation the oldest beyond this count are deleted (max_files).
	MaxFiles int
	// MaxFileSizeMB is the size in MiB at which a file is rotated
	// (max_file_size).
	MaxFileSizeMB int

	// maxFileBytes, when not zero, replaces MaxFileSizeMB: the tests of
	// this package rotate every few KiB, which the MiB-sized public knob
	// cannot express and operators have no use for.
	maxFileBytes int64
}

// DefaultConfig returns Nomad's defaults: 10 files of 10 MiB per stream.
func DefaultConfig() Config {
	return Config{MaxFiles: DefaultMaxFiles, MaxFileSizeMB: DefaultMaxFileSizeMB}
}

// Validate refuses a policy that would keep no file or rotate at zero
// bytes: either would lose output.
func (c Config) Validate() error {
	if c.MaxFiles < 1 {
		return fmt.Errorf("%w: max_files must be at least 1, got %d", ErrInvalidConfig, c.MaxFiles)
	}
	switch {
	case c.maxFileBytes < 0:
		return fmt.Errorf("%w: max file size must be positive, got %d bytes", ErrInvalidConfig, c.maxFileBytes)
	case c.maxFileBytes == 0 && c.MaxFileSizeMB < 1:
		return fmt.Errorf("%w: max_file_size must be at least 1 MiB, got %d", ErrInvalidConfig, c.MaxFileSizeMB)
	}
	return nil
}

// fileBytes is the rotation threshold in bytes.
func (c Config) fileBytes() int64 {
	if c.maxFileBytes > 0 {
		return c.maxFileBytes
	}
	return int64(c.MaxFileSizeMB) << 20
}
