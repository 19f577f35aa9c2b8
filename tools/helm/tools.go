//go:build tools

// Package tools pins Helm, which renders charts/podvol into deploy/base
// (make generate), lints it (make check) and installs it on the dev cluster,
// built from Go modules by build.sh.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
