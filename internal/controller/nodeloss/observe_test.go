package nodeloss

import (
	"testing"
	"time"
)

// The Lease rule, reading by reading, on the test's clock (the envtest suite
// in test/controller runs it against an API server).
func TestObserve(t *testing.T) {
	const (
		grace  = time.Minute
		maxGap = 15 * time.Second
	)
	t0 := time.Unix(1_000_000, 0)
	// renewTime on a clock an hour behind ours: it is only ever compared
	// with earlier readings of itself.
	lease := func(renewed time.Duration) leaseState {
		return leaseState{Present: true, UID: "u1", Renewed: t0.Add(-time.Hour + renewed), Duration: 40 * time.Second}
	}
	missing := leaseState{}
	type reading struct {
		at    time.Duration
		lease leaseState
	}
	// every reads l every 5 s in [from, to).
	every := func(from, to time.Duration, l leaseState) []reading {
		var rs []reading
		for at := from; at < to; at += 5 * time.Second {
			rs = append(rs, reading{at, l})
		}
		return rs
	}
	cat := func(parts ...[]reading) []reading {
		var rs []reading
		for _, p := range parts {
			rs = append(rs, p...)
		}
		return rs
	}
	for _, tc := range []struct {
		name     string
		readings []reading // all but the last are waiting
		last     verdict
	}{
		{"renewed after the deletion: alive", cat(every(0, 10*time.Second, lease(0)), []reading{{10 * time.Second, lease(10 * time.Second)}}), alive},
		{"not renewed for the grace: lost", every(0, 65*time.Second, lease(0)), lost},
		{"missing all along: lost after the grace", every(0, 65*time.Second, missing), lost},
		{"created again: alive", cat(every(0, 20*time.Second, missing), []reading{{20 * time.Second, lease(0)}}), alive},
		{"deleted, then created again: alive", cat(every(0, 10*time.Second, lease(0)), every(10*time.Second, 20*time.Second, missing),
			[]reading{{20 * time.Second, leaseState{Present: true, UID: "u2", Renewed: t0, Duration: 40 * time.Second}}}), alive},
		{"gone missing is no renewal", cat(every(0, 10*time.Second, lease(0)), every(10*time.Second, 65*time.Second, missing)), lost},
		{"same renewTime, new UID: alive", cat(every(0, 10*time.Second, lease(0)),
			[]reading{{10 * time.Second, leaseState{Present: true, UID: "u2", Renewed: lease(0).Renewed, Duration: 40 * time.Second}}}), alive},
		// No reading from 10 s to 50 s (API down: the kubelet could not
		// renew either): a full lease duration of readings is owed again,
		// from 50 s to 90 s, past the grace.
		{"blind spot", cat(every(0, 15*time.Second, lease(0)), every(50*time.Second, 95*time.Second, lease(0))), lost},
		{"a kubelet back after a blind spot: alive", cat(every(0, 15*time.Second, lease(0)), every(50*time.Second, 70*time.Second, lease(0)),
			[]reading{{70 * time.Second, lease(65 * time.Second)}}), alive},
		{"the duration a Lease said holds once it is gone", cat(every(0, 15*time.Second, leaseState{Present: true, UID: "u1", Duration: 20 * time.Second}),
			every(50*time.Second, 75*time.Second, missing)), lost},
		{"a lease duration shorter than the grace counts after a blind spot",
			cat(every(0, 15*time.Second, leaseState{Present: true, UID: "u1", Duration: 20 * time.Second}),
				every(50*time.Second, 75*time.Second, leaseState{Present: true, UID: "u1", Duration: 20 * time.Second})), lost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &leaseWatch{}
			for i, r := range tc.readings {
				want := waiting
				if i == len(tc.readings)-1 {
					want = tc.last
				}
				if got := w.observe(t0.Add(r.at), r.lease, grace, maxGap); got != want {
					t.Fatalf("reading %d at %s (%s): verdict %d, want %d", i, r.at, r.lease, got, want)
				}
			}
		})
	}
}

// A grace shorter than the Lease's duration (issue 25, item 5): the kubelet
// renews every quarter of its Lease's duration (10 s of 40 s), so a grace of
// 5 s would judge a live node lost before its next renewal could be seen.
// The judgement waits for max(grace, the Lease's duration): a live kubelet's
// renewal at 10 s is seen, and a dead one is judged at 40 s, not 5 s.
func TestObserveGraceShorterThanLease(t *testing.T) {
	const (
		grace  = 5 * time.Second
		maxGap = 3 * time.Second
	)
	t0 := time.Unix(1_000_000, 0)
	lease := func(renewed time.Duration, d time.Duration) leaseState {
		return leaseState{Present: true, UID: "u1", Renewed: t0.Add(renewed), Duration: d}
	}
	t.Run("a live kubelet's renewal at 10 s is seen", func(t *testing.T) {
		w := &leaseWatch{}
		for at := time.Duration(0); at < 10*time.Second; at += time.Second {
			if v := w.observe(t0.Add(at), lease(0, 40*time.Second), grace, maxGap); v != waiting {
				t.Fatalf("at %s, before the kubelet's first renewal (every 10 s of a 40 s Lease), with a %s grace: verdict %d, want waiting (%d)", at, grace, v, waiting)
			}
		}
		if v := w.observe(t0.Add(10*time.Second), lease(10*time.Second, 40*time.Second), grace, maxGap); v != alive {
			t.Fatalf("renewed at 10 s: verdict %d, want alive", v)
		}
	})
	for _, tc := range []struct {
		name    string
		lease   leaseState
		assumed time.Duration // Reconciler.LeaseDuration
		wait    time.Duration
	}{
		{"a dead kubelet is judged after the Lease's duration", lease(0, 40*time.Second), 0, 40 * time.Second},
		{"a Lease of 80 s counts 80 s", lease(0, 80*time.Second), 0, 80 * time.Second},
		{"a missing Lease counts the kubelet's default duration", leaseState{}, 0, 40 * time.Second},
		{"a missing Lease counts the duration set for the kubelets", leaseState{}, 20 * time.Second, 20 * time.Second},
		{"a present Lease says its own duration", lease(0, 40*time.Second), 20 * time.Second, 40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &leaseWatch{assumed: tc.assumed}
			for at := time.Duration(0); ; at += time.Second {
				v := w.observe(t0.Add(at), tc.lease, grace, maxGap)
				if at < tc.wait && v != waiting {
					t.Fatalf("at %s (Lease %s of %s, grace %s): verdict %d, want waiting until %s", at, tc.lease, tc.lease.Duration, grace, v, tc.wait)
				}
				if at >= tc.wait {
					if v != lost {
						t.Fatalf("at %s: verdict %d, want lost", at, v)
					}
					return
				}
			}
		})
	}
}
