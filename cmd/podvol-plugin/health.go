package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/metrics"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// healthPage is how many volumes the health gauge reads from the store at a
// time: a page's cost follows its size, not the store's.
const healthPage = 256

// volumeConditions returns what the health gauge reads at each scrape: the
// conditions NodeGetVolumeHealth would report for every ready volume, without
// asking a microVM's runtime (that call can be slow; the CSI call still makes
// it). The checks take no volume lock: a volume being staged at that moment
// may show a condition for one scrape, which the alerts' "for" outlasts.
func volumeConditions(p *pool.Pool, n *node.Node) func(context.Context) ([]metrics.VolumeCondition, error) {
	ready := func(v *store.Volume) bool { return v.State == store.Ready }
	return func(ctx context.Context) ([]metrics.VolumeCondition, error) {
		var out []metrics.VolumeCondition
		checked := 0
		for start := ""; ; {
			vols, next, err := p.Store().VolumePage(start, healthPage, ready)
			if err != nil {
				return nil, fmt.Errorf("list the pool's volumes for their health: %w", err)
			}
			for _, v := range vols {
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("health checks stopped after %d volumes: %w", checked, err)
				}
				checked++
				cs, err := n.Health(ctx, v.ID, false)
				if errors.Is(err, errkind.ErrNotFound) {
					continue // deleted meanwhile
				}
				if err != nil {
					return nil, fmt.Errorf("health of volume %s: %w", v.ID, err)
				}
				for _, c := range cs {
					out = append(out, metrics.VolumeCondition{Volume: v.ID, Reason: c.Reason, Severity: c.Severity.String()})
				}
			}
			if next == "" {
				return out, nil
			}
			start = next
		}
	}
}
