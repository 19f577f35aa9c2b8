package store

import (
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// table keeps records of one kind as JSON in a bucket keyed by id, with a
// second bucket indexing them by CSI name.
type table[T any] struct {
	db             *bolt.DB
	kind           string
	records, names []byte
	id, name       func(*T) string
}

func (t table[T]) read(tx *bolt.Tx, id string) (*T, error) {
	b := tx.Bucket(t.records).Get([]byte(id))
	if b == nil {
		return nil, ErrNotFound
	}
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
		return tx.Bucket(t.records).ForEach(func(k, _ []byte) error {
			r, err := t.read(tx, string(k))
			if err == nil {
				out = append(out, r)
			}
			return err
		})
	})
	return out, err
}

func (t table[T]) create(r *T) error {
	return t.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(t.names).Get([]byte(t.name(r))) != nil {
			return fmt.Errorf("%s name %q: %w", t.kind, t.name(r), errExists)
		}
		if err := tx.Bucket(t.names).Put([]byte(t.name(r)), []byte(t.id(r))); err != nil {
			return err
		}
		return t.write(tx, r)
	})
}

func (t table[T]) update(id string, fn func(*T) error) (r *T, err error) {
	err = t.db.Update(func(tx *bolt.Tx) error {
		if r, err = t.read(tx, id); err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
		return t.write(tx, r)
	})
	return r, err
}

func (t table[T]) delete(id string) error {
	return t.db.Update(func(tx *bolt.Tx) error {
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
		return tx.Bucket(t.records).Delete([]byte(id))
	})
}
