// Package nodeloss releases node-local volumes of nodes that are gone: when a
// Node that runs podvol is deleted and its kubelet has stopped renewing its
// Lease for a grace period, the PVCs bound to podvol volumes on it are
// deleted with their PVs, so that StatefulSets create them again and their
// pods schedule elsewhere instead of waiting forever for a node that will not
// come back. A Node deleted while its kubelet is alive (a routine `kubectl
// delete node`, a cloud integration re-creating Node objects) is not lost:
// its volumes are kept. A finalizer on each podvol Node makes sure no
// deletion is missed.
//
// What this relies on in the kubelet (k8s.io/kubernetes v1.37.2):
//   - The kubelet renews its Lease kube-node-lease/<node> every
//     nodeLeaseDurationSeconds/4 (40 s/4 = 10 s by default, 4 % jitter),
//     setting spec.renewTime from its clock; it never deletes the Lease
//     (it runs the lease controller with Run, not Start/Stop), so a dead
//     kubelet leaves a Lease that is no longer renewed.
//   - The Lease is owned by the Node (ownerReference, no blockOwnerDeletion).
//     The garbage collector deletes it only once the Node is gone, or while
//     a foreground deletion of the Node waits for its dependents. While our
//     finalizer holds a Node deleted in the background (kubectl's and the
//     cloud node lifecycle controller's default), its Lease stays, and a live
//     kubelet keeps renewing it: renewing updates the Lease it has and does
//     not need the Node. A kubelet whose Lease is missing creates it again
//     within seconds, but only while its Node exists (the owner reference
//     needs the Node's UID): so while we hold the Node, a live kubelet always
//     shows a renewal within its renew interval.
//   - A running kubelet does not register its Node again once it is gone
//     (registrationCompleted is never reset); only a restarted kubelet does.
//     So "the kubelet registers the Node again" cannot be waited for, and a
//     Node of the same name cannot be created while we hold the old one.
//
// Hence the rule: once a podvol Node is being deleted, the controller reads
// its Lease from the API (not the cache) every few seconds. A renewal seen
// after the deletion (renewTime or the Lease's UID changed, or a Lease
// appeared) means the node is alive: the finalizer is dropped and nothing is
// released. A Lease left unchanged (or missing) for the whole grace period,
// or for the Lease's own duration if that is longer (a shorter wait could
// end before the kubelet's next renewal was due), measured on this
// controller's own clock from when it first saw the deletion, means the
// node is gone: its volumes are released. renewTime is
// compared only with earlier readings of itself, never with this clock: the
// kubelet's clock may be skewed.
package nodeloss
