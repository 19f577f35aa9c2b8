// Package versions is the one place podvol's Go code reads the versions of
// what it builds and deploys beside itself. What is built comes from the
// go.mod files under tools/ (the build scripts read their versions there);
// the Helm chart's values (charts/podvol/values.yaml) pin the sidecars'
// image tags. This package's test checks all
// of them against these constants, so a version is changed in one go: here,
// then in the go.mod and manifest the test names.
package versions

const (
	// Kubernetes is the version of the binaries the dev cluster and the
	// envtest suites run, and of the e2e suite `make conformance` builds
	// (tools/k8s/go.mod, tools/e2e/go.mod; the main go.mod's k8s.io
	// staging modules are its v0.x twin).
	Kubernetes = "v1.37.2"
	// ExternalProvisioner, ExternalResizer and ExternalSnapshotter are the
	// CSI sidecars (tools/sidecars/go.mod, charts/podvol/values.yaml).
	ExternalProvisioner = "v6.4.0"
	ExternalResizer     = "v2.3.0"
	ExternalSnapshotter = "v8.7.0"
	// GatewayAPI provides the ReferenceGrant CRD that cross-namespace
	// clones check.
	GatewayAPI = "v1.6.3"
)

// Sidecars are the sidecar images podvol deploys, by image name.
var Sidecars = map[string]string{
	"csi-provisioner":     ExternalProvisioner,
	"csi-resizer":         ExternalResizer,
	"csi-snapshotter":     ExternalSnapshotter,
	"snapshot-controller": ExternalSnapshotter,
}

// SnapshotterClient is the module holding the snapshot CRDs.
const SnapshotterClient = "github.com/kubernetes-csi/external-snapshotter/client/v8@" + ExternalSnapshotter

// GatewayAPIModule is the module holding the ReferenceGrant CRD.
const GatewayAPIModule = "sigs.k8s.io/gateway-api@" + GatewayAPI
