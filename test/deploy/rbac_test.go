package deploy

import (
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podvol/podvol/internal/names"
)

// access is one request: verb on group/resource[/subresource], in a
// namespace ("" for cluster-wide), of one object (name) or any.
type access struct {
	verb, group, resource, subresource, namespace, name string
	// who calls it (for failures)
	who string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.name != "" {
		r += " " + a.name
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	return fmt.Sprintf("%s %s %s", a.verb, r, where)
}

func verbs(who, group, resource, sub, ns string, vs ...string) []access {
	var out []access
	for _, v := range vs {
		out = append(out, access{verb: v, group: group, resource: resource, subresource: sub, namespace: ns, who: who})
	}
	return out
}

// needed is every call the node DaemonSet makes (see rbac-node.yaml's
// comments for where in each component's code).
func needed() []access {
	var a []access
	add := func(x ...access) { a = append(a, x...) }
	const prov, snap, res, plugin = "external-provisioner", "csi-snapshotter", "external-resizer", "plugin"
	add(verbs(plugin, "", "pods", "", "tenant", "get")...)
	add(verbs(prov, "", "pods", "", namespace, "get")...)
	add(verbs(plugin, "node.k8s.io", "runtimeclasses", "", "", "get")...)
	add(verbs(prov+", "+res, "", "persistentvolumes", "", "", "get", "list", "watch", "create", "patch", "delete")...)
	add(verbs(prov+", "+res, "", "persistentvolumeclaims", "", "", "list", "watch")...)
	add(verbs(prov, "", "persistentvolumeclaims", "", "tenant", "get", "update")...)
	add(verbs(res, "", "persistentvolumeclaims", "status", "tenant", "patch")...)
	add(verbs("event recorders", "", "events", "", "tenant", "create", "patch")...)
	add(verbs("event recorders", "", "events", "", namespace, "create", "patch")...)
	add(verbs(prov, "storage.k8s.io", "storageclasses", "", "", "list", "watch")...)
	add(verbs(prov, "storage.k8s.io", "volumeattributesclasses", "", "", "get")...)
	add(verbs(prov, "snapshot.storage.k8s.io", "volumesnapshots", "", "", "list", "watch")...)
	add(verbs(prov, "snapshot.storage.k8s.io", "volumesnapshots", "", "tenant", "get", "update")...)
	add(verbs(snap, "snapshot.storage.k8s.io", "volumesnapshotclasses", "", "", "list", "watch")...)
	add(verbs(snap+", "+prov, "snapshot.storage.k8s.io", "volumesnapshotcontents", "", "", "get", "list", "watch", "patch")...)
	add(verbs(snap, "snapshot.storage.k8s.io", "volumesnapshotcontents", "status", "", "update", "patch")...)
	const group = "podvol-group-snapshotter"
	add(verbs(group, "groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "", "", "list", "watch")...)
	add(verbs(group, "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "", "", "get", "list", "watch", "patch")...)
	add(verbs(group, "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "status", "", "update", "patch")...)
	add(verbs(prov, "gateway.networking.k8s.io", "referencegrants", "", "", "list", "watch")...)
	add(verbs(prov, "storage.k8s.io", "csistoragecapacities", "", namespace, "list", "watch", "create", "update", "delete")...)
	add(verbs(res, "coordination.k8s.io", "leases", "", namespace, "create")...)
	for _, v := range []string{"get", "update"} {
		add(access{verb: v, group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "external-resizer-podvol-io", who: res})
	}
	// Transfers: the address of a snapshot's node (internal/mobility).
	add(verbs(plugin, "", "nodes", "", "", "get")...)
	// Its transfer certificate (internal/transfercert) and the CA to trust.
	add(verbs(plugin, "certificates.k8s.io", "certificatesigningrequests", "", "", "create", "get")...)
	add(access{verb: "get", resource: "configmaps", namespace: namespace, name: names.TransferCA, who: plugin})
	add(metricsReviews(plugin)...)
	return a
}

// metricsReviews are the reviews of each metrics request's token and access
// (internal/metricsauth; rbac-metrics.yaml).
func metricsReviews(who string) []access {
	return append(verbs(who+" metrics", "authentication.k8s.io", "tokenreviews", "", "", "create"),
		verbs(who+" metrics", "authorization.k8s.io", "subjectaccessreviews", "", "", "create")...)
}

// notNeeded were granted before (or are near what is) and nothing in the
// DaemonSet calls them.
func notNeeded() []access {
	var a []access
	add := func(x ...access) { a = append(a, x...) }
	add(verbs("", "", "nodes", "", "", "list", "watch", "update", "patch")...)
	add(verbs("", "storage.k8s.io", "csinodes", "", "", "get", "list", "watch")...)
	add(verbs("", "storage.k8s.io", "volumeattachments", "", "", "get", "list", "watch")...)
	add(verbs("", "", "pods", "", "", "list", "watch")...)
	add(verbs("", "", "events", "", "tenant", "list", "watch", "update")...)
	add(verbs("", "storage.k8s.io", "storageclasses", "", "", "get")...)
	add(verbs("", "storage.k8s.io", "volumeattributesclasses", "", "", "list", "watch")...)
	add(verbs("", "snapshot.storage.k8s.io", "volumesnapshotclasses", "", "", "get")...)
	add(verbs("", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", "", "update", "create", "delete")...)
	add(verbs("", "gateway.networking.k8s.io", "referencegrants", "", "tenant", "get")...)
	add(verbs("", "apps", "daemonsets", "", namespace, "get")...)
	add(verbs("", "storage.k8s.io", "csistoragecapacities", "", namespace, "get", "patch")...)
	add(verbs("", "coordination.k8s.io", "leases", "", namespace, "list", "watch", "delete")...)
	for _, v := range []string{"get", "update"} {
		add(access{verb: v, group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "podvol-controller"})
		add(access{verb: v, group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "snapshot-controller-leader"})
	}
	add(verbs("", "", "persistentvolumes", "", "", "update")...)
	add(verbs("", "", "persistentvolumeclaims", "", "tenant", "create", "delete", "patch")...)
	add(verbs("", "", "secrets", "", "tenant", "get", "list")...)
	add(verbs("", "", "configmaps", "", namespace, "get", "update")...)
	add(verbs("", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "", "", "update", "create", "delete")...)
	add(verbs("", "groupsnapshot.storage.k8s.io", "volumegroupsnapshots", "", "tenant", "get", "update")...)
	// A node signs nothing, approves nothing, and cannot touch other
	// nodes' requests.
	add(verbs("", "certificates.k8s.io", "certificatesigningrequests", "", "", "list", "watch", "update", "delete")...)
	add(verbs("", "certificates.k8s.io", "certificatesigningrequests", "approval", "", "update")...)
	add(verbs("", "certificates.k8s.io", "certificatesigningrequests", "status", "", "update")...)
	for _, v := range []string{"approve", "sign"} {
		add(access{verb: v, group: "certificates.k8s.io", resource: "signers", name: names.TransferSigner})
	}
	add(verbs("", "", "secrets", "", namespace, "get")...)
	return a
}

// controllerNeeded are the calls of podvol-controller's pod whose grants
// are narrowed to names or namespaces (the rest of rbac-controller.yaml is
// cluster-wide by nature: see its comments), and those of source-placement
// (internal/controller/sourceplacement).
func controllerNeeded() []access {
	var a []access
	add := func(x ...access) { a = append(a, x...) }
	add(verbs("leader election", "coordination.k8s.io", "leases", "", namespace, "create")...)
	for _, lease := range []string{"podvol-controller", "snapshot-controller-leader"} {
		for _, v := range []string{"get", "update"} {
			add(access{verb: v, group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: lease, who: "leader election"})
		}
	}
	add(access{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "node-a", who: "node-loss"})
	add(verbs("clone-lifecycle, admission-params, node-loss", "", "configmaps", "", namespace, "get", "list", "create", "patch", "delete")...)
	// source-placement: its cache (list, watch) and reads (get) of claims,
	// their sources' PVs, StorageClasses, Nodes, the pods that use the
	// claims, and snapshots (from the cache, unstructured); the selected
	// node it sets on a claim (patch); its events on claims and their pods.
	const sp = "source-placement"
	add(verbs(sp, "", "persistentvolumeclaims", "", "", "list", "watch")...)
	add(verbs(sp, "", "persistentvolumeclaims", "", "tenant", "get", "patch")...)
	add(verbs(sp, "", "persistentvolumes", "", "", "get", "list", "watch")...)
	add(verbs(sp, "storage.k8s.io", "storageclasses", "", "", "get", "list", "watch")...)
	add(verbs(sp, "", "nodes", "", "", "get", "list", "watch")...)
	add(verbs(sp, "", "pods", "", "", "list", "watch")...)
	add(verbs(sp, "snapshot.storage.k8s.io", "volumesnapshots", "", "", "list", "watch")...)
	add(verbs(sp, "snapshot.storage.k8s.io", "volumesnapshots", "", "tenant", "get")...)
	add(verbs(sp, "snapshot.storage.k8s.io", "volumesnapshotcontents", "", "", "get", "list", "watch")...)
	add(verbs(sp, "events.k8s.io", "events", "", "tenant", "create", "patch")...)
	// transfer-signer (internal/controller/transfersigner).
	const ts = "transfer-signer"
	add(verbs(ts, "certificates.k8s.io", "certificatesigningrequests", "", "", "get", "list", "watch")...)
	add(verbs(ts, "certificates.k8s.io", "certificatesigningrequests", "approval", "", "update")...)
	add(verbs(ts, "certificates.k8s.io", "certificatesigningrequests", "status", "", "update")...)
	for _, v := range []string{"approve", "sign"} {
		add(access{verb: v, group: "certificates.k8s.io", resource: "signers", name: names.TransferSigner, who: ts})
	}
	add(verbs(ts, "", "secrets", "", namespace, "create")...)
	add(access{verb: "get", resource: "secrets", namespace: namespace, name: names.TransferCA, who: ts})
	// metrics-signer (the same code, transfercert.Metrics), and every
	// replica's own metrics certificate from its CA (Serving).
	const ms = "metrics-signer"
	for _, v := range []string{"approve", "sign"} {
		add(access{verb: v, group: "certificates.k8s.io", resource: "signers", name: names.MetricsSigner, who: ms})
	}
	add(access{verb: "get", resource: "secrets", namespace: namespace, name: names.MetricsCA, who: ms})
	add(verbs(ms, "", "configmaps", "", namespace, "get", "create", "patch")...)
	add(metricsReviews("podvol-controller")...)
	return a
}

// controllerNotNeeded: what podvol-controller's pod was granted before and
// does not call.
func controllerNotNeeded() []access {
	var a []access
	add := func(x ...access) { a = append(a, x...) }
	add(verbs("", "coordination.k8s.io", "leases", "", namespace, "list", "watch", "delete")...)
	for _, v := range []string{"get", "update"} {
		add(access{verb: v, group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "external-resizer-podvol-io"})
	}
	add(verbs("", "coordination.k8s.io", "leases", "", "kube-node-lease", "list", "update", "delete")...)
	add(verbs("", "", "configmaps", "", "tenant", "list", "create", "patch", "delete")...)
	add(verbs("", "", "secrets", "", "tenant", "get", "list")...)
	add(verbs("", "", "secrets", "", namespace, "get", "list")...)
	add(access{verb: "update", resource: "secrets", namespace: namespace, name: names.TransferCA})
	add(access{verb: "update", resource: "secrets", namespace: namespace, name: names.MetricsCA})
	// No other signer: not the API server's client certificates.
	for _, v := range []string{"approve", "sign"} {
		add(access{verb: v, group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kube-apiserver-client"})
	}
	return a
}

// testRBAC: podvol-node's roles allow every call the DaemonSet makes, and
// none of those nothing makes.
func (e *env) testRBAC(t *testing.T) { e.checkRBAC(t, saUser, "podvol-node", needed(), notNeeded()) }

// testControllerRBAC: likewise for podvol-controller's narrowed grants.
func (e *env) testControllerRBAC(t *testing.T) {
	e.checkRBAC(t, "system:serviceaccount:"+namespace+":podvol-controller", "podvol-controller", controllerNeeded(), controllerNotNeeded())
}

func (e *env) checkRBAC(t *testing.T, user, name string, need, notNeed []access) {
	may := func(a access) bool {
		r, err := e.admin.kc.AuthorizationV1().SubjectAccessReviews().Create(bg, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource,
				Subresource: a.subresource, Namespace: a.namespace, Name: a.name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	for _, a := range need {
		if !may(a) {
			t.Errorf("%s may not %s, which %s calls", name, a, a.who)
		}
	}
	for _, a := range notNeed {
		if may(a) {
			t.Errorf("%s may %s, which nothing in its pod calls", name, a)
		}
	}
}
