//go:build tools

// Package tools pins golangci-lint, the linter make check runs, built from Go
// modules by build.sh (configuration: .golangci.yml at the repository root).
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
