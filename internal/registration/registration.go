// Package registration registers the plugin with the kubelet through the
// kubelet's plugin registration API, so that no node-driver-registrar
// sidecar is needed: the plugin serves the Registration service on a socket
// in the kubelet's plugins_registry directory, which the kubelet watches.
package registration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
}

func (s *server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: s.driver, Endpoint: s.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		klog.InfoS("Registered with the kubelet", "driver", s.driver)
	} else {
		// The kubelet says why; without registration no pod can mount a
		// podvol volume on this node, so make it loud.
		klog.ErrorS(errors.New(st.Error), "The kubelet refused the registration", "driver", s.driver)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Serve serves the registration socket <dir>/<driver>-reg.sock until ctx
// ends. endpoint is the CSI socket's path as the kubelet sees it.
func Serve(ctx context.Context, dir, driver, endpoint string) error {
	sock := filepath.Join(dir, driver+"-reg.sock")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &server{driver: driver, endpoint: endpoint})
	klog.InfoS("Serving kubelet plugin registration", "socket", sock, "csiEndpoint", endpoint)
	go func() {
		<-ctx.Done()
		srv.Stop()
		if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
			klog.ErrorS(err, "Removing the registration socket", "socket", sock)
		}
	}()
	return srv.Serve(lis)
}
