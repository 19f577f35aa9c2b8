// Package errkind holds the kinds of error every layer below the gRPC edge
// wraps (fmt.Errorf("...: %w", errkind.ErrX)), so that the driver can tell a
// refused request from a failure without knowing who refused it. Only the
// gRPC edge (toStatus in internal/driver) turns a kind into a status code.
//
// It imports nothing but the standard library, so that a package which only
// needs to say what kind of failure it returns (internal/size, fuzzed) does
// not link the pool, its metadata store and the machine.
package errkind

import "errors"

var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("exists with different attributes")
	ErrNoSpace  = errors.New("not enough space in the pool")
	ErrInUse    = errors.New("in use")
	// ErrNotStaged: a node call needs the volume staged (at that path).
	ErrNotStaged  = errors.New("not staged")
	ErrOutOfRange = errors.New("out of range")
	ErrInvalid    = errors.New("invalid")
	ErrUnusable   = errors.New("pool unusable")
	// ErrUnaccounted: the pool holds images its store does not know.
	ErrUnaccounted = errors.New("images the metadata store does not account for")
	// ErrElsewhere: a snapshot this pool never held, which is therefore
	// on another node's.
	ErrElsewhere = errors.New("not on this node")
	// ErrDenied: the caller is known but may not do this (a node asking
	// for a volume no claim bound for it references).
	ErrDenied = errors.New("permission denied")
	// ErrNoFilesystem: a volume holds data that podvol did not write
	// (pulled from another node) and no filesystem is found on it: it is
	// never formatted.
	ErrNoFilesystem = errors.New("holds data but no filesystem")
)
