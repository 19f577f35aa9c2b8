package pool_test

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/test/plugintest"
	sanity "github.com/podvol/podvol/test/sanity"
)

// The whole suite against a second pool, named by the class's parameter:
// every volume, snapshot and restore of the suite lands in it.
func TestSanity(t *testing.T) {
	params := map[string]string{"fsType": "xfs", "pool": "fast"}
	sanity.Run(t, sanity.Variant{AccessType: "mount", Parameters: params, Size: 1 << 30,
		Args: []string{"--pool=fast={dir}/fast-pool,capacity=20Gi"},
		// The suite's volumes were the fast pool's if the parameters
		// put a volume there.
		Check: func(t *testing.T, p *plugintest.Plugin) {
			ctx := context.Background()
			r, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "check-pool", Parameters: params,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
				VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
					AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
			if err != nil {
				t.Fatal(err)
			}
			if id := r.GetVolume().GetVolumeId(); !strings.HasPrefix(id, "pv-fast-") {
				t.Errorf("a volume of the suite's parameters has id %s, not one of pool fast", id)
			}
			if _, err := p.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		}})
}
