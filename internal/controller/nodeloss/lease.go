package nodeloss

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Reading a deleted Node's Lease until it is seen renewed (alive) or not
// renewed for the grace (lost).

// leaseState is what one reading of a node's Lease showed.
type leaseState struct {
	Present  bool
	UID      types.UID
	Renewed  time.Time // spec.renewTime, on the kubelet's clock
	Duration time.Duration
}

func (l leaseState) String() string {
	if !l.Present {
		return "missing"
	}
	return fmt.Sprintf("renewed %s (uid %s)", l.Renewed.UTC().Format(time.RFC3339Nano), l.UID)
}

func (r *Reconciler) readLease(ctx context.Context, nodeName string) (leaseState, error) {
	l := &coordinationv1.Lease{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: nodeName}, l); err != nil {
		if apierrors.IsNotFound(err) {
			return leaseState{}, nil
		}
		return leaseState{}, fmt.Errorf("read Lease %s/%s: %w", corev1.NamespaceNodeLease, nodeName, err)
	}
	s := leaseState{Present: true, UID: l.UID, Duration: DefaultLeaseDuration}
	if l.Spec.RenewTime != nil {
		s.Renewed = l.Spec.RenewTime.Time
	}
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		s.Duration = time.Duration(*d) * time.Second
	}
	return s, nil
}

// leaseWatch follows the Lease of one deleted Node. It lives in memory: a
// restarted controller (or a new leader) starts watching again, which only
// delays a release, never hastens one.
type leaseWatch struct {
	node     types.UID
	last     leaseState
	assumed  time.Duration // the duration of a Lease missing at the first reading (DefaultLeaseDuration if zero)
	duration time.Duration // the Lease's duration, while it was there
	since    time.Time     // first reading: when the deletion was first seen
	clear    time.Time     // start of the current run of readings without a blind spot
	lastRead time.Time
	// toldMigrations: the Node's event that it is held for migrations.
	toldMigrations bool
}

type verdict int

const (
	waiting verdict = iota
	alive
	lost
)

// observe takes one reading of the Lease at now (a monotonic clock reading).
//
// Alive: the Lease now present differs from the last reading (renewed, or
// created again): only the kubelet writes it, and it did so after the
// deletion was seen. A Lease gone missing is not a renewal (the garbage
// collector deletes it in a foreground deletion).
//
// Lost: no renewal for max(grace, lease duration) since the first reading,
// and the last lease duration of it seen without a blind spot. A grace
// shorter than the Lease's duration does not shorten the wait: the kubelet
// renews every quarter of that duration (10 s of 40 s), so a shorter wait
// could judge a live node before its next renewal was due, and a full
// duration holds four renewals a live kubelet would have made. A blind spot
// is a gap between readings longer than maxGap (an API outage, a stalled
// controller): the kubelet may have been unable to renew through it as well,
// so after one it gets a full lease duration again.
func (w *leaseWatch) observe(now time.Time, cur leaseState, grace, maxGap time.Duration) verdict {
	if w.lastRead.IsZero() {
		w.last, w.since, w.clear, w.lastRead = cur, now, now, now
		w.duration = w.assumed
		if w.duration <= 0 {
			w.duration = DefaultLeaseDuration
		}
		if cur.Present {
			w.duration = cur.Duration
		}
		return waiting
	}
	if now.Sub(w.lastRead) > maxGap {
		w.clear = now
	}
	w.lastRead = now
	if cur.Present && (!w.last.Present || cur.UID != w.last.UID || !cur.Renewed.Equal(w.last.Renewed)) {
		return alive
	}
	w.last = cur // unchanged, or gone missing
	if now.Sub(w.since) >= w.wait(grace) && now.Sub(w.clear) >= w.duration {
		return lost
	}
	return waiting
}

// wait is how long the Lease must go unrenewed: the grace, or the Lease's
// duration if longer (see observe).
func (w *leaseWatch) wait(grace time.Duration) time.Duration {
	return max(grace, w.duration)
}

func (r *Reconciler) watch(node *corev1.Node) (*leaseWatch, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching == nil {
		r.watching = map[string]*leaseWatch{}
	}
	w := r.watching[node.Name]
	if w == nil || w.node != node.UID {
		w = &leaseWatch{node: node.UID, assumed: r.LeaseDuration}
		r.watching[node.Name] = w
		return w, true
	}
	return w, false
}

func (r *Reconciler) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.watching, name)
}
