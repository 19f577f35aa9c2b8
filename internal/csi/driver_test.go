package csi

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/pool"
)

func TestKeyedMutexSerialisesOneKey(t *testing.T) {
	var k keyedMutex
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				unlock := k.lock("pv-1")
				n := holders.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Microsecond)
				holders.Add(-1)
				unlock()
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m != 1 {
		t.Fatalf("%d holders of one key at once", m)
	}
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d lock entries left after every unlock", n)
	}
}

func TestKeyedMutexOtherKeysRunInParallel(t *testing.T) {
	var k keyedMutex
	unlockA := k.lock("pv-a")
	done := make(chan struct{})
	go func() {
		k.lock("pv-b")()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a lock on another key waited for pv-a")
	}
	// A waiter on the held key does wait, and gets it once released.
	got := make(chan struct{})
	go func() {
		k.lock("pv-a")()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second holder of pv-a got in")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter on pv-a never got the lock")
	}
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d lock entries left: %v", n, k.locks)
	}
}

// Many keys come and go (every volume ever named): none stays in the map.
func TestKeyedMutexDoesNotLeak(t *testing.T) {
	var k keyedMutex
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("pv-", i%37)
			k.lock(key)()
		}()
	}
	wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d lock entries left", n)
	}
}

func TestToStatus(t *testing.T) {
	wrap := func(kind error) error { return fmt.Errorf("volume pv-1: %w", kind) }
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{wrap(pool.ErrNotFound), codes.NotFound},
		{wrap(pool.ErrConflict), codes.AlreadyExists},
		{wrap(pool.ErrNoSpace), codes.ResourceExhausted},
		{wrap(pool.ErrInUse), codes.FailedPrecondition},
		{wrap(pool.ErrUnusable), codes.FailedPrecondition},
		{wrap(pool.ErrOutOfRange), codes.OutOfRange},
		{wrap(pool.ErrInvalid), codes.InvalidArgument},
		{errors.New("mount: boom"), codes.Internal},
		{wrap(pool.ErrUnaccounted), codes.Internal},
		// Doubly wrapped, and joined with a cause that is not a kind.
		{fmt.Errorf("publish: %w", wrap(pool.ErrInUse)), codes.FailedPrecondition},
		{fmt.Errorf("grow: %w: %w", errors.New("resize2fs: EPERM"), pool.ErrInUse), codes.FailedPrecondition},
		// A status made above is passed through untouched.
		{status.Error(codes.Unavailable, "API unreachable"), codes.Unavailable},
	} {
		got := toStatus(c.err)
		st, ok := status.FromError(got)
		if !ok || st.Code() != c.code {
			t.Errorf("toStatus(%q) = %v, want %s", c.err, got, c.code)
			continue
		}
		if st.Message() != c.err.Error() && status.Code(c.err) == codes.Unknown {
			t.Errorf("toStatus(%q) lost the message: %q", c.err, st.Message())
		}
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) is not nil")
	}
}
