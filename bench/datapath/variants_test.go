package datapath

import (
	"slices"
	"strings"
	"testing"
)

// usage is the flag package's -h output as podvol-plugin prints it.
const usage = `Usage of podvol-plugin:
  -capacity string
    	pool capacity, e.g. 20Gi; default: the size of the filesystem holding --pool-dir
  -direct-io-probe
    	a flag whose name only starts like it
  -endpoint string
    	CSI endpoint: unix:///path/to/csi.sock (default "unix:///run/podvol/csi.sock")
`

func TestVariantsFollowThePluginsFlags(t *testing.T) {
	if HasFlag(usage, DirectIOFlag) {
		t.Fatal("-direct-io-probe taken for -direct-io")
	}
	v := DefaultVariants(usage)
	if len(v) != 2 || v[0].Name != "before" || v[1].Name != "after" || len(v[0].Args)+len(v[1].Args) != 0 || !strings.Contains(v[1].Note, "after = before") {
		t.Errorf("without the flag: %+v, want before and after with no arguments and a note", v)
	}
	with := usage + "  -direct-io\n    \tattach loop devices with direct I/O (default true)\n"
	if !HasFlag(with, DirectIOFlag) || !HasFlag(with, "capacity") || HasFlag(with, "pool") {
		t.Fatal("HasFlag misreads the usage")
	}
	v = DefaultVariants(with)
	if len(v) != 2 || !slices.Equal(v[0].Args, []string{"--direct-io=false"}) || !slices.Equal(v[1].Args, []string{"--direct-io=true"}) || v[1].Note != "" {
		t.Errorf("with the flag: %+v", v)
	}
	v, err := AddVariants(v, []string{"discard=--direct-io=true  --discard=mount"})
	if err != nil || len(v) != 3 || !slices.Equal(v[2].Args, []string{"--direct-io=true", "--discard=mount"}) {
		t.Errorf("an extra variant: %+v, %v", v, err)
	}
	for _, bad := range []string{"after=--x", "=--x", "Big=--x", "noequals"} {
		if _, err := AddVariants(DefaultVariants(with), []string{bad}); err == nil {
			t.Errorf("variant %q accepted", bad)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1g": 1 << 30, "1G": 1 << 30, "1GiB": 1 << 30, "512m": 512 << 20, "22m": 22 << 20, "4096": 4096, "2t": 2 << 40, "8k": 8 << 10} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "g", "-1g", "0", "1x", "1.5g", "99999999999t"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("%q accepted as %d", bad, got)
		}
	}
}

func TestParseFilesystems(t *testing.T) {
	if got, err := ParseFilesystems("block, xfs"); err != nil || !slices.Equal(got, []string{"block", "xfs"}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "btrfs", "xfs,xfs", "xfs,"} {
		if _, err := ParseFilesystems(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
