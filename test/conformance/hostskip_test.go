package main

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device"
)

const onlineGrowth = specPrefix + "[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand should resize volume when PVC is edited while pod is using it"

const unusedVolumes = specPrefix + "[Testpattern: Dynamic PV (filesystem volmode)] volumeMode should not mount / map unused volumes in a pod [LinuxOnly]"

// skipArg is the run's --ginkgo.skip, as the runner passes it with these
// machine skips.
func skipArg(t *testing.T, skips map[string]map[string]string, d driver) string {
	t.Helper()
	saved := machineSkips
	t.Cleanup(func() { machineSkips = saved })
	machineSkips = skips
	for _, a := range suiteArgs(d, d.def+".yaml", "repo-list.yaml", false) {
		if v, ok := strings.CutPrefix(a, "--ginkgo.skip="); ok {
			return v
		}
	}
	t.Fatal("no --ginkgo.skip")
	return ""
}

func TestHostSkips(t *testing.T) {
	ext4 := driver{name: "ext4-rest", def: "ext4", skip: `\(block volmode\)|Snapshot`}
	xfs := driver{name: "xfs-rest", def: "xfs", skip: `\(block volmode\)|Snapshot`}
	noCap := errors.New("CAP_SYS_RESOURCE is not in this process's effective set")
	noNS := errors.New("open /proc/1/ns/mnt: permission denied")

	t.Run("a host with CAP_SYS_RESOURCE and PID 1's mount namespace runs every spec", func(t *testing.T) {
		skips := skipsFor(map[limit]error{capSysResource: nil, hostMountNS: nil})
		if n := len(skips["ext4"]) + len(skips["xfs"]) + len(skips["block"]); n != 0 {
			t.Errorf("%d specs skipped on a host without limits", n)
		}
		if s := skipArg(t, skips, ext4); strings.Contains(s, "volume-expand") || strings.Contains(s, "unused volumes") {
			t.Errorf("ext4's --ginkgo.skip still names a host-limited spec: %s", s)
		}
	})
	t.Run("a host without CAP_SYS_RESOURCE skips ext4's online growth only, saying why", func(t *testing.T) {
		skips := skipsFor(map[limit]error{capSysResource: noCap, hostMountNS: nil})
		if len(skips["ext4"]) != 5 || len(skips["xfs"]) != 0 || len(skips["block"]) != 0 {
			t.Errorf("skips: %v, want ext4's 5 growth specs only", skips)
		}
		if why := skips["ext4"][onlineGrowth]; !strings.Contains(why, noCap.Error()) {
			t.Errorf("reason %q does not say what the probe found (%q)", why, noCap)
		}
		if s := skipArg(t, skips, ext4); !strings.Contains(s, "volume-expand should resize volume when PVC is edited while pod is using it") {
			t.Errorf("ext4's --ginkgo.skip does not name the online growth spec: %s", s)
		}
		if s := skipArg(t, skips, xfs); strings.Contains(s, "volume-expand") {
			t.Errorf("xfs's --ginkgo.skip names a growth spec: %s", s)
		}
	})
	t.Run("a host that refuses PID 1's mount namespace skips the specs that enter it", func(t *testing.T) {
		skips := skipsFor(map[limit]error{capSysResource: nil, hostMountNS: noNS})
		for _, def := range []string{"ext4", "xfs", "block"} {
			if len(skips[def]) != 1 {
				t.Errorf("%s: skips %v, want the one spec that enters /proc/1/ns/mnt", def, skips[def])
			}
		}
		if why := skips["xfs"][unusedVolumes]; !strings.Contains(why, noNS.Error()) {
			t.Errorf("reason %q does not say what the probe found", why)
		}
	})
	t.Run("a limit the probe could not decide counts as missing", func(t *testing.T) {
		skips := skipsFor(map[limit]error{})
		if len(skips["ext4"]) != 6 {
			t.Errorf("ext4 skips %d specs with no probe results, want all 6", len(skips["ext4"]))
		}
	})
}

// The probes on this host agree with what the host is: the same capability
// test as the csi-sanity ext4 run's, and /proc/1/ns/mnt as the suite's
// hostexec pod opens it (nsenter --mount).
func TestProbeHost(t *testing.T) {
	got := probeHost()
	if has := device.HasCapability(device.CapSysResource); has != (got[capSysResource] == nil) {
		t.Errorf("CAP_SYS_RESOURCE: HasCapability %v, probe %v", has, got[capSysResource])
	}
	if _, err := os.Open("/proc/1/ns/mnt"); err != nil && got[hostMountNS] == nil {
		t.Errorf("/proc/1/ns/mnt cannot be opened here (%v), yet the probe finds it usable", err)
	}
	t.Logf("this host: CAP_SYS_RESOURCE %v; /proc/1/ns/mnt %v", errOr(got[capSysResource]), errOr(got[hostMountNS]))
}

func errOr(err error) string {
	if err == nil {
		return "usable"
	}
	return "missing: " + err.Error()
}
