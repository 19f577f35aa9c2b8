package pool

import "errors"

// Error kinds. Callers wrap them with context (fmt.Errorf("...: %w", ErrX));
// only the gRPC edge turns them into status codes.
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
)
