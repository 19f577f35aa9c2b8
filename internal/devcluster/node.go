package devcluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// Replace stands in for losing the node and getting a new one: the kubelet
// and every container die as in a crash, the kubelet comes back under a new
// node name, and the old Node object is deleted, as a cluster admin or a
// cloud controller does for a node that is gone. The pool's disk stays, as
// it would not on a real replacement: what the old node held is simply never
// used again.
func (n *Node) Replace(ctx context.Context, newName string) error {
	c, old := n.c, n.Name
	pid, ok := c.running(n.proc("kubelet"))
	if !ok {
		return fmt.Errorf("node %s: the kubelet is not running", old)
	}
	c.p.note("node %s: kubelet (pid %d) and all containers killed", old, pid)
	if err := c.stopProcess(n.proc("kubelet"), 0); err != nil {
		return err
	}
	n.removeContainers(ctx)
	n.Name = newName
	if err := os.WriteFile(n.dir("name"), []byte(newName), 0o644); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.waitReady(ctx); err != nil {
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

// Lose stands in for a node that is lost for good as far as the cluster can
// tell: its kubelet, containers and containerd stop as on a power cut (its
// disk stays), and the Node object is deleted, as an admin or a cloud
// controller does for a node that is gone.
func (n *Node) Lose(ctx context.Context) error {
	if err := n.stop(ctx); err != nil {
		return err
	}
	n.c.p.note("node %s: kubelet, containers and containerd stopped; deleting the Node", n.Name)
	_, err := n.c.kubectl(ctx, "delete", "node", n.Name, "--wait=false")
	return err
}

// Restart brings a stopped node back under its name, as a machine that
// reboots: containerd, then the kubelet, which registers the Node again.
func (n *Node) Restart(ctx context.Context) error {
	// A kubelet that registered while its deleted Node waits on a
	// finalizer (node-loss holds it for the grace period) would find its
	// Node gone afterwards and not register again.
	if err := waitFor("the deleted Node "+n.Name+" gone before its kubelet starts again", 10*time.Minute, func() error {
		out, err := n.c.kubectl(ctx, "get", "node", n.Name, "--ignore-not-found", "-o", "jsonpath={.metadata.deletionTimestamp}")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "" {
			return errNotYet
		}
		return nil
	}); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.waitReady(ctx); err != nil {
		return err
	}
	return waitFor("podvol on node "+n.Name, 5*time.Minute, func() error {
		out, err := n.c.kubectl(ctx, "get", "csinode", n.Name, "-o", "jsonpath={.spec.drivers[*].name}")
		if err != nil || !strings.Contains(out, "podvol.io") {
			return fmt.Errorf("CSINode %s lists %q: %w", n.Name, out, errNotYet)
		}
		return nil
	})
}
