package nodeloss

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/podvol/podvol/internal/names"
)

// The finalizer that holds a deleted podvol Node until its volumes are
// released, and its removal for an uninstall.

// holdIfPodvol adds the finalizer to a live node whose CSINode lists the
// driver, and removes it from one whose CSINode does not (or that has none):
// nodes without podvol are never held. The cache may lag; its answer is
// corrected by the CSINode event that follows.
func (r *Reconciler) holdIfPodvol(ctx context.Context, node *corev1.Node) error {
	runs, err := r.runsDriver(ctx, node.Name)
	if err != nil {
		return err
	}
	has := controllerutil.ContainsFinalizer(node, names.NodeLossFinalizer)
	switch {
	case runs && !has:
		if err := r.Client.Patch(ctx, node, finalizerPatch(true)); err != nil {
			return fmt.Errorf("add finalizer %s to node %s, which runs %s: %w", names.NodeLossFinalizer, node.Name, r.Driver, err)
		}
		log.FromContext(ctx).Info("Holding a node that runs podvol until its volumes are dealt with", "node", node.Name)
		r.announceReturn(ctx, node)
	case !runs && has:
		// Confirm past the cache that the Node is not being deleted: a
		// foreground deletion deletes its CSINode (owned by the Node)
		// too, and that Node is to be dealt with, not let go.
		current := &corev1.Node{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(node), current); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("read node %s: %w", node.Name, err)
		}
		if current.DeletionTimestamp != nil {
			return nil // its update event follows
		}
		if err := r.dropFinalizer(ctx, current); err != nil {
			return err
		}
		log.FromContext(ctx).Info("Node no longer runs podvol: not holding it", "node", node.Name, "driver", r.Driver)
	}
	return nil
}

func (r *Reconciler) runsDriver(ctx context.Context, nodeName string) (bool, error) {
	cn := &storagev1.CSINode{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: nodeName}, cn); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("read CSINode %s: %w", nodeName, err)
	}
	return slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == r.Driver }), nil
}

func (r *Reconciler) dropFinalizer(ctx context.Context, node *corev1.Node) error {
	return removeFinalizer(ctx, r.Client, node)
}

func removeFinalizer(ctx context.Context, c client.Client, node *corev1.Node) error {
	if !controllerutil.ContainsFinalizer(node, names.NodeLossFinalizer) {
		return nil
	}
	if err := c.Patch(ctx, node, finalizerPatch(false)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer %s from node %s: %w", names.NodeLossFinalizer, node.Name, err)
	}
	return nil
}

// finalizerPatch adds or removes our finalizer alone: a strategic merge patch
// of metadata.finalizers (a set) carries no resourceVersion, so it does not
// conflict with the kubelet's frequent Node updates, and touches no other
// finalizer even when our copy of the Node is stale.
func finalizerPatch(add bool) client.Patch {
	key := "$deleteFromPrimitiveList/finalizers"
	if add {
		key = "finalizers"
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{key: []string{names.NodeLossFinalizer}}})
	return client.RawPatch(types.StrategicMergePatchType, b)
}

// ErrStillAdded is returned by RemoveFinalizers when the finalizer came back:
// a podvol-controller still runs node-loss.
var ErrStillAdded = errors.New("the finalizer was added again: podvol-controller still runs node-loss (scale deployment podvol-controller to 0 first)")

// RemoveFinalizers removes the finalizer from every Node, for an uninstall:
// Nodes deleted meanwhile go without their volumes being released. After
// settle it checks that nobody added it again (a podvol-controller left
// running would, at the next event of each podvol Node) and returns
// ErrStillAdded, naming the nodes, if someone did. It returns the number of
// Nodes it removed the finalizer from.
func RemoveFinalizers(ctx context.Context, c client.Client, settle time.Duration) (int, error) {
	logger := log.FromContext(ctx)
	held := func() ([]corev1.Node, error) {
		nodes := &corev1.NodeList{}
		if err := c.List(ctx, nodes); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		return slices.DeleteFunc(nodes.Items, func(n corev1.Node) bool { return !controllerutil.ContainsFinalizer(&n, names.NodeLossFinalizer) }), nil
	}
	nodes, err := held()
	if err != nil {
		return 0, err
	}
	var errs []error
	removed := 0
	for i := range nodes {
		n := &nodes[i]
		if err := removeFinalizer(ctx, c, n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		logger.Info("Removed podvol's finalizer", "node", n.Name, "deleting", n.DeletionTimestamp != nil)
	}
	if len(errs) > 0 {
		return removed, errors.Join(errs...)
	}
	select {
	case <-ctx.Done():
		return removed, ctx.Err()
	case <-time.After(settle):
	}
	again, err := held()
	if err != nil {
		return removed, err
	}
	if len(again) > 0 {
		names := make([]string, 0, len(again))
		for _, n := range again {
			names = append(names, n.Name)
		}
		sort.Strings(names)
		return removed, fmt.Errorf("nodes %v: %w", names, ErrStillAdded)
	}
	return removed, nil
}
