package block_test

import (
	"testing"

	suite "github.com/podvol/podvol/test/sanity"
)

func TestSanity(t *testing.T) {
	suite.Run(t, suite.Variant{AccessType: "block", Size: 1 << 30})
}
