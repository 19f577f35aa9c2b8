package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
)

// chaos replaces podvol's pieces while the suite runs: every 20-60 s
// (seeded, each action logged with the seed) it deletes a node plugin's pod
// or the controller's, SIGKILLs one sidecar container's processes, or
// SIGKILLs a plugin process inside its container. Retrying is the sidecars'
// job, converging podvol's: every spec that passes without chaos must pass
// with it.
type chaos struct {
	cluster *devcluster.Cluster
	rng     *rand.Rand
	log     io.Writer
	seed    uint64
	actions int
}

const podvolNS = "podvol-system"

// newChaos logs to reports/chaos.log, kept with the runs' JUnit reports.
func newChaos(cluster *devcluster.Cluster, seed uint64, reports string) (*chaos, error) {
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	if err := os.MkdirAll(reports, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(reports, "chaos.log"))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "== chaos: seed %d, log %s\n", seed, f.Name())
	return &chaos{cluster: cluster, rng: rand.New(rand.NewPCG(seed, seed>>1|1)), log: io.MultiWriter(f, os.Stderr), seed: seed}, nil //nolint:gosec // replayable from its seed, not a secret
}

func (c *chaos) logf(format string, a ...any) {
	fmt.Fprintf(c.log, "%s %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, a...))
}

// run acts until ctx ends.
func (c *chaos) run(ctx context.Context) {
	c.logf("chaos seed %d (replay: -chaos-seed=%d)", c.seed, c.seed)
	for {
		wait := 20*time.Second + time.Duration(c.rng.Int64N(int64(40*time.Second)))
		select {
		case <-ctx.Done():
			c.logf("chaos done: %d actions", c.actions)
			return
		case <-time.After(wait):
		}
		if err := c.act(ctx); err != nil && ctx.Err() == nil {
			c.logf("  could not: %v", err)
		}
	}
}

// act does one random thing to podvol.
func (c *chaos) act(ctx context.Context) error {
	out, err := c.cluster.Get(ctx, podvolNS, "pods",
		`{range .items[*]}{.metadata.name}{range .status.containerStatuses[*]}{" "}{.name}={.containerID}{end}{"\n"}{end}`)
	if err != nil {
		return err
	}
	type container struct{ pod, name, id string }
	var nodePods, controllerPods []string
	var sidecars, plugins []container
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pod := f[0]
		if strings.HasPrefix(pod, "podvol-node-") {
			nodePods = append(nodePods, pod)
		} else if strings.HasPrefix(pod, "podvol-controller-") {
			controllerPods = append(controllerPods, pod)
		}
		for _, cs := range f[1:] {
			name, id, _ := strings.Cut(cs, "=")
			id = strings.TrimPrefix(id, "containerd://")
			if id == "" {
				continue
			}
			switch {
			case name == "plugin":
				plugins = append(plugins, container{pod, name, id})
			case strings.HasPrefix(name, "csi-") || name == "snapshot-controller":
				sidecars = append(sidecars, container{pod, name, id})
			}
		}
	}
	pick := func(n int) int { return c.rng.IntN(n) }
	c.actions++
	switch r := c.rng.IntN(100); {
	case r < 35 && len(nodePods) > 0:
		p := nodePods[pick(len(nodePods))]
		c.logf("delete pod %s", p)
		_, err := c.cluster.RunKubectl(ctx, "-n", podvolNS, "delete", "pod", p, "--wait=false")
		return err
	case r < 55 && len(controllerPods) > 0:
		p := controllerPods[pick(len(controllerPods))]
		c.logf("delete pod %s", p)
		_, err := c.cluster.RunKubectl(ctx, "-n", podvolNS, "delete", "pod", p, "--wait=false")
		return err
	case r < 85 && len(sidecars) > 0:
		s := sidecars[pick(len(sidecars))]
		pids := devcluster.KillContainer(s.id)
		c.logf("SIGKILL container %s of pod %s: pids %v", s.name, s.pod, pids)
	case len(plugins) > 0:
		s := plugins[pick(len(plugins))]
		pids := devcluster.KillContainer(s.id)
		c.logf("SIGKILL the plugin in pod %s: pids %v", s.pod, pids)
	}
	return nil
}

// checkLeftovers waits until, on every node, no loop device serves an image
// of its pool and no mount of one is left, and every volume image belongs
// to a PV: the suite has deleted its pods and claims, so anything else is
// leaked. (Snapshot images may stay: a Retain spec's snapshot is the admin's
// to delete.)
func checkLeftovers(ctx context.Context, cluster *devcluster.Cluster, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var problems []string
		handles, err := cluster.Get(ctx, "", "pv", `{range .items[?(@.spec.csi.driver=="podvol.io")]}{.spec.csi.volumeHandle}{"\n"}{end}`)
		if err != nil {
			return err
		}
		pvs := map[string]bool{}
		for _, h := range strings.Fields(handles) {
			pvs["volumes/"+h+".img"] = true
		}
		for _, n := range cluster.Nodes {
			s, err := n.PoolState(ctx)
			if err != nil {
				return err
			}
			for _, l := range s.Loops {
				problems = append(problems, fmt.Sprintf("%s: loop device %s", n.Name, l))
			}
			for _, m := range s.Mounts {
				problems = append(problems, fmt.Sprintf("%s: mount %s", n.Name, m))
			}
			for _, img := range s.Images {
				if strings.HasPrefix(img, "volumes/") && !pvs[img] {
					problems = append(problems, fmt.Sprintf("%s: image %s of no PV", n.Name, img))
				}
			}
		}
		if len(problems) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after the suite, %d leftovers:\n  %s", len(problems), strings.Join(problems, "\n  "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}
