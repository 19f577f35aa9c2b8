// Package names holds the names podvol's parts share with each other and
// with Kubernetes objects: the driver, the topology key, the StorageClass
// parameters and the annotations more than one part reads. The plugin, the controller, the dev cluster and the tests
// import them from here; the manifests in deploy/base spell them out, and
// this package's test checks them against it.
package names

const (
	// Driver is the CSI driver name podvol registers.
	Driver = "podvol.io"
	// TopologyKey carries the node a volume lives on (the PVs' node
	// affinity, CSINode's topology keys).
	TopologyKey = "topology.podvol.io/node"
)

// StorageClass parameters. Keys under csi.storage.k8s.io/ are added by the
// sidecars (PVC name and namespace) and are ignored.
const (
	ParamFsType              = "fsType"
	ParamDirectAssign        = "directAssign"
	ParamFsGroupChangePolicy = "fsGroupChangePolicy"
	// ParamReleaseOnNodeLoss is read by podvol-controller's node-loss:
	// "false" keeps the volumes of a lost node.
	ParamReleaseOnNodeLoss = "releaseOnNodeLoss"
)

// Annotations of PersistentVolumeClaims.
const (
	// SelectedNode is kube-scheduler's: the node whose provisioner
	// provisions an unbound WaitForFirstConsumer claim (the scheduler then
	// considers that node only for the claim's pods).
	SelectedNode = "volume.kubernetes.io/selected-node"
	// SourceNode marks a claim that podvol-controller's source-placement
	// placed on the node holding its data source, with that node;
	// clone-lifecycle's reset keeps the placement of a claim that has it.
	SourceNode = "podvol.io/source-node"
)
