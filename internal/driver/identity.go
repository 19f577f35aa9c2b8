package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/podvol/podvol/internal/names"
)

func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: names.Driver, VendorVersion: d.cfg.Version}, nil
}

func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	expansion := func(t csi.PluginCapability_VolumeExpansion_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: t}}}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		svc(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		svc(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE),
		expansion(csi.PluginCapability_VolumeExpansion_ONLINE),
		expansion(csi.PluginCapability_VolumeExpansion_OFFLINE),
	}}, nil
}

// Probe fails when a pool cannot serve, so that a liveness check restarts
// a plugin whose pool went away.
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	err := d.eachPool(func(pl *Pool) error {
		if err := pl.Pool.Check(); err != nil {
			return status.Errorf(codes.FailedPrecondition, "pool %s: %v", pl.Pool.Name(), err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
