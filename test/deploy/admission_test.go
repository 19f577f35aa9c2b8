package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/admissionparams"
	"github.com/podvol/podvol/internal/names"
)

// rightsPolicy is the admission policy that checks the right to create PVCs.
const rightsPolicy = "podvol-ephemeral-volume-rights"

// tenants are users of namespace tenant, by impersonation, with real RBAC:
// noClaims may create pods and StatefulSets (and update them) but no
// PersistentVolumeClaims, claims may create PersistentVolumeClaims too.
type tenants struct{ noClaims, claims *identity }

func (e *env) tenants(t *testing.T) tenants {
	t.Helper()
	kc := e.admin.kc
	workloads := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets"}, Verbs: []string{"create", "get", "update", "patch"}},
	}
	for user, rules := range map[string][]rbacv1.PolicyRule{
		"carol": workloads,
		"dave":  append(workloads, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create", "get"}}),
	} {
		if _, err := kc.RbacV1().Roles("tenant").Create(bg, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kc.RbacV1().RoleBindings("tenant").Create(bg, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	as := func(user string) *identity {
		cfg := rest.CopyConfig(e.api.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
		return newIdentity(t, user, cfg)
	}
	return tenants{noClaims: as("carol"), claims: as("dave")}
}

// admissionParams runs podvol-controller's admission-params controller,
// which writes which StorageClasses are podvol's (by provisioner) into the
// policies' parameters.
func (e *env) admissionParams(t *testing.T) {
	t.Helper()
	runController(t, "admission-params", e.api.Config, func(mgr ctrl.Manager) error {
		return (&admissionparams.Reconciler{Client: mgr.GetClient(), Driver: names.Driver, Namespace: namespace, Name: "podvol-admission"}).SetupWithManager(mgr)
	})
}

// runController runs one of podvol-controller's controllers (set up by
// setup) with cfg's identity until the test ends.
func runController(t *testing.T, name string, cfg *rest.Config, setup func(ctrl.Manager) error) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// params waits until the policies' parameters say want.
func (e *env) params(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	err := eventually(time.Minute, func() error {
		cm, err := e.admin.kc.CoreV1().ConfigMaps(namespace).Get(bg, "podvol-admission", metav1.GetOptions{})
		if err != nil {
			return err
		}
		got = cm.Data
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("%s is %q", k, got[k])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the admission policies' parameters %v never said %v: %v", got, want, err)
	}
}

func claimTemplate(name string, class *string, ann map[string]string) corev1.PersistentVolumeClaim {
	return corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
}

func statefulSet(name string, templates ...corev1.PersistentVolumeClaim) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To[int32](1), ServiceName: name, Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db"}}}},
		VolumeClaimTemplates: templates}}
}

// refusedByRights checks that podvol's PVC-rights policy refused the
// request, with a message naming each of want.
func refusedByRights(t *testing.T, id *identity, what string, err error, want ...string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: %s: want refused by %s, it was allowed", id.name, what, rightsPolicy)
	case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+rightsPolicy+"'"):
		t.Errorf("%s: %s: want refused by %s, got: %v", id.name, what, rightsPolicy, err)
	default:
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %s: refusal does not say %q: %v", id.name, what, w, err)
			}
		}
		t.Logf("%s: %s: refused: %v", id.name, what, err)
	}
}

// TestClaimRights: deploy/base's admission policies, with their parameters
// kept by admission-params, refuse a user who may not create
// PersistentVolumeClaims the podvol PVCs that others would create for them:
// a pod's generic ephemeral volume, and a StatefulSet's volumeClaimTemplates
// (kube-controller-manager's StatefulSet controller creates one PVC per
// template and replica, with its own rights). A user who may create PVCs,
// and templates of other drivers' classes, are let through.
func TestClaimRights(t *testing.T) {
	e := start(t)
	for name, prov := range map[string]string{"podvol": names.Driver, "local-fast": names.Driver, "network": "other.example.com"} {
		if _, err := e.admin.kc.StorageV1().StorageClasses().Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Provisioner: prov, VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	policies := apply(t, e.ac, manifest(t, "PODVOL_ADMISSION_POLICY", "admission-policy.yaml"))
	e.admissionParams(t)
	// local-fast is podvol's by its provisioner: the shipped parameters do
	// not name it.
	e.params(t, map[string]string{admissionparams.Classes: "local-fast podvol", admissionparams.DefaultIsPodvol: "false"})
	u := e.tenants(t)
	sts := u.noClaims.kc.AppsV1().StatefulSets("tenant")

	// The policies are loaded, and the RoleBindings have reached the
	// authorizer, once a pod with a podvol ephemeral volume is refused to
	// carol and admitted for dave (dry runs: nothing is written).
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}},
		Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
			VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: claimTemplate("", ptr.To("podvol"), nil).Spec}}}}}}}
	began := time.Now()
	err := eventually(time.Minute, func() error {
		if _, err := u.claims.kc.CoreV1().Pods("tenant").Create(bg, pod, dryRun); err != nil {
			return err
		}
		_, err := u.noClaims.kc.CoreV1().Pods("tenant").Create(bg, pod, dryRun)
		if err == nil {
			return fmt.Errorf("carol's pod was admitted")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after %v: the policies or the RBAC never took effect: %v", time.Since(began).Round(time.Second), err)
	}
	t.Logf("policies and RBAC in effect after %v", time.Since(began).Round(100*time.Millisecond))
	_, err = u.noClaims.kc.CoreV1().Pods("tenant").Create(bg, pod, dryRun)
	refusedByRights(t, u.noClaims, "pod with a podvol ephemeral volume", err, "ephemeral volume scratch", "carol may not create PersistentVolumeClaims in namespace tenant")

	const noRights = "carol may not create PersistentVolumeClaims in namespace tenant"
	for _, c := range []struct {
		what      string
		templates []corev1.PersistentVolumeClaim
		// refused names the template refused, "" for admitted.
		refused string
	}{
		{"a podvol class", []corev1.PersistentVolumeClaim{claimTemplate("data", ptr.To("podvol"), nil)}, "data"},
		{"a podvol class added by an admin (found by provisioner)", []corev1.PersistentVolumeClaim{claimTemplate("data", ptr.To("local-fast"), nil)}, "data"},
		{"a podvol class by the beta annotation, which wins over storageClassName",
			[]corev1.PersistentVolumeClaim{claimTemplate("data", ptr.To("network"), map[string]string{corev1.BetaStorageClassAnnotation: "podvol"})}, "data"},
		{"another driver's class, then a podvol one",
			[]corev1.PersistentVolumeClaim{claimTemplate("logs", ptr.To("network"), nil), claimTemplate("wal", ptr.To("podvol"), nil)}, "wal"},
		{"another driver's class", []corev1.PersistentVolumeClaim{claimTemplate("data", ptr.To("network"), nil)}, ""},
		{"no class, and the default class is not podvol's", []corev1.PersistentVolumeClaim{claimTemplate("data", nil, nil)}, ""},
		{"no template", nil, ""},
	} {
		_, err := sts.Create(bg, statefulSet("db", c.templates...), dryRun)
		what := "StatefulSet with " + c.what
		if c.refused == "" {
			allowed(t, u.noClaims, what, err)
			continue
		}
		refusedByRights(t, u.noClaims, what, err, "StatefulSet volumeClaimTemplates entry "+c.refused, "asks for a podvol StorageClass", noRights)
		_, err = u.claims.kc.AppsV1().StatefulSets("tenant").Create(bg, statefulSet("db", c.templates...), dryRun)
		allowed(t, u.claims, what, err)
	}

	// An update of a StatefulSet with a podvol template (an admin's): its
	// new replicas would get new PVCs.
	if _, err := e.admin.kc.AppsV1().StatefulSets("tenant").Create(bg, statefulSet("pg", claimTemplate("data", ptr.To("podvol"), nil)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scale := func(id *identity, name string) error {
		s, err := id.kc.AppsV1().StatefulSets("tenant").Get(bg, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Replicas = ptr.To(*s.Spec.Replicas + 1)
		_, err = id.kc.AppsV1().StatefulSets("tenant").Update(bg, s, metav1.UpdateOptions{})
		return err
	}
	refusedByRights(t, u.noClaims, "update of a StatefulSet with a podvol template", scale(u.noClaims, "pg"), "StatefulSet volumeClaimTemplates entry data", noRights)
	allowed(t, u.claims, "update of a StatefulSet with a podvol template", scale(u.claims, "pg"))

	// An update that adds a podvol template. Kubernetes holds
	// volumeClaimTemplates immutable (so far): either refusal will do.
	if _, err := e.admin.kc.AppsV1().StatefulSets("tenant").Create(bg, statefulSet("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web, err := sts.Get(bg, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claimTemplate("data", ptr.To("podvol"), nil)}
	_, err = sts.Update(bg, web, metav1.UpdateOptions{})
	switch {
	case apierrors.IsInvalid(err) && strings.Contains(err.Error(), "spec.volumeClaimTemplates"):
		t.Logf("carol: update adding a podvol template: refused by the API server's validation: %v", err)
	default:
		refusedByRights(t, u.noClaims, "update adding a podvol template", err, "StatefulSet volumeClaimTemplates entry data", noRights)
	}

	// podvol's class made the default: a template that names no class is
	// podvol's.
	def, err := e.admin.kc.StorageV1().StorageClasses().Get(bg, "podvol", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	def.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
	if _, err := e.admin.kc.StorageV1().StorageClasses().Update(bg, def, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.params(t, map[string]string{admissionparams.DefaultIsPodvol: "true"})
	noClass := statefulSet("db", claimTemplate("data", nil, nil))
	// The policies read their parameters through an informer.
	_ = eventually(30*time.Second, func() error {
		if _, err := sts.Create(bg, noClass, dryRun); err == nil {
			return fmt.Errorf("admitted")
		}
		return nil
	})
	_, err = sts.Create(bg, noClass, dryRun)
	refusedByRights(t, u.noClaims, "StatefulSet with no class while podvol's is the default", err, "StatefulSet volumeClaimTemplates entry data", "or none: the default class is podvol's", noRights)
	_, err = u.claims.kc.AppsV1().StatefulSets("tenant").Create(bg, noClass, dryRun)
	allowed(t, u.claims, "StatefulSet with no class while podvol's is the default", err)

	e.typeChecked(t, policies)
}

// directPolicy is the admission policy that holds microVM-assigned volumes
// to ReadWriteOncePod.
const directPolicy = "podvol-direct-assign-rwop"

// refusedByDirect checks that the direct-assign policy refused the request,
// with a message naming each of want.
func refusedByDirect(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: want refused by %s, it was allowed", what, directPolicy)
	case !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+directPolicy+"'"):
		t.Errorf("%s: want refused by %s, got: %v", what, directPolicy, err)
	default:
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: refusal does not say %q: %v", what, w, err)
			}
		}
		t.Logf("%s: refused: %v", what, err)
	}
}

// TestDirectClassTemplates: a claim template (a StatefulSet's
// volumeClaimTemplates, a generic ephemeral volume of a pod or of a
// workload's pod template) of a class that hands volumes to microVMs must
// ask for ReadWriteOncePod, as a PVC of that class must, and is refused when
// the template is written, not when its PVC is made later by a controller
// (a StatefulSet whose pods then wait for ever with the reason in the
// StatefulSet's events).
func TestDirectClassTemplates(t *testing.T) {
	e := start(t)
	for name, params := range map[string]map[string]string{"podvol": nil, "vm-disks": {names.ParamDirectAssign: "always"}} {
		if _, err := e.admin.kc.StorageV1().StorageClasses().Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Provisioner: names.Driver, Parameters: params, VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kc := e.admin.kc
	rwo := claimTemplate("disk", ptr.To("vm-disks"), nil)
	rwop := claimTemplate("disk", ptr.To("vm-disks"), nil)
	rwop.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	// A claim made before the policy (an upgrade from a podvol without
	// it): its updates that change neither class nor modes go on.
	legacy := rwo.DeepCopy()
	legacy.Name = "legacy"
	_, err := kc.CoreV1().PersistentVolumeClaims("tenant").Create(bg, legacy, metav1.CreateOptions{})
	must(t, err)
	policies := apply(t, e.ac, manifest(t, "PODVOL_ADMISSION_POLICY", "admission-policy.yaml"))
	e.admissionParams(t)
	e.params(t, map[string]string{admissionparams.DirectClasses: "vm-disks"})

	// The policy is loaded once a PVC of the class without RWOP is refused.
	pvc := rwo.DeepCopy()
	err = eventually(time.Minute, func() error {
		_, err := kc.CoreV1().PersistentVolumeClaims("tenant").Create(bg, pvc, dryRun)
		if err == nil {
			return fmt.Errorf("a ReadWriteOnce PVC of vm-disks was admitted")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the policy never took effect: %v", err)
	}
	_, err = kc.CoreV1().PersistentVolumeClaims("tenant").Create(bg, pvc, dryRun)
	refusedByDirect(t, "PVC", err, "StorageClass vm-disks hands volumes to microVMs", "ReadWriteOncePod")

	// Issue 41: a claim made with no class and given one later (the API
	// server lets any user set a nil storageClassName once, as the PV
	// controller does for a default class) was never checked.
	claims := kc.CoreV1().PersistentVolumeClaims("tenant")
	for _, c := range []struct {
		name string
		tmpl corev1.PersistentVolumeClaim
	}{{"classless", rwo}, {"classless-rwop", rwop}} {
		pvc := c.tmpl.DeepCopy()
		pvc.Name, pvc.Spec.StorageClassName = c.name, nil
		_, err := claims.Create(bg, pvc, metav1.CreateOptions{})
		must(t, err)
	}
	setClass := func(name string) error {
		pvc, err := claims.Get(bg, name, metav1.GetOptions{})
		must(t, err)
		pvc.Spec.StorageClassName = ptr.To("vm-disks")
		_, err = claims.Update(bg, pvc, metav1.UpdateOptions{})
		return err
	}
	refusedByDirect(t, "a ReadWriteOnce PVC given class vm-disks later", setClass("classless"),
		"StorageClass vm-disks hands volumes to microVMs", "ReadWriteOncePod")
	allowed(t, e.admin, "a ReadWriteOncePod PVC given class vm-disks later", setClass("classless-rwop"))
	old, err := claims.Get(bg, "legacy", metav1.GetOptions{})
	must(t, err)
	old.Labels = map[string]string{"app": "vm"}
	_, err = claims.Update(bg, old, metav1.UpdateOptions{})
	allowed(t, e.admin, "label a ReadWriteOnce PVC of vm-disks made before the policy", err)

	sts := kc.AppsV1().StatefulSets("tenant")
	_, err = sts.Create(bg, statefulSet("vm", rwo), dryRun)
	refusedByDirect(t, "StatefulSet with a ReadWriteOnce template of vm-disks", err,
		"volumeClaimTemplates entry disk", "asks for a StorageClass that hands volumes to microVMs (vm-disks)", "ReadWriteOncePod")
	_, err = sts.Create(bg, statefulSet("vm", rwop), dryRun)
	allowed(t, e.admin, "StatefulSet with a ReadWriteOncePod template of vm-disks", err)
	_, err = sts.Create(bg, statefulSet("db", claimTemplate("data", ptr.To("podvol"), nil)), dryRun)
	allowed(t, e.admin, "StatefulSet with a ReadWriteOnce template of podvol", err)

	ephemeral := func(tmpl corev1.PersistentVolumeClaim) corev1.PodSpec {
		return corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: tmpl.Spec}}}}}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: ephemeral(rwo)}
	_, err = kc.CoreV1().Pods("tenant").Create(bg, pod, dryRun)
	refusedByDirect(t, "pod with a ReadWriteOnce ephemeral volume of vm-disks", err, "ephemeral volume scratch", "microVMs (vm-disks)", "ReadWriteOncePod")
	pod.Spec = ephemeral(rwop)
	_, err = kc.CoreV1().Pods("tenant").Create(bg, pod, dryRun)
	allowed(t, e.admin, "pod with a ReadWriteOncePod ephemeral volume of vm-disks", err)

	labels := map[string]string{"app": "d"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: ephemeral(rwo)}}}
	_, err = kc.AppsV1().Deployments("tenant").Create(bg, dep, dryRun)
	refusedByDirect(t, "Deployment with a ReadWriteOnce ephemeral volume of vm-disks", err, "ephemeral volume scratch", "microVMs (vm-disks)", "ReadWriteOncePod")

	e.typeChecked(t, policies)
}

// TestScaleYieldsOnlyWhatQuotaAllows: the claim-rights policy guards who
// defines podvol claims (a template's class, size and modes), not how many
// replicas a defined template serves. A user who may only scale a
// StatefulSet (its scale subresource: what `kubectl scale`, an HPA or an
// autoscaler uses) cannot change a template, so every PVC the StatefulSet
// controller then makes is one its creator, who had the right to create
// PVCs, defined; and ResourceQuota, which the API server applies to the
// controller's PVCs as to anyone's, bounds how many (issue 25, review:
// statefulsets/scale). The scale subresource's request carries a Scale,
// not the templates, so a policy there could not tell podvol's workloads
// from others anyway.
func TestScaleYieldsOnlyWhatQuotaAllows(t *testing.T) {
	e := start(t, "statefulset-controller", "resourcequota-controller")
	kc := e.admin.kc
	if _, err := kc.StorageV1().StorageClasses().Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"},
		Provisioner: names.Driver, VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apply(t, e.ac, manifest(t, "PODVOL_ADMISSION_POLICY", "admission-policy.yaml"))
	e.admissionParams(t)
	e.params(t, map[string]string{admissionparams.Classes: "podvol"})

	// erin may read StatefulSets and scale them, nothing else.
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets/scale"}, Verbs: []string{"get", "update", "patch"}},
	}
	if _, err := kc.RbacV1().Roles("tenant").Create(bg, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "erin"}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.RbacV1().RoleBindings("tenant").Create(bg, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "erin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "erin"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(e.api.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "erin", Groups: []string{"system:authenticated"}}
	erin := newIdentity(t, "erin", cfg)

	// The namespace's quota of podvol claims: two.
	const quotaKey = "podvol.storageclass.storage.k8s.io/persistentvolumeclaims"
	if _, err := kc.CoreV1().ResourceQuotas("tenant").Create(bg, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "podvol"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{quotaKey: resource.MustParse("2")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(time.Minute, func() error {
		q, err := kc.CoreV1().ResourceQuotas("tenant").Get(bg, "podvol", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := q.Status.Hard[quotaKey]; !ok {
			return fmt.Errorf("quota not yet counted")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// An admin's StatefulSet with a podvol template; Parallel, since no
	// pod here ever becomes ready.
	pg := statefulSet("pg", claimTemplate("data", ptr.To("podvol"), nil))
	pg.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
	if _, err := kc.AppsV1().StatefulSets("tenant").Create(bg, pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claims := func() []string {
		l, err := kc.CoreV1().PersistentVolumeClaims("tenant").List(bg, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range l.Items {
			out = append(out, c.Name+" ("+ptr.Deref(c.Spec.StorageClassName, "")+", "+c.Spec.Resources.Requests.Storage().String()+")")
		}
		return out
	}
	if err := eventually(time.Minute, func() error {
		if n := len(claims()); n != 1 {
			return fmt.Errorf("%d claims", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("the StatefulSet controller never made the first replica's claim: %v", err)
	}

	// erin cannot change what the StatefulSet claims...
	s, err := erin.kc.AppsV1().StatefulSets("tenant").Get(bg, "pg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Replicas = ptr.To[int32](5)
	_, err = erin.kc.AppsV1().StatefulSets("tenant").Update(bg, s, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) || refusedByPolicy(err) {
		t.Fatalf("erin: update of the StatefulSet: want forbidden by RBAC, got %v", err)
	}
	// ...only how many replicas it has.
	if err := eventually(30*time.Second, func() error {
		sc, err := erin.kc.AppsV1().StatefulSets("tenant").GetScale(bg, "pg", metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Spec.Replicas = 5
		_, err = erin.kc.AppsV1().StatefulSets("tenant").UpdateScale(bg, "pg", sc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return err
		}
		if err != nil {
			t.Fatalf("erin: scale to 5: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("erin: scale to 5: %v", err)
	}
	// The controller makes the claims the quota allows, of the admin's
	// template, and no more.
	if err := eventually(time.Minute, func() error {
		if n := len(claims()); n != 2 {
			return fmt.Errorf("%d claims", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("after the scale to 5: %v: %v", err, claims())
	}
	time.Sleep(5 * time.Second)
	got := claims()
	if len(got) != 2 {
		t.Fatalf("scaled to 5 under a quota of 2 podvol claims: %v", got)
	}
	for _, c := range got {
		if !strings.HasSuffix(c, "(podvol, 1Gi)") {
			t.Errorf("claim %s is not of the admin's template (podvol, 1Gi)", c)
		}
	}
	t.Logf("erin scaled pg to 5; its podvol claims, held to the quota of 2: %v", got)
}
