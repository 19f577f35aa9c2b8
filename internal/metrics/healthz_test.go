package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func get(h http.Handler) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// /healthz, which anyone may ask, reads the last check's result: a
// thousand requests run the pools' check (every volume record read) no
// more often than its period says, and report what it found.
func TestHealthzDoesNotCheckPerRequest(t *testing.T) {
	var checks atomic.Int64
	var fail atomic.Pointer[error]
	h := &Health{Every: time.Hour, Check: func() error {
		checks.Add(1)
		if err := fail.Load(); err != nil {
			return *err
		}
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if code, _ := get(h); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no healthy answer 5 s after the checks started")
		}
	}
	for range 1000 {
		if code, body := get(h); code != http.StatusOK || body != "ok" {
			t.Fatalf("healthz: %d %q", code, body)
		}
	}
	if n := checks.Load(); n != 1 {
		t.Fatalf("1000 requests to /healthz ran the pools' check %d times, want once (the period's)", n)
	}
	// What the next check finds is what /healthz says.
	err := errors.New("pool /var/lib/podvol/volumes is not writable")
	fail.Store(&err)
	h.Refresh()
	if code, body := get(h); code != http.StatusServiceUnavailable || !strings.Contains(body, "not writable") {
		t.Fatalf("healthz after a failed check: %d %q", code, body)
	}
}

// A check that does not end (a pool's filesystem hung) is a failure once
// three periods have passed, as a request that ran it would have hung.
func TestHealthzReportsAHungCheck(t *testing.T) {
	release := make(chan struct{})
	calls := make(chan struct{}, 10)
	h := &Health{Every: 20 * time.Millisecond, Check: func() error {
		calls <- struct{}{}
		if len(calls) > 1 {
			<-release
		}
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); close(release); <-done }()
	if code, body := get(h); code != http.StatusServiceUnavailable && code != http.StatusOK {
		t.Fatalf("healthz at start: %d %q", code, body)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		code, body := get(h)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "has not finished for") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthz with its check hung: %d %q", code, body)
		}
	}
}
