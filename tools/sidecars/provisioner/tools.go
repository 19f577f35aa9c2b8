//go:build tools

// Package tools pins the CSI sidecar built from this module.
package tools

import (
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
