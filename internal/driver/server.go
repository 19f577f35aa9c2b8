package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/names"
)

// Observer is told of every finished call (metrics).
type Observer func(method string, code string, d time.Duration)

// Serve serves the driver on a unix socket endpoint ("unix:///path") until
// ctx ends.
func Serve(ctx context.Context, endpoint string, d *Driver, observe Observer) error {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || path == "" {
		return fmt.Errorf("endpoint %q must be unix:///absolute/path/to/csi.sock", endpoint)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("endpoint %s exists and is not a socket: refusing to replace it", path)
		}
		// A socket left by a previous run of the plugin.
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor(observe)))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	csi.RegisterGroupControllerServer(srv, d)
	klog.InfoS("Serving CSI", "endpoint", endpoint, "driver", names.Driver, "node", d.cfg.NodeID)

	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		return nil
	case err := <-done:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
}

func interceptor(observe Observer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		klog.V(4).InfoS("CSI call", "method", info.FullMethod, "request", protosanitizer.StripSecrets(req))
		resp, err := handler(ctx, req)
		took := time.Since(start)
		code := status.Code(err)
		if err != nil {
			klog.ErrorS(err, "CSI call failed", "method", info.FullMethod, "code", code, "duration", took)
		} else {
			klog.V(2).InfoS("CSI call done", "method", info.FullMethod, "duration", took)
		}
		if observe != nil {
			observe(info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:], code.String(), took)
		}
		return resp, err
	}
}
