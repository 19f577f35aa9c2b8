package keylock

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSerialisesOneKey(t *testing.T) {
	var k Locks
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				unlock := k.Lock("pv-1")
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

func TestOtherKeysRunInParallel(t *testing.T) {
	var k Locks
	unlockA := k.Lock("pv-a")
	done := make(chan struct{})
	go func() {
		k.Lock("pv-b")()
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
		k.Lock("pv-a")()
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
func TestDoesNotLeak(t *testing.T) {
	var k Locks
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("pv-", i%37)
			k.Lock(key)()
		}()
	}
	wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d lock entries left", n)
	}
}
