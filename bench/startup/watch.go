package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// selectedNode is the annotation kube-scheduler's volume binding sets on a
// WaitForFirstConsumer claim once it has picked the pod's node.
const selectedNode = "volume.kubernetes.io/selected-node"

// recorder stamps each expected pod's events with the time the benchmark's
// watches (informers on the namespace's pods and claims, and on PVs) first
// saw them.
type recorder struct {
	ns      string
	mu      sync.Mutex
	samples map[string]*Sample // by pod name
	claims  map[string]string  // claim name → pod name

	pods, pvcs, pvs cache.SharedIndexInformer
}

// claimOf is the name of the claim of the benchmark's pod: a generic
// ephemeral volume's claim is <pod>-<volume>, and the persistent cell names
// its claim the same way.
func claimOf(pod string) string { return pod + "-" + volumeName }

func newRecorder(ctx context.Context, cs kubernetes.Interface, ns string) (*recorder, error) {
	r := &recorder{ns: ns, samples: map[string]*Sample{}, claims: map[string]string{}}
	nsf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	all := informers.NewSharedInformerFactory(cs, 0)
	r.pods = nsf.Core().V1().Pods().Informer()
	r.pvcs = nsf.Core().V1().PersistentVolumeClaims().Informer()
	r.pvs = all.Core().V1().PersistentVolumes().Informer()
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{r.pods, r.onPod}, {r.pvcs, r.onClaim}, {r.pvs, r.onPV}} {
		fn := h.fn
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, o any) { fn(o) },
		}); err != nil {
			return nil, err
		}
	}
	nsf.Start(ctx.Done())
	all.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), r.pods.HasSynced, r.pvcs.HasSynced, r.pvs.HasSynced) {
		return nil, fmt.Errorf("the watches did not sync: %w", ctx.Err())
	}
	return r, nil
}

// expect registers a pod (and its claim) before it or its claim is created.
func (r *recorder) expect(s *Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples[s.Pod] = s
	r.claims[claimOf(s.Pod)] = s.Pod
}

func mark(s *Sample, e Event, t time.Time) {
	if s.At[e].IsZero() {
		s.At[e] = t
	}
}

func (r *recorder) onPod(o any) {
	now := time.Now()
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.samples[p.Name]
	if s == nil {
		return
	}
	mark(s, PodCreated, now)
	if p.Spec.NodeName != "" {
		mark(s, PodScheduled, now)
		s.Node = p.Spec.NodeName
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case corev1.PodScheduled:
			mark(s, PodScheduled, now)
		case corev1.PodReady:
			mark(s, Ready, now)
		}
	}
}

func (r *recorder) onClaim(o any) {
	now := time.Now()
	c, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.samples[r.claims[c.Name]]
	if s == nil {
		return
	}
	mark(s, ClaimCreated, now)
	if c.Annotations[selectedNode] != "" {
		mark(s, NodeSelected, now)
	}
	if c.Spec.VolumeName != "" && c.Status.Phase == corev1.ClaimBound {
		mark(s, ClaimBound, now)
	}
}

func (r *recorder) onPV(o any) {
	now := time.Now()
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != r.ns {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.samples[r.claims[pv.Spec.ClaimRef.Name]]; s != nil {
		mark(s, PVCreated, now)
	}
}

// wait polls until every pod has event e, or ctx ends.
func (r *recorder) wait(ctx context.Context, pods []string, e Event) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		var missing []string
		r.mu.Lock()
		for _, p := range pods {
			if r.samples[p].At[e].IsZero() {
				missing = append(missing, p)
			}
		}
		r.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %q of %s: %w", e, strings.Join(missing, ", "), ctx.Err())
		case <-t.C:
		}
	}
}

// snapshot copies a pod's sample.
func (r *recorder) snapshot(pod string) Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.samples[pod]
}

// left is what of the benchmark is still in the API: pods and claims in its
// namespace, PVs bound to its claims.
func (r *recorder) left() (pods, claims, pvs int) {
	pods, claims = len(r.pods.GetStore().ListKeys()), len(r.pvcs.GetStore().ListKeys())
	for _, o := range r.pvs.GetStore().List() {
		if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == r.ns {
			pvs++
		}
	}
	return pods, claims, pvs
}
