package xfs_test

import (
	"testing"

	suite "github.com/podvol/podvol/test/sanity"
)

func TestSanity(t *testing.T) {
	suite.Run(t, suite.Variant{AccessType: "mount", Parameters: map[string]string{"fsType": "xfs"}, Size: 1 << 30})
}
