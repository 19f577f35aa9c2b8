// Package kubectlplugin is `kubectl podvol` (cmd/kubectl-podvol): an admin's
// view of podvol read from the Kubernetes API alone, and the one write an
// admin needs from it, the reclaim of a volume released while its node was
// lost.
//
// It never reaches a node: everything comes from the objects podvol and its
// sidecars publish (CSIStorageCapacity, CSINode, PVs, VolumeSnapshotContents,
// the plugin's pods, node-loss's records of released volumes) and, for the
// space a volume uses, the kubelet's stats summary through the API server's
// node proxy (the kubelet asks the plugin, NodeGetVolumeStats). The plugin's
// own /metrics listen on the node's loopback and are out of reach, so the
// pool's size is free (CSIStorageCapacity) plus allocated (the sizes of the
// node's volumes and snapshots as the API knows them), and its health is what
// the API shows of the plugin (pod, registration, capacity, node); the
// plugin's volume and pool health conditions are answered only to CSI calls
// on the node and appear nowhere in the API (docs/operations.md, "kubectl
// podvol").
//
// Gathering (Gather) and acting (Reclaim) talk to the API; everything between
// (Status, Volumes, Released) is pure functions of a State, unit-tested on
// hand-made objects.
package kubectlplugin
