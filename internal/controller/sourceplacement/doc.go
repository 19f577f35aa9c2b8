// Package sourceplacement provisions restores and clones on the node that
// holds their source. A podvol snapshot or volume lives in one node's pool,
// and a PVC that restores or clones it can only be provisioned there (the
// plugin of any other node answers NOT_FOUND). With WaitForFirstConsumer the
// scheduler does not know this and picks any node with room. It has one
// rule that fits, though: for an unbound claim that already carries the
// annotation volume.kubernetes.io/selected-node, kube-scheduler's volume
// binding considers that node only (FindPodVolumes: "Fast path, skip
// unmatched node"), and that node's csi-provisioner (--node-deployment)
// provisions it. So this controller finds the source's node (the source PV's
// node affinity on topology.podvol.io/node, or the node a snapshot handle
// names: package snaphandle) and sets the annotation to it, replacing a node
// the scheduler picked first: the scheduler's PreBind then sees the change
// and schedules the pod again, onto that node.
//
// Only a claim that has a consumer is placed, as WaitForFirstConsumer
// would: a pod that is neither being deleted nor finished uses it (a
// persistentVolumeClaim volume naming it, or a generic ephemeral volume
// whose pod owns it), or the scheduler has selected a node for it already.
// A claim nobody uses is left unprovisioned, and the source node's room
// untaken.
//
// When the source's node has no room, its csi-provisioner gets
// RESOURCE_EXHAUSTED and removes the annotation to ask the scheduler for
// another node, where the claim cannot be provisioned either. The controller
// marks the claims it placed (podvol.io/source-node) and, finding the
// annotation removed from one, places it again only after a backoff that
// grows with each give-back (Reconciler.Backoff doubling up to
// Reconciler.MaxBackoff, counted per claim until it is bound), and only
// while a pod still uses it: not a fight with the provisioner.
//
// Sources that are not ready to tell their node (a claim not bound yet, a
// snapshot not bound or not cut yet) wake their claims through watches (the
// source claims, VolumeSnapshots and VolumeSnapshotContents), besides a
// look again after Reconciler.Wait doubling up to MaxBackoff. Every read is
// from the manager's cache (the snapshot kinds, read as unstructured
// objects, too: podvol-controller's client caches unstructured objects).
//
// A pod that uses the claim and cannot run on the source's node (cordoned, a
// taint it does not tolerate, its node constraints) would wait forever: the
// claim is placed there still (nowhere else can provision it), and a Warning
// event on the claim and the pod says why.
//
// A source in another namespace (dataSourceRef.namespace) is not acted on:
// which node holds it is the other namespace's to tell, and a ReferenceGrant
// check is not this controller's to make. A Warning event says so. So does
// one on a restore when the snapshot CRDs were not installed when
// podvol-controller started (it must be restarted to place restores).
package sourceplacement
