package devcluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// ReplaceNode stands in for losing the node and getting a new one: the
// kubelet and every container die as in a crash, the kubelet comes back under
// a new node name (a loopback address, so the API server still reaches it),
// and the old Node object is deleted, as a cluster admin or a cloud
// controller does for a node that is gone. The pool's disk stays, as it
// would not on a real replacement: what the old node held is simply never
// used again.
func (c *Cluster) ReplaceNode(ctx context.Context, newName string) error {
	old := c.NodeName
	pid, ok := c.running("kubelet")
	if !ok {
		return fmt.Errorf("the kubelet is not running")
	}
	c.p.note("node %s: kubelet (pid %d) and all containers killed", old, pid)
	if err := c.stopProcess("kubelet", 0); err != nil {
		return err
	}
	c.removeContainers(ctx)
	c.NodeName = newName
	if err := os.WriteFile(c.path("node-name"), []byte(newName), 0o600); err != nil {
		return err
	}
	if err := c.startKubelet(ctx); err != nil {
		return err
	}
	c.p.note("node %s Ready; deleting Node %s", newName, old)
	if _, err := c.kubectl(ctx, "delete", "node", old, "--wait=false"); err != nil {
		return err
	}
	return waitFor("podvol on node "+newName+" and node "+old+" gone", 8*time.Minute, func() error {
		out, err := c.kubectl(ctx, "get", "csinode", newName, "-o", "jsonpath={.spec.drivers[*].name}")
		if err != nil || !strings.Contains(out, "podvol.io") {
			return fmt.Errorf("CSINode %s lists %q: %w", newName, out, errNotYet)
		}
		if out, err := c.kubectl(ctx, "get", "node", old, "-o", "name", "--ignore-not-found"); err != nil || strings.TrimSpace(out) != "" {
			return fmt.Errorf("node %s still exists: %w", old, errNotYet)
		}
		return nil
	})
}
