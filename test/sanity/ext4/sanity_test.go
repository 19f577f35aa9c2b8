package ext4_test

import (
	"testing"

	"github.com/podvol/podvol/internal/device"
	suite "github.com/podvol/podvol/test/sanity"
)

func TestSanity(t *testing.T) {
	v := suite.Variant{AccessType: "mount", Parameters: map[string]string{"fsType": "ext4"}, Size: 1 << 30}
	if !device.HasCapability(device.CapSysResource) {
		// The kernel refuses online growth of a mounted ext4 without
		// CAP_SYS_RESOURCE; test/plugin checks that the refusal says so
		// and that the growth then happens at the next stage.
		v.Unfit = map[string]string{"should work if node-expand is called after node-publish": "online growth of a mounted ext4 needs CAP_SYS_RESOURCE, which this host withholds even from root"}
	}
	suite.Run(t, v)
}
