// Package suite runs csi-sanity against the real podvol-plugin binary, with
// real loop devices and mounts. Ginkgo allows one suite per process, so each
// variant (ext4, xfs, block, a second pool) is its own test package calling
// Run.
package suite

import (
	"flag"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/podvol/podvol/test/plugintest"
)

// Variant selects what the sanity volumes are.
type Variant struct {
	AccessType string            // "mount" or "block"
	Parameters map[string]string // StorageClass parameters, e.g. fsType
	Size       int64
	// Args are more plugin arguments; "{dir}" stands for the test
	// directory.
	Args []string
	// Check, if set, runs after the suite against the plugin that served
	// it.
	Check func(*testing.T, *plugintest.Plugin)
	// Unfit lists specs this machine cannot pass, with the reason; they
	// are skipped by name, and the reason is logged.
	Unfit map[string]string
}

// Run runs the whole csi-sanity suite against a fresh plugin and pool.
func Run(t *testing.T, v Variant) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	p := plugintest.Start(t, plugintest.Options{Dir: dir, Args: v.Args})

	cfg := sanity.NewTestConfig()
	cfg.Address = p.Endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeAccessType = v.AccessType
	cfg.TestVolumeParameters = v.Parameters
	cfg.TestVolumeSize = v.Size
	cfg.IdempotentCount = 3
	if len(v.Unfit) > 0 {
		var names []string
		for spec, why := range v.Unfit {
			t.Logf("skipping csi-sanity spec %q on this machine: %s", spec, why)
			names = append(names, regexp.QuoteMeta(spec))
		}
		if err := flag.Set("ginkgo.skip", strings.Join(names, "|")); err != nil {
			t.Fatal(err)
		}
	}
	sanity.Test(t, cfg)
	if v.Check != nil {
		v.Check(t, p)
	}
	p.Stop()
}
