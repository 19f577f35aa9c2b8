package store

import (
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// table keeps records of one kind as JSON in a bucket keyed by id, with a
// second bucket indexing them by CSI name. Every write goes through the
// store's ledger with what the record adds to it (usage).
type table[T any] struct {
	db             *bolt.DB
	ledger         *ledger
	kind           string
	records, names []byte
	id, name       func(*T) string
	usage          func(*T) Usage
	// deleted, if set, is told of each deletion in its transaction.
	deleted func(tx *bolt.Tx, id string) error
}

func (t table[T]) read(tx *bolt.Tx, id string) (*T, error) {
	b := tx.Bucket(t.records).Get([]byte(id))
	if b == nil {
		return nil, ErrNotFound
	}
	return t.decode(id, b)
}

func (t table[T]) decode(id string, b []byte) (*T, error) {
	r := new(T)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", t.kind, id, err)
	}
	return r, nil
}

func (t table[T]) write(tx *bolt.Tx, r *T) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(t.records).Put([]byte(t.id(r)), b)
}

func (t table[T]) get(id string) (r *T, err error) {
	err = t.db.View(func(tx *bolt.Tx) error {
		r, err = t.read(tx, id)
		return err
	})
	return r, err
}

func (t table[T]) byName(name string) (r *T, err error) {
	err = t.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(t.names).Get([]byte(name))
		if id == nil {
			return ErrNotFound
		}
		r, err = t.read(tx, string(id))
		return err
	})
	return r, err
}

// list returns every record in id order (bbolt iterates keys in order).
func (t table[T]) list() ([]*T, error) {
	var out []*T
	err := t.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(t.records).ForEach(func(k, b []byte) error {
			r, err := t.decode(string(k), b)
			if err == nil {
				out = append(out, r)
			}
			return err
		})
	})
	return out, err
}

// page returns, in id order from the id start on, at most limit records
// (0: no limit) that keep accepts, and the id to start the next page at ("":
// there is none). It seeks to start instead of reading from the first id, so
// a page costs what its records cost (and those keep refuses on the way),
// whatever the size of the table. An id makes a cursor that stays valid
// whatever is added or removed meanwhile: every record that exists through a
// whole listing is on exactly one of its pages.
func (t table[T]) page(start string, limit int, keep func(*T) bool) (out []*T, next string, err error) {
	err = t.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(t.records).Cursor()
		for k, b := c.Seek([]byte(start)); k != nil; k, b = c.Next() {
			r, err := t.decode(string(k), b)
			if err != nil {
				return err
			}
			if !keep(r) {
				continue
			}
			if limit > 0 && len(out) == limit {
				next = string(k)
				return nil
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

func (t table[T]) create(r *T) error {
	return t.ledger.write(t.db, func(tx *bolt.Tx, change *Usage) error {
		u, err := t.insert(tx, r)
		*change = u
		return err
	})
}

// insert adds a new record in tx and returns what it adds to the ledger.
func (t table[T]) insert(tx *bolt.Tx, r *T) (Usage, error) {
	if tx.Bucket(t.names).Get([]byte(t.name(r))) != nil {
		return Usage{}, fmt.Errorf("%s name %q: %w", t.kind, t.name(r), errExists)
	}
	if err := tx.Bucket(t.names).Put([]byte(t.name(r)), []byte(t.id(r))); err != nil {
		return Usage{}, err
	}
	return t.usage(r), t.write(tx, r)
}

func (t table[T]) update(id string, fn func(*T) error) (r *T, err error) {
	err = t.ledger.write(t.db, func(tx *bolt.Tx, change *Usage) error {
		if r, err = t.read(tx, id); err != nil {
			return err
		}
		before := t.usage(r)
		if err := fn(r); err != nil {
			return err
		}
		*change = t.usage(r).minus(before)
		return t.write(tx, r)
	})
	return r, err
}

func (t table[T]) delete(id string) error {
	return t.ledger.write(t.db, func(tx *bolt.Tx, change *Usage) error {
		r, err := t.read(tx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := tx.Bucket(t.names).Delete([]byte(t.name(r))); err != nil {
			return err
		}
		*change = Usage{}.minus(t.usage(r))
		if t.deleted != nil {
			if err := t.deleted(tx, id); err != nil {
				return err
			}
		}
		return tx.Bucket(t.records).Delete([]byte(id))
	})
}
