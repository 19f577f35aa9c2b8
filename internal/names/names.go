// Package names holds the names podvol's parts share with each other and
// with Kubernetes objects: the driver, the topology key, the StorageClass
// parameters, and every podvol.io annotation, label and finalizer (no other
// package spells one out). The plugin, the controller, the dev cluster and the tests
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
	// ParamPool names the pool a class's volumes go to, and the
	// volumeAttribute of an inline volume that does; absent: the pool
	// named default.
	ParamPool = "pool"
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
	// AwaitingPlacement is the selected node that admission policy
	// podvol-placement-gate gives an unbound restore or clone of a podvol
	// WaitForFirstConsumer class until source-placement replaces it: no node
	// is called that (a node name has no '/'), so kube-scheduler finds no
	// node for the claim's pods and no provisioner provisions it before
	// podvol has decided where it goes.
	AwaitingPlacement = "podvol.io/awaiting-placement"
	// Placement on a claim set to PlacementScheduler leaves choosing its
	// node to kube-scheduler (the policy gives it no placeholder):
	// source-placement sets it when it cannot tell the source's node.
	Placement          = "podvol.io/placement"
	PlacementScheduler = "scheduler"
)

// Migration on drain (podvol-controller's migration). A claim annotated
// MigrateOnDrain "true", or of a class whose parameter
// ParamMigrateOnDrain is "true", keeps its data when its node is drained.
// The PV being moved records the migration: the node it goes to, the claim
// made there to copy it ("namespace/name": a clone of the claim,
// MigrationOf naming the claim's UID), and its phase; the stash of the
// claim re-made on the target is in podvol-controller's namespace.
const (
	MigrateOnDrain      = "podvol.io/migrate-on-drain"
	ParamMigrateOnDrain = "migrateOnDrain"
	MigrationTarget     = "podvol.io/migration-target"
	MigrationClaim      = "podvol.io/migration-claim"
	MigrationPhase      = "podvol.io/migration-phase"
	MigrationStarted    = "podvol.io/migration-started"
	// MigrationClaimDeleted records the UID of the claim the switch
	// deleted, before it does: only that claim is made again.
	MigrationClaimDeleted = "podvol.io/migration-claim-deleted"
	// MigrationClaimMade records the UID of the claim made again in its
	// place (by the switch, or its owner first): once it is gone, it is
	// not made again.
	MigrationClaimMade = "podvol.io/migration-claim-made"
	// MigrationVolume names the PV of the copy, once it is bound.
	MigrationVolume = "podvol.io/migration-volume"
	// MigrationReclaim keeps a PV's reclaim policy while the migration
	// holds it at Retain.
	MigrationReclaim = "podvol.io/migration-reclaim-policy"
	MigrationOf      = "podvol.io/migration-of"
	// MigratedFrom on the new PV names the PV it replaces.
	MigratedFrom = "podvol.io/migrated-from"
	// MigrationSourceLost on a PV being moved records when node-loss
	// judged its node lost: the copy's node then keeps what it holds, if
	// that is one instant (a pre-copy), or gives the copy up.
	MigrationSourceLost = "podvol.io/migration-source-lost"
	// MigrationFinalizer on a pod that uses a claim opted in holds the
	// pod's deletion (and so a drain, which waits for its pods to be gone)
	// while the data of a migration of its volume is not yet on its target.
	MigrationFinalizer = "podvol.io/migration"
	// MigrationLabel on the pods of a claim being moved (the claim's UID)
	// selects them for the PodDisruptionBudget that holds their eviction
	// until the pre-copy is in.
	MigrationLabel = "podvol.io/migration"
)

// PreCopied is the condition the copy's node sets on a migration's copy
// claim once the first copy, pulled while the pod runs, is in (status
// True). DataCopied with status False and reason ReasonSourceLost: the
// source's node was lost before the copy held one instant; with status
// True and reason ReasonPreCopyOnly: it was lost after the pre-copy, which
// the copy holds (the message says as of when).
const (
	PreCopied         = "podvol.io/PreCopied"
	ReasonSourceLost  = "SourceLost"
	ReasonPreCopyOnly = "PreCopyOnly"
)

// SnapshotManagedBy is external-snapshotter's label of the
// VolumeSnapshotContents (and podvol's group contents) that one node's
// csi-snapshotter (--node-deployment) takes: snapshot-controller sets it
// from the source PV's node, podvol-controller's snapshot-import and
// group-snapshot-routing from a handle's or the members' node. No node may
// change it (node-policy.yaml).
const SnapshotManagedBy = "snapshot.storage.kubernetes.io/managed-by"

// DataCopied is the condition a claim's node sets on it once the data a
// restore or clone pulls from another node is in and verified (status
// True, the message saying what moved). Besides telling the user, the
// update wakes external-provisioner, whose next CreateVolume for the claim
// would otherwise wait out its retry backoff (up to --retry-interval-max):
// a migrating pod's downtime.
const DataCopied = "podvol.io/DataCopied"

// Phases of a migration, on the PV being moved.
const (
	MigrationCopying   = "Copying"
	MigrationSwitching = "Switching"
	MigrationSwitched  = "Switched"
)

// Annotations and labels of podvol-controller's clone-lifecycle: a claim
// that is an ephemeral clone (Lifecycle: ResetOnDetach), its state, and the
// stash of a reset in the controller's namespace.
const (
	Lifecycle     = "podvol.io/lifecycle"
	ResetOnDetach = "reset-on-detach"
	// Used marks a PVC a pod has used since it was (re)created.
	Used = "podvol.io/used"
	// ResetCount and LastReset make resets visible.
	ResetCount = "podvol.io/reset-count"
	LastReset  = "podvol.io/last-reset"
	// StashClaim ("namespace/name") and StashOldUID on a stash name the
	// claim it resets and the UID of the PVC it deleted; StashClaimNamespace
	// labels stashes by the claim's namespace, for kubectl -l.
	StashClaim          = "podvol.io/claim"
	StashOldUID         = "podvol.io/old-uid"
	StashClaimNamespace = "podvol.io/claim-namespace"
)

// Node-loss's finalizer, and the labels and annotation of its records of
// released volumes.
const (
	// NodeLossFinalizer keeps a deleted Node until its volumes are released.
	NodeLossFinalizer = "podvol.io/release-local-volumes"
	// ReleasedLabel marks the ConfigMaps that record released volumes;
	// ReleasedNodeLabel selects a node's (its name, or a hash of a name too
	// long for a label value); ReleasedNodeAnnotation names their node.
	ReleasedLabel          = "podvol.io/released-volumes"
	ReleasedNodeLabel      = "podvol.io/released-node"
	ReleasedNodeAnnotation = "podvol.io/node"
)

// DirectAssignAnnotation on a RuntimeClass marks pods that run in microVMs
// taking direct-assigned volumes (directAssign: auto).
const DirectAssignAnnotation = "podvol.io/direct-assign"

// MetricsReaderRole is the ClusterRole (deploy/base/rbac-metrics.yaml) whose
// holders may get podvol's metrics: the non-resource URLs MetricsPath and
// MetricsPath/<sidecar> on the plugin's and the controller's HTTPS servers.
const (
	MetricsReaderRole = "podvol-metrics-reader"
	MetricsPath       = "/metrics"
	// MetricsAudience is the audience a scraper's token must have (the
	// plugin's and the controller's --metrics-audience): a token for the
	// API server is refused, and a scraper's token is no use against it.
	MetricsAudience = "podvol.io/metrics"
)

// Metrics serving certificates: podvol-controller's metrics-signer signs
// the CertificateSigningRequests of MetricsSigner, whose requester must be
// podvol-node on the node the certificate is for, with a CA it keeps in
// Secret MetricsCA of podvol's namespace and publishes in ConfigMap
// MetricsCA there, under TransferCAKey: what a scraper trusts. A node's
// certificate names MetricsNodeServerName, podvol-controller's (issued by
// itself with the same CA) MetricsControllerServerName: the names a scraper
// verifies (its server_name), as the addresses scraped are not in them.
const (
	MetricsSigner               = "podvol.io/metrics-serving"
	MetricsCA                   = "podvol-metrics-ca"
	MetricsNodeServerName       = "podvol-node.metrics.podvol.io"
	MetricsControllerServerName = "podvol-controller.metrics.podvol.io"
)

// Transfers between nodes (internal/transfer): podvol-controller's
// transfer-signer signs the CertificateSigningRequests of SignerName, whose
// requester must be podvol-node on the node the certificate names, with a
// CA it keeps in Secret TransferCA of podvol's namespace and publishes (the
// certificate alone) in ConfigMap TransferCA there, under TransferCAKey.
const (
	TransferSigner = "podvol.io/transfer"
	TransferCA     = "podvol-transfer-ca"
	TransferCAKey  = "ca.crt"
	// NodeNameExtra is the user extra in which the API server puts the node
	// of the pod a ServiceAccount token is bound to.
	NodeNameExtra = "authentication.kubernetes.io/node-name"
)
