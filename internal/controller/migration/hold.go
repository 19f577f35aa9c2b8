package migration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/topology"
)

// Holds keeps a drain from outrunning a migration. kubectl drain (and the
// autoscalers) evict a node's pods through the Eviction API and wait for
// them to be gone; nothing else of a drain waits for a volume's data. So:
//
//   - every running pod that uses a claim opted in carries the finalizer
//     names.MigrationFinalizer. It is there before any drain: no finalizer
//     can be added to a pod once it is being deleted, and kubectl drain
//     evicts milliseconds after its cordon, before a migration could start.
//     A pod being deleted keeps it while a migration of its volume off its
//     node is copying (or about to start: its node cordoned, a target to
//     go to), and loses it at once otherwise. The kubelet stops a deleted
//     pod's containers and unstages its volume whatever its finalizers, so
//     the last copy proceeds while the pod object, and the drain, wait;
//   - while a migration's first copy (pulled while the pod runs) is not in
//     yet, a PodDisruptionBudget of the pod's own (maxUnavailable 0,
//     selecting the pod by names.MigrationLabel, owned by the pod) makes
//     evictions wait for it (HTTP 429: kubectl drain retries every 5 s),
//     so that the pod is down only for what changed since. At most
//     PreCopyWait; never when the pod has a budget of its own (the Eviction
//     API refuses a pod two budgets select).
type Holds struct {
	Client   client.Client
	Recorder events.EventRecorder
	Driver   string
	// PreCopyWait bounds how long evictions wait for a pre-copy, from the
	// migration's start (15 min if 0); the pod's deletion still waits for
	// the whole copy.
	PreCopyWait time.Duration
	// Poll is how often a held pod is looked at again (5 s if 0): the
	// copy's claim, whose conditions end the holds, is not watched.
	Poll time.Duration

	mu   sync.Mutex
	told map[types.NamespacedName]*toldPod // events sent once per pod
}

type toldPod struct {
	uid     types.UID
	reasons map[string]bool
}

// DefaultPreCopyWait is Holds.PreCopyWait's default.
const DefaultPreCopyWait = 15 * time.Minute

func (h *Holds) preCopyWait() time.Duration {
	if h.PreCopyWait > 0 {
		return h.PreCopyWait
	}
	return DefaultPreCopyWait
}

func (h *Holds) poll() time.Duration {
	if h.Poll > 0 {
		return h.Poll
	}
	return 5 * time.Second
}

// SetupWithManager watches pods, and the PVs whose migration holds them.
func (h *Holds) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("migration-holds").
		For(&corev1.Pod{}).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(h.podsOfPV)).
		Complete(h)
}

// podsOfPV are the pods that use the claim a PV is bound to.
func (h *Holds) podsOfPV(ctx context.Context, o client.Object) []reconcile.Request {
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != h.Driver {
		return nil
	}
	pods := &corev1.PodList{}
	if err := h.Client.List(ctx, pods, client.InNamespace(pv.Spec.ClaimRef.Namespace)); err != nil {
		log.FromContext(ctx).Error(err, "List pods for a PV's change", "pv", pv.Name)
		return nil
	}
	var reqs []reconcile.Request
	for i := range pods.Items {
		if slices.Contains(claimsOf(&pods.Items[i]), pv.Spec.ClaimRef.Name) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return reqs
}

// claimsOf are the claims a pod names in its persistentVolumeClaim volumes
// (a generic ephemeral volume's claim goes with its pod: never migrated).
func claimsOf(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return out
}

// PDBName is the name of the PodDisruptionBudget that holds the eviction
// of the pod of that UID for a migration's pre-copy.
func PDBName(pod types.UID) string { return "podvol-move-" + string(pod) }

// held is one volume of a pod that a migration off its node copies.
type held struct {
	pvc *corev1.PersistentVolumeClaim
	pv  *corev1.PersistentVolume
	// started: the migration's start (zero: not started yet).
	started time.Time
}

// Reconcile sets one pod's finalizer, label and budget as its claims'
// migrations ask.
func (h *Holds) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pod := &corev1.Pod{}
	if err := h.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			h.mu.Lock()
			delete(h.told, req.NamespacedName)
			h.mu.Unlock()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	armed, holding, err := h.volumes(ctx, pod)
	if err != nil {
		return reconcile.Result{}, err
	}
	var res reconcile.Result
	if len(holding) > 0 {
		res.RequeueAfter = h.poll()
	}
	if err := h.syncBudget(ctx, pod, holding); err != nil {
		return res, err
	}
	has := controllerutil.ContainsFinalizer(pod, names.MigrationFinalizer)
	switch {
	case pod.DeletionTimestamp == nil:
		want := armed && pod.Spec.NodeName != ""
		if want != has {
			if err := h.patch(ctx, pod, finalizerPatch(want)); err != nil {
				return res, fmt.Errorf("%s finalizer %s of pod %s/%s: %w", map[bool]string{true: "add", false: "remove"}[want], names.MigrationFinalizer, pod.Namespace, pod.Name, err)
			}
		}
	case has && len(holding) == 0:
		if err := h.patch(ctx, pod, finalizerPatch(false)); err != nil {
			return res, fmt.Errorf("remove finalizer %s of pod %s/%s: %w", names.MigrationFinalizer, pod.Namespace, pod.Name, err)
		}
		log.FromContext(ctx).Info("Pod no longer held: no migration of its volumes waits for it", "pod", req.String())
	case has:
		if h.once(pod, "held") {
			m := holding[0]
			h.Recorder.Eventf(pod, m.pvc, corev1.EventTypeNormal, "MigrationHoldsPod", "Hold",
				"this pod's deletion waits until the data of claim %s is copied to node %s (finalizer %s): a drain of node %s returns once it is",
				m.pvc.Name, m.pv.Annotations[names.MigrationTarget], names.MigrationFinalizer, pod.Spec.NodeName)
		}
	}
	return res, nil
}

// volumes reads the pod's claims: armed if any is bound to a podvol volume
// and opted in; holding, those whose migration off the pod's node is
// copying (its source not lost), or about to start (the node cordoned, a
// target to go to) for a pod being deleted.
func (h *Holds) volumes(ctx context.Context, pod *corev1.Pod) (bool, []held, error) {
	r := &Reconciler{Client: h.Client, Driver: h.Driver}
	armed := false
	var holding []held
	for _, name := range claimsOf(pod) {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := h.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, pvc); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return false, nil, err
		}
		if pvc.DeletionTimestamp != nil || pvc.Spec.VolumeName == "" {
			continue
		}
		pv := &corev1.PersistentVolume{}
		if err := h.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return false, nil, err
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != h.Driver || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
			continue
		}
		ok, err := r.optedIn(ctx, pvc, pv)
		if err != nil {
			return false, nil, err
		}
		if !ok {
			continue
		}
		armed = true
		if pod.Spec.NodeName == "" || topology.Node(pv) != pod.Spec.NodeName {
			continue
		}
		switch pv.Annotations[names.MigrationPhase] {
		case names.MigrationCopying:
			if pv.Annotations[names.MigrationSourceLost] != "" {
				continue // nothing more comes from a lost node
			}
			started, _ := time.Parse(time.RFC3339, pv.Annotations[names.MigrationStarted])
			holding = append(holding, held{pvc: pvc, pv: pv, started: started})
		case "":
			if pod.DeletionTimestamp == nil {
				continue
			}
			node := &corev1.Node{}
			if err := h.Client.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, node); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return false, nil, err
			}
			if !draining(node) {
				continue
			}
			// The drain evicted the pod before the migration started
			// (it cordons and evicts at once): held if it will start.
			target, _, err := r.pickTarget(ctx, pv, pvc)
			if err != nil {
				return false, nil, err
			}
			if target != "" {
				pv := pv.DeepCopy()
				if pv.Annotations == nil {
					pv.Annotations = map[string]string{}
				}
				pv.Annotations[names.MigrationTarget] = target
				holding = append(holding, held{pvc: pvc, pv: pv})
			}
		}
	}
	return armed, holding, nil
}

// syncBudget gives the pod a PodDisruptionBudget while a migration of its
// volumes waits for its pre-copy (and the pod runs, has no budget of its
// own, and the wait is not over), and takes it away otherwise.
func (h *Holds) syncBudget(ctx context.Context, pod *corev1.Pod, holding []held) error {
	want := false
	var waitFor *held
	if pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		for i := range holding {
			m := &holding[i]
			if m.started.IsZero() {
				continue
			}
			done, err := h.preCopied(ctx, m)
			if err != nil {
				return err
			}
			if done {
				continue
			}
			if time.Since(m.started) > h.preCopyWait() {
				if h.once(pod, "slow/"+string(m.pvc.UID)) {
					h.Recorder.Eventf(m.pvc, pod, corev1.EventTypeWarning, "MigrationPreCopySlow", "Hold",
						"the first copy of this claim's volume to node %s is not done after %s: evictions of pod %s no longer wait for it; its deletion still waits until the whole volume is copied (the pod is down meanwhile)",
						m.pv.Annotations[names.MigrationTarget], h.preCopyWait(), pod.Name)
				}
				continue
			}
			want, waitFor = true, m
			break
		}
	}
	if want {
		foreign, err := h.foreignBudget(ctx, pod)
		if err != nil {
			return err
		}
		if foreign != "" {
			if h.once(pod, "foreign") {
				h.Recorder.Eventf(waitFor.pvc, pod, corev1.EventTypeNormal, "MigrationEvictionNotHeld", "Hold",
					"pod %s has a PodDisruptionBudget of its own (%s), and the Eviction API refuses a pod that two budgets select: podvol adds none, so the pod may be evicted before the first copy of this claim's volume to node %s is done; its deletion still waits until the whole volume is copied",
					pod.Name, foreign, waitFor.pv.Annotations[names.MigrationTarget])
			}
			want = false
		}
	}
	pdb := &policyv1.PodDisruptionBudget{}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: PDBName(pod.UID)}
	err := h.Client.Get(ctx, key, pdb)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	exists := err == nil
	if !want {
		if exists && pdb.Labels[managedBy] == controllerName {
			if err := h.Client.Delete(ctx, pdb, client.Preconditions{UID: &pdb.UID}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete PodDisruptionBudget %s: %w", key, err)
			}
			log.FromContext(ctx).Info("Evictions of a migrating pod no longer wait", "pod", client.ObjectKeyFromObject(pod))
		}
		if _, ok := pod.Labels[names.MigrationLabel]; ok && pod.DeletionTimestamp == nil {
			return h.patch(ctx, pod, labelPatch(""))
		}
		return nil
	}
	if pod.Labels[names.MigrationLabel] != string(pod.UID) {
		if err := h.patch(ctx, pod, labelPatch(string(pod.UID))); err != nil {
			return fmt.Errorf("label pod %s/%s for its PodDisruptionBudget: %w", pod.Namespace, pod.Name, err)
		}
	}
	if exists {
		return nil
	}
	zero := intstr.FromInt32(0)
	pdb = &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: key.Name,
			Labels:          map[string]string{managedBy: controllerName},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: &zero,
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{names.MigrationLabel: string(pod.UID)}},
		},
	}
	if err := h.Client.Create(ctx, pdb); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create PodDisruptionBudget %s: %w", key, err)
	}
	h.Recorder.Eventf(pod, waitFor.pvc, corev1.EventTypeNormal, "MigrationHoldsEviction", "Hold",
		"evictions of this pod wait for the first copy of claim %s to node %s (PodDisruptionBudget %s, for at most %s from the migration's start), so that it is down only while what changed since is copied",
		waitFor.pvc.Name, waitFor.pv.Annotations[names.MigrationTarget], key.Name, h.preCopyWait())
	return nil
}

// preCopied: the wait for the first copy is over: the copy's claim says it
// is in, or that none comes (PreCopied, True or False), or that the whole
// is (DataCopied, or bound).
func (h *Holds) preCopied(ctx context.Context, m *held) (bool, error) {
	clone := &corev1.PersistentVolumeClaim{}
	err := h.Client.Get(ctx, types.NamespacedName{Namespace: m.pvc.Namespace, Name: CloneName(m.pvc.UID)}, clone)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if clone.Spec.VolumeName != "" {
		return true, nil
	}
	for _, c := range clone.Status.Conditions {
		if c.Type == names.PreCopied || c.Type == names.DataCopied && c.Status == corev1.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
}

// foreignBudget names a PodDisruptionBudget not podvol's that selects the
// pod, "" if none.
func (h *Holds) foreignBudget(ctx context.Context, pod *corev1.Pod) (string, error) {
	pdbs := &policyv1.PodDisruptionBudgetList{}
	if err := h.Client.List(ctx, pdbs, client.InNamespace(pod.Namespace)); err != nil {
		return "", fmt.Errorf("list PodDisruptionBudgets of namespace %s: %w", pod.Namespace, err)
	}
	var found []string
	for _, p := range pdbs.Items {
		if p.Name == PDBName(pod.UID) || p.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			found = append(found, p.Name)
		}
	}
	sort.Strings(found)
	if len(found) == 0 {
		return "", nil
	}
	return found[0], nil
}

const (
	managedBy      = "app.kubernetes.io/managed-by"
	controllerName = "podvol-controller"
)

func (h *Holds) patch(ctx context.Context, pod *corev1.Pod, p client.Patch) error {
	if err := h.Client.Patch(ctx, pod, p); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// once is true the first time it is asked about a pod's reason.
func (h *Holds) once(pod *corev1.Pod, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.told == nil {
		h.told = map[types.NamespacedName]*toldPod{}
	}
	key := client.ObjectKeyFromObject(pod)
	t := h.told[key]
	if t == nil || t.uid != pod.UID {
		t = &toldPod{uid: pod.UID, reasons: map[string]bool{}}
		h.told[key] = t
	}
	if t.reasons[reason] {
		return false
	}
	t.reasons[reason] = true
	return true
}

// finalizerPatch adds or removes the finalizer alone: a strategic merge
// patch of metadata.finalizers (a set) carries no resourceVersion, so it
// neither conflicts with the kubelet's updates nor touches another
// finalizer.
func finalizerPatch(add bool) client.Patch {
	key := "$deleteFromPrimitiveList/finalizers"
	if add {
		key = "finalizers"
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{key: []string{names.MigrationFinalizer}}})
	return client.RawPatch(types.StrategicMergePatchType, b)
}

// labelPatch sets the pod's MigrationLabel to value, or removes it ("").
func labelPatch(value string) client.Patch {
	var v any
	if value != "" {
		v = value
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{names.MigrationLabel: v}}})
	return client.RawPatch(types.StrategicMergePatchType, b)
}

// ErrHoldsAdded is returned by RemoveHolds when a finalizer came back: a
// podvol-controller still runs migration.
var ErrHoldsAdded = errors.New("the finalizer was added again: podvol-controller still runs migration (scale deployment podvol-controller to 0 first)")

// RemoveHolds removes the migration's finalizer from every pod and deletes
// its PodDisruptionBudgets, for an uninstall: a drain no longer waits for a
// migration's copy. After settle it checks that nobody added the finalizer
// again and returns ErrHoldsAdded, naming the pods, if someone did. It
// returns the number of pods and budgets it let go.
func RemoveHolds(ctx context.Context, c client.Client, settle time.Duration) (int, error) {
	logger := log.FromContext(ctx)
	held := func() ([]corev1.Pod, error) {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods); err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return !controllerutil.ContainsFinalizer(&p, names.MigrationFinalizer) }), nil
	}
	pods, err := held()
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for i := range pods {
		p := &pods[i]
		if err := c.Patch(ctx, p, finalizerPatch(false)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove finalizer %s of pod %s/%s: %w", names.MigrationFinalizer, p.Namespace, p.Name, err))
			continue
		}
		n++
		logger.Info("Removed podvol's finalizer", "pod", client.ObjectKeyFromObject(p), "deleting", p.DeletionTimestamp != nil)
	}
	pdbs := &policyv1.PodDisruptionBudgetList{}
	if err := c.List(ctx, pdbs, client.MatchingLabels{managedBy: controllerName}); err != nil {
		errs = append(errs, fmt.Errorf("list PodDisruptionBudgets: %w", err))
	}
	for i := range pdbs.Items {
		p := &pdbs.Items[i]
		if p.Spec.Selector == nil || p.Spec.Selector.MatchLabels[names.MigrationLabel] == "" {
			continue
		}
		if err := c.Delete(ctx, p, client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete PodDisruptionBudget %s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		n++
		logger.Info("Deleted podvol's PodDisruptionBudget", "pdb", client.ObjectKeyFromObject(p))
	}
	if len(errs) > 0 {
		return n, errors.Join(errs...)
	}
	select {
	case <-ctx.Done():
		return n, ctx.Err()
	case <-time.After(settle):
	}
	again, err := held()
	if err != nil {
		return n, err
	}
	if len(again) > 0 {
		names := make([]string, 0, len(again))
		for _, p := range again {
			names = append(names, p.Namespace+"/"+p.Name)
		}
		sort.Strings(names)
		return n, fmt.Errorf("pods %v: %w", names, ErrHoldsAdded)
	}
	return n, nil
}
