// Command generate writes deploy/base from charts/podvol (make generate).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/podvol/podvol/internal/chart"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run() error {
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	ctx := context.Background()
	helm, err := chart.Helm(ctx, repo, os.Stderr)
	if err != nil {
		return err
	}
	files, err := chart.Base(ctx, helm, repo)
	if err != nil {
		return err
	}
	if err := chart.Write(repo, files); err != nil {
		return err
	}
	fmt.Printf("wrote %s: %d files from %s\n", chart.BaseDir, len(files), chart.Dir)
	return nil
}
