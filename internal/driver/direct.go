package driver

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// directAssign decides whether a publication hands the volume to a microVM
// (StorageClass parameter directAssign: never, always or auto). In auto the
// pod's RuntimeClass decides; when that cannot be read the call fails:
// falling back to a host mount would silently share a filesystem the guest
// expected to own.
func (d *Driver) directAssign(ctx context.Context, mode string, volCtx map[string]string) (bool, error) {
	switch mode {
	case "", "never":
		return false, nil
	case "always":
		return true, nil
	}
	if d.cfg.Decider == nil {
		return false, status.Error(codes.FailedPrecondition, "directAssign=auto needs access to the Kubernetes API to read the pod's RuntimeClass: start podvol-plugin in a pod (in-cluster config) or with --kubeconfig")
	}
	direct, err := d.cfg.Decider.Direct(ctx, volCtx[ctxPodNamespace], volCtx[ctxPodName])
	if err != nil {
		return false, status.Error(codes.Unavailable, err.Error())
	}
	return direct, nil
}
