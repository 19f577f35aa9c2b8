package driver

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/errkind"
)

func TestToStatus(t *testing.T) {
	wrap := func(kind error) error { return fmt.Errorf("volume pv-1: %w", kind) }
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{wrap(errkind.ErrNotFound), codes.NotFound},
		{wrap(errkind.ErrConflict), codes.AlreadyExists},
		{wrap(errkind.ErrNoSpace), codes.ResourceExhausted},
		{wrap(errkind.ErrInUse), codes.FailedPrecondition},
		{wrap(errkind.ErrUnusable), codes.FailedPrecondition},
		{wrap(errkind.ErrNoFilesystem), codes.FailedPrecondition},
		{wrap(errkind.ErrOutOfRange), codes.OutOfRange},
		{wrap(errkind.ErrInvalid), codes.InvalidArgument},
		{wrap(errkind.ErrDenied), codes.PermissionDenied},
		{errors.New("mount: boom"), codes.Internal},
		{wrap(errkind.ErrUnaccounted), codes.Internal},
		// Doubly wrapped, and joined with a cause that is not a kind.
		{fmt.Errorf("publish: %w", wrap(errkind.ErrInUse)), codes.FailedPrecondition},
		{fmt.Errorf("grow: %w: %w", errors.New("resize2fs: EPERM"), errkind.ErrInUse), codes.FailedPrecondition},
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
