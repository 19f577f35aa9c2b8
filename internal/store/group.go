package store

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group is a group snapshot: snapshots of several volumes cut at one instant.
// Its members are ordinary snapshots (each with GroupID set); the group
// record says which, so that they are made, rolled back and deleted
// together.
type Group struct {
	ID      string        `json:"id"`
	Name    string        `json:"name"`
	Members []GroupMember `json:"members"` // in the order of the request
	State   string        `json:"state"`   // Creating, Ready, Deleting
	Created time.Time     `json:"created"`
}

// GroupMember is one volume of a group and its snapshot.
type GroupMember struct {
	SourceID   string `json:"sourceId"`
	SnapshotID string `json:"snapshotId"`
}

// Group returns the group snapshot with id.
func (s *Store) Group(id string) (*Group, error) { return s.groups.get(id) }

// GroupByName returns the group snapshot created under the CSI name.
func (s *Store) GroupByName(name string) (*Group, error) { return s.groups.byName(name) }

// Groups returns every group snapshot, ordered by id.
func (s *Store) Groups() ([]*Group, error) { return s.groups.list() }

// CreateGroup stores a new group and its member snapshots in one
// transaction, so that a restart finds either all of them or none. Every
// name must be free.
func (s *Store) CreateGroup(g *Group, snaps []*Snapshot) error {
	return s.ledger.write(s.db, func(tx *bolt.Tx, change *Usage) error {
		if _, err := s.groups.insert(tx, g); err != nil {
			return err
		}
		for _, snap := range snaps {
			u, err := s.snapshots.insert(tx, snap)
			if err != nil {
				return err
			}
			*change = change.plus(u)
		}
		return nil
	})
}

// SetGroupState sets the state of a group and of every member snapshot it
// still has, in one transaction.
func (s *Store) SetGroupState(id, state string) (*Group, error) {
	var g *Group
	err := s.ledger.write(s.db, func(tx *bolt.Tx, _ *Usage) error {
		var err error
		if g, err = s.groups.read(tx, id); err != nil {
			return err
		}
		g.State = state
		for _, m := range g.Members {
			snap, err := s.snapshots.read(tx, m.SnapshotID)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if snap.GroupID != id {
				return fmt.Errorf("snapshot %s is not a member of group %s", m.SnapshotID, id)
			}
			snap.State = state
			if err := s.snapshots.write(tx, snap); err != nil {
				return err
			}
		}
		return s.groups.write(tx, g)
	})
	return g, err
}

// DeleteGroup forgets the group record (its members are deleted first, each
// as a snapshot).
func (s *Store) DeleteGroup(id string) error { return s.groups.delete(id) }
