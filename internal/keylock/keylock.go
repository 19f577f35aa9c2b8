// Package keylock is a mutex per key (a volume id, a name, an inline handle).
package keylock

import "sync"

// Locks serialises operations on one volume (or one name) while letting
// operations on different volumes run in parallel. The zero value is ready;
// the plugin makes one and gives it to every part that works on volumes (the
// CSI calls, inline volume collection), so that they exclude each other.
type Locks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

// Lock takes key's lock and returns its release.
func (k *Locks) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
