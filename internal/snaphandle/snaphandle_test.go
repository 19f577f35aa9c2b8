package snaphandle

import (
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, c := range []struct{ id, node, handle string }{
		{"snap-0123456789abcdef01234567", "node-a", "snap-0123456789abcdef01234567@node-a"},
		{"snap-0123456789abcdef01234567", "", "snap-0123456789abcdef01234567"},
		// Too long for the spec: the node is left out.
		{"snap-0123456789abcdef01234567", strings.Repeat("n", 100), "snap-0123456789abcdef01234567"},
	} {
		if h := Format(c.id, c.node); h != c.handle || len(h) > MaxLen {
			t.Errorf("Format(%q, %q) = %q, want %q", c.id, c.node, h, c.handle)
		}
		id, node := Parse(c.handle)
		if want := c.node; len(c.handle) == len(c.id) {
			want = ""
			if node != want {
				t.Errorf("Parse(%q) node = %q, want none", c.handle, node)
			}
		} else if node != want {
			t.Errorf("Parse(%q) node = %q, want %q", c.handle, node, want)
		}
		if id != c.id {
			t.Errorf("Parse(%q) id = %q, want %q", c.handle, id, c.id)
		}
	}
	if h := Format("snap-x", strings.Repeat("n", MaxLen-len("snap-x@"))); len(h) != MaxLen || !strings.Contains(h, Separator) {
		t.Errorf("a handle of exactly %d bytes keeps its node: %q", MaxLen, h)
	}
}
