package device_test

import (
	"os"
	"testing"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/device/devicetest"
)

// TestHostConformance runs the checks the fake passes against the real
// machine: what the unit tests above this package learn from the fake holds
// for the kernel.
func TestHostConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the host's conformance needs real loop devices and mounts: run it as root")
	}
	devicetest.Conformance(t, device.Host{})
}
