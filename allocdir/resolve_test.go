package allocdir_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// nonPrintable lists what an allocation ID or task name must never hold:
// every C0 control character, DEL, every C1 control character, and
// Unicode that prints nothing or not as itself.
func nonPrintable() []string {
	var out []string
	for r := rune(1); r < 0x20; r++ {
		out = append(out, string(r))
	}
	out = append(out, "\x7f")
	for r := rune(0x80); r < 0xa0; r++ {
		out = append(out, string(r))
	}
	return append(out,
		"\u00a0",     // no-break space
		"\u00ad",     // soft hyphen
		"\u200b",     // zero-width space
		"\u200e",     // left-to-right mark
		"\u202e",     // right-to-left override
		"\u2028",     // line separator
		"\u2029",     // paragraph separator
		"\u3000",     // ideographic space
		"\ufeff",     // byte order mark
		"\ue000",     // private use
		"\U000e0001", // language tag
		"\xff",       // not UTF-8
		"\xc3",       // truncated UTF-8
	)
}

// TestValidIDAndTaskName: IDs and task names are printable characters
// only, wherever the bad one sits; file and layer names (ValidName) are
// not restricted that way.
func TestValidIDAndTaskName(t *testing.T) {
	t.Parallel()
	for _, bad := range nonPrintable() {
		for _, name := range []string{bad, "a" + bad, bad + "b", "web" + bad + "1"} {
			if err := allocdir.ValidID(name); !errors.Is(err, allocdir.ErrInvalidName) {
				t.Errorf("ValidID(%q): got %v, want ErrInvalidName", name, err)
			}
			if err := allocdir.ValidTaskName(name); !errors.Is(err, allocdir.ErrInvalidName) {
				t.Errorf("ValidTaskName(%q): got %v, want ErrInvalidName", name, err)
			}
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "/", "a\x00b", string(make([]byte, 256))} {
		if err := allocdir.ValidID(bad); !errors.Is(err, allocdir.ErrInvalidName) {
			t.Errorf("ValidID(%q): got %v, want ErrInvalidName", bad, err)
		}
		if err := allocdir.ValidTaskName(bad); !errors.Is(err, allocdir.ErrInvalidName) {
			t.Errorf("ValidTaskName(%q): got %v, want ErrInvalidName", bad, err)
		}
	}
	if err := allocdir.ValidTaskName(allocdir.SharedAllocName); !errors.Is(err, allocdir.ErrInvalidName) {
		t.Errorf("ValidTaskName(%q): got %v, want ErrInvalidName", allocdir.SharedAllocName, err)
	}
	for _, good := range []string{
		"5fd4a0e9-2c1f-4a4b-9f2e-0f6b1c0d3e11", "a1", "web", "redis-cache_2", "my task",
		"tâche", "日本語", "emoji🙂", "x.y", "...", "-dash",
	} {
		if err := allocdir.ValidID(good); err != nil {
			t.Errorf("ValidID(%q): got %v, want nil", good, err)
		}
		if err := allocdir.ValidTaskName(good); err != nil {
			t.Errorf("ValidTaskName(%q): got %v, want nil", good, err)
		}
	}
	// Names inside an allocation may be anything a filesystem takes.
	for _, name := range []string{"a\nb", "\x1b[31m", "\xff"} {
		if err := allocdir.ValidName(name); err != nil {
			t.Errorf("ValidName(%q): got %v, want nil", name, err)
		}
	}
	// The message quotes the name, so that printing it is safe (the
	// text is what is checked here, not which error it is).
	err := allocdir.ValidID("a\x1b[2Jb")
	if want := fmt.Sprintf("%q", "a\x1b[2Jb"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ValidID error: got %v, want it to quote the name as %s", err, want)
	}
}
