// Package mobility moves volumes' data between nodes on the plugin's side:
// the Importer pulls a restore's data from the node that holds its snapshot
// (the target's half), Images and ClaimAuthorizer serve pulls to other nodes
// (the source's half), over internal/transfer with the certificates of
// internal/transfercert.
package mobility

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/topology"
	"github.com/podvol/podvol/internal/transfer"
)

// Resolver finds the transfer address (host:port) of a node.
type Resolver interface {
	Address(ctx context.Context, node string) (string, error)
}

// NodeAddresses resolves a node to its InternalIP (else ExternalIP) and
// Port, the port every node's plugin serves transfers on.
type NodeAddresses struct {
	Client kubernetes.Interface
	Port   int
}

func (r NodeAddresses) Address(ctx context.Context, node string) (string, error) {
	n, err := r.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("node %s, which holds the source, is not in the cluster: %w (%w)", node, errNodeGone, errkind.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("node %s's address: %w", node, err)
	}
	for _, want := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type == want && a.Address != "" {
				return net.JoinHostPort(a.Address, strconv.Itoa(r.Port)), nil
			}
		}
	}
	return "", fmt.Errorf("node %s reports no InternalIP or ExternalIP address", node)
}

// Importer pulls the data of Importing volumes, one pull per volume, in the
// background of the plugin (Start), retrying what may pass and giving up a
// volume whose pull is refused for good.
type Importer struct {
	Credentials transfer.Credentials
	Resolver    Resolver
	// Claims, if not nil, is asked once a copy is complete whether its
	// claim is still there; a claim deleted during the copy gives the
	// volume up instead of leaving it ready for no one. VolumeNode reads
	// the claims and PVs of a clone from it.
	Claims kubernetes.Interface
	// Driver is podvol's name, which a cloned PV must carry.
	Driver string
	// RetryMin and RetryMax bound the pause between attempts (5 s, 1 min).
	RetryMin, RetryMax time.Duration
	// SyncEvery: transfer.DefaultSyncEvery if 0.
	SyncEvery int64
	// IdleTimeout: a pull whose source sends nothing for this long fails
	// and is retried; transfer.DefaultIdleTimeout if 0.
	IdleTimeout time.Duration
	// MaxPulls bounds the pulls this node runs at once (each holds a few
	// chunks, 8 MiB, while it streams); the others wait their turn. 0: no
	// bound.
	MaxPulls int
	// Warnings, if not nil, tells the claims of a pull what their users
	// must act on (the two nodes' plugins of different versions).
	Warnings *Warnings
	// InUsePoll is how often a migration's target asks whether the
	// source's volume is free for the last of its data (3 s if 0).
	InUsePoll time.Duration

	pulled, done, givenUp atomic.Int64

	mu     sync.Mutex
	ctx    context.Context
	jobs   map[string]*job  // by volume id
	failed map[string]error // by volume name
	slots  chan struct{}    // MaxPulls of them, made at the first pull
}

type job struct {
	kind, source, node string
	started            time.Time
	progress           transfer.Progress
	attempts           int
	last               error
	// waiting: a migration's pre-copy is done, the source's volume still
	// in use (why, from the source).
	waiting error
	// copied: bytes pulled in earlier rounds of a migration.
	copied int64
	// warned: the last warning posted on the claims.
	warned string
	// queued: waiting for one of the node's MaxPulls; busy: the source
	// answered that it serves as many pulls as it may (when to retry).
	queued int
	busy   error
	retry  time.Time
	// noPreCopy: the claim was told no first copy comes (PreCopied False).
	noPreCopy bool
}

// Start gives the Importer the context its pulls run in (the plugin's) and
// resumes the pulls the pools record as unfinished.
func (im *Importer) Start(ctx context.Context, pools []*pool.Pool) {
	im.mu.Lock()
	im.ctx = ctx
	im.mu.Unlock()
	for _, p := range pools {
		vols, err := p.Importing()
		if err != nil {
			klog.ErrorS(err, "Cannot list the volumes being pulled", "pool", p.Name())
			continue
		}
		for _, v := range vols {
			klog.InfoS("Resuming a pull", "volume", v.ID, "name", v.Name, "sourceNode", v.Source.Node, "source", v.Source.ID, "verified", v.Import.Verified)
			im.Ensure(p, v)
		}
	}
}

// Ensure starts v's pull unless it runs, and says how far it has got: the
// message of the ABORTED answer the provisioner records on the claim.
func (im *Importer) Ensure(p *pool.Pool, v *store.Volume) string {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.jobs == nil {
		im.jobs = map[string]*job{}
	}
	j, ok := im.jobs[v.ID]
	if !ok {
		j = &job{kind: v.Source.Kind, source: v.Source.ID, node: v.Source.Node, started: time.Now()}
		im.jobs[v.ID] = j
		ctx := im.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		go im.run(ctx, p, v, j)
	}
	return j.status()
}

// status is what a user reads on the claim.
func (j *job) status() string {
	pr := j.progress
	msg := fmt.Sprintf("copying %s %s from node %s", j.kind, j.source, j.node)
	if pr.Checked < pr.Resumed {
		msg += fmt.Sprintf(": checking what earlier attempts copied against the source, %s of %s", humanBytes(pr.Checked), humanBytes(pr.Resumed))
	} else if pr.Total > 0 {
		msg += fmt.Sprintf(": %s of %s", humanBytes(pr.Done), humanBytes(pr.Total))
		if r := pr.Rate(); r > 0 {
			msg += fmt.Sprintf(", %s/s, about %s left", humanBytes(int64(r)), pr.Remaining().Round(time.Second))
		}
	} else if j.waiting == nil {
		msg += ": starting"
	}
	msg += fmt.Sprintf(" (for %s)", time.Since(j.started).Round(time.Second))
	switch {
	case j.waiting != nil && j.copied > 0:
		msg += fmt.Sprintf("; a first copy (%s) is done, the rest follows once no pod uses the source volume on node %s", humanBytes(j.copied), j.node)
	case j.waiting != nil:
		// Nothing could be copied while a pod uses the source (a raw
		// block volume on a pool without reflink, or no room there for
		// a snapshot): its node says why.
		msg += fmt.Sprintf("; nothing is copied while a pod uses the source volume on node %s: %v", j.node, j.waiting)
	}
	if j.queued > 0 {
		msg += fmt.Sprintf("; waiting for one of the %d pulls this node runs at once to finish", j.queued)
	}
	if j.busy != nil {
		msg += fmt.Sprintf("; the source node is busy (it serves as many pulls as it may at once), trying again later, in %s: %v",
			time.Until(j.retry).Round(time.Second), j.busy)
	}
	if j.last != nil {
		msg += fmt.Sprintf("; attempt %d failed, retrying: %v", j.attempts, j.last)
	}
	return msg
}

// slot waits for one of the MaxPulls (none: no bound) and returns its
// release; nil if ctx ended first.
func (im *Importer) slot(ctx context.Context, j *job) func() {
	if im.MaxPulls <= 0 {
		return func() {}
	}
	im.mu.Lock()
	if im.slots == nil {
		im.slots = make(chan struct{}, im.MaxPulls)
	}
	slots := im.slots
	im.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }
	default:
	}
	im.mu.Lock()
	j.queued = im.MaxPulls
	im.mu.Unlock()
	defer func() {
		im.mu.Lock()
		j.queued = 0
		im.mu.Unlock()
	}()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }
	case <-ctx.Done():
		return nil
	}
}

// Failed returns, once, why the pull for the volume named name was given
// up.
func (im *Importer) Failed(name string) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	err := im.failed[name]
	delete(im.failed, name)
	return err
}

func (im *Importer) run(ctx context.Context, p *pool.Pool, v *store.Volume, j *job) {
	log := klog.FromContext(ctx).WithValues("volume", v.ID, "name", v.Name, "sourceNode", v.Source.Node, "source", v.Source.ID)
	retry := im.RetryMin
	if retry <= 0 {
		retry = 5 * time.Second
	}
	retryMax := im.RetryMax
	if retryMax <= 0 {
		retryMax = time.Minute
	}
	defer func() {
		im.mu.Lock()
		delete(im.jobs, v.ID)
		im.mu.Unlock()
	}()
	for {
		release := im.slot(ctx, j)
		if release == nil {
			return // the plugin stops: resumed at the next start
		}
		res, err := im.pull(ctx, p, v.ID, j)
		release()
		if errors.Is(err, errNotImporting) {
			// Made ready by an earlier job (this one was started by a
			// CreateVolume that read the record just before), or deleted.
			return
		}
		if err == nil && res.More {
			// A migration's pre-copy: the volume is still in use on its
			// node. What changes until it is not comes next.
			if err = p.RecordImport(v.ID, "", res.Identity, res.Size, 0); err == nil {
				im.mu.Lock()
				j.copied += res.Sent
				copied := j.copied
				im.mu.Unlock()
				log.Info("Pulled a first copy of a volume in use; the rest follows once it is not", "bytes", res.Sent, "duration", res.Duration.Round(time.Millisecond))
				// podvol-controller lets the pod be evicted once it reads
				// this (its PodDisruptionBudget goes).
				im.tellClaim(ctx, v, corev1.PersistentVolumeClaimCondition{Type: names.PreCopied, Status: corev1.ConditionTrue, Reason: "Verified",
					Message: fmt.Sprintf("a first copy (%s) of volume %s, as it was%s, is on this claim's node; the rest follows once no pod uses the source volume on node %s",
						humanBytes(copied), v.Source.ID, at(res.Identity), v.Source.Node)})
				continue
			}
		}
		if errors.Is(err, errkind.ErrInUse) {
			// The source's volume is still used by a pod: not a failure.
			im.mu.Lock()
			j.waiting, j.last = err, nil
			tell := !j.noPreCopy && j.copied == 0
			j.noPreCopy = true
			im.mu.Unlock()
			if tell {
				if rec, rerr := p.Store().Volume(v.ID); rerr == nil && rec.Import != nil && rec.Import.Base == "" {
					// No first copy while the pod runs (no room for its
					// snapshot, no reflink): podvol-controller lets the
					// pod be evicted at once rather than wait for one.
					im.tellClaim(ctx, v, corev1.PersistentVolumeClaimCondition{Type: names.PreCopied, Status: corev1.ConditionFalse,
						Reason: "NotTaken", Message: "no first copy is taken while the pod runs: " + err.Error()})
				}
			}
			poll := im.InUsePoll
			if poll <= 0 {
				poll = inUsePoll
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(poll):
			}
			continue
		}
		if errors.Is(err, transfer.ErrBusy) {
			// The source serves as many pulls as it may: not a failure
			// (not counted, not a warning), but said on the claim.
			im.mu.Lock()
			j.busy, j.last, j.retry = err, nil, time.Now().Add(retry)
			im.mu.Unlock()
			log.Info("The source node is busy; trying again later", "err", err, "retryIn", retry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(retry*2, retryMax)
			continue
		}
		im.mu.Lock()
		j.busy = nil
		im.mu.Unlock()
		if err == nil {
			// The claim was checked when the pull began, which may have
			// been long ago: a claim deleted meanwhile would leave a ready
			// volume no one asks for.
			if err = im.claimStands(ctx, v); err == nil {
				if _, err = p.FinishImport(ctx, v.ID); err == nil {
					im.done.Add(1)
					took := time.Since(j.started).Round(time.Millisecond)
					moved := j.copied + res.Sent
					if moved == 0 && res.Resumed == res.Size {
						moved = res.Size // complete before a restart
					}
					log.Info("Pulled a volume's data", "duration", took, "bytes", moved, "changesSince", res.Base)
					im.tellClaim(ctx, v, dataCopied("Verified", fmt.Sprintf("%s of %s %s pulled from node %s in %s and verified",
						humanBytes(moved), v.Source.Kind, v.Source.ID, v.Source.Node, took)))
					return
				}
			}
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, errkind.ErrInUse) {
			if why := im.sourceLost(ctx, v, err); why != "" {
				kept, kerr := im.keepCopy(ctx, p, v, why)
				if kept {
					im.done.Add(1)
					return
				}
				if kerr != nil {
					err = kerr // retried: the copy is kept meanwhile
				} else {
					err = fmt.Errorf("%s, and this node holds no copy of it that is one instant: %w", why, errSourceLost)
				}
			}
		}
		if ctx.Err() != nil {
			// The plugin stops: the record stays Importing and the next
			// start resumes it.
			return
		}
		if final(err) {
			log.Error(err, "Giving up a pull: the volume is deleted; the provisioner's next attempt starts again")
			// Recorded before the volume goes: a CreateVolume in between
			// would start a new pull, and then read this one's error.
			im.mu.Lock()
			if im.failed == nil {
				im.failed = map[string]error{}
			}
			im.failed[v.Name] = fmt.Errorf("copying %s %s from node %s: %w", v.Source.Kind, v.Source.ID, v.Source.Node, err)
			im.mu.Unlock()
			if errors.Is(err, errSourceLost) {
				// podvol-controller cancels a migration whose copy says so.
				im.tellClaim(ctx, v, corev1.PersistentVolumeClaimCondition{Type: names.DataCopied, Status: corev1.ConditionFalse,
					Reason: names.ReasonSourceLost, Message: err.Error()})
			}
			// Counted before the volume goes, which is what a waiter sees.
			im.givenUp.Add(1)
			if aerr := p.AbandonImport(v.ID); aerr != nil && !errors.Is(aerr, errkind.ErrNotFound) {
				log.Error(aerr, "Cannot delete the volume of an abandoned pull")
			}
			return
		}
		im.mu.Lock()
		j.attempts++
		j.last = err
		im.mu.Unlock()
		log.Info("A pull failed; retrying", "err", err, "attempt", j.attempts, "retryIn", retry)
		if errors.Is(err, transfer.ErrVersion) && j.warned != err.Error() {
			// Not final: an upgrade of the plugins lets the retry pass.
			// The user must act, so the claims say it, once.
			j.warned = err.Error()
			imp := v.Import
			im.Warnings.Warn(ctx, transfer.Claim{Namespace: imp.ClaimNamespace, Name: imp.ClaimName, UID: imp.ClaimUID}, ReasonVersionMismatch,
				fmt.Sprintf("copying %s %s from node %s: %v", v.Source.Kind, v.Source.ID, v.Source.Node, err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(retry*2, retryMax)
	}
}

// VolumeNode returns the node of volume id, which the claim imp names
// clones: the node of its data source's PV, whose handle must be id.
func (im *Importer) VolumeNode(ctx context.Context, imp *store.Import, id string) (string, error) {
	if im.Claims == nil {
		return "", fmt.Errorf("volume %s is not on this node, and this plugin has no API access to find it: %w", id, errkind.ErrNotFound)
	}
	pvc, err := im.Claims.CoreV1().PersistentVolumeClaims(imp.ClaimNamespace).Get(ctx, imp.ClaimName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("claim %s/%s does not exist: %w", imp.ClaimNamespace, imp.ClaimName, errkind.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("read claim %s/%s: %w", imp.ClaimNamespace, imp.ClaimName, err)
	case string(pvc.UID) != imp.ClaimUID:
		return "", fmt.Errorf("claim %s/%s is another claim now (UID %s, not %s): %w", imp.ClaimNamespace, imp.ClaimName, pvc.UID, imp.ClaimUID, errkind.ErrNotFound)
	}
	pv, err := ClonedPV(ctx, im.Claims, im.Driver, pvc)
	if err != nil {
		return "", err
	}
	if pv.Spec.CSI.VolumeHandle != id {
		return "", fmt.Errorf("claim %s/%s clones volume %s, not %s: %w", imp.ClaimNamespace, imp.ClaimName, pv.Spec.CSI.VolumeHandle, id, errkind.ErrNotFound)
	}
	node := topology.Node(pv)
	if node == "" {
		return "", fmt.Errorf("PV %s of volume %s names no node in its node affinity: %w", pv.Name, id, errkind.ErrNotFound)
	}
	return node, nil
}

// final: retrying cannot help (refused, the source or the claim gone, the
// data not fit for the volume, the pool's filesystem full).
func final(err error) bool {
	return errors.Is(err, errkind.ErrDenied) || errors.Is(err, errkind.ErrNotFound) ||
		errors.Is(err, errkind.ErrInvalid) || errors.Is(err, errkind.ErrOutOfRange) || errors.Is(err, errkind.ErrConflict) ||
		errors.Is(err, errkind.ErrNoSpace)
}

// errNotImporting: the volume is no longer importing (ready, or gone).
var errNotImporting = errors.New("not importing")

// errNodeGone: the source's Node is not in the cluster (NodeAddresses).
var errNodeGone = errors.New("node gone")

// errSourceLost: the source is lost for good and the copy holds no
// instant of it; final (it wraps errkind.ErrNotFound).
var errSourceLost = fmt.Errorf("source lost: %w", errkind.ErrNotFound)

// sourceLost says why the node v's data comes from is lost for good, ""
// if it is not known to be: its Node is gone from the cluster, or, for a
// volume, podvol-controller's node-loss marked the source's PV
// (names.MigrationSourceLost) once the node's kubelet stayed away. A
// source that only does not answer may come back: the pull goes on.
func (im *Importer) sourceLost(ctx context.Context, v *store.Volume, err error) string {
	if errors.Is(err, errNodeGone) {
		return fmt.Sprintf("node %s is no longer in the cluster", v.Source.Node)
	}
	if final(err) || v.Source.Kind != store.FromVolume || im.Claims == nil || v.Import == nil {
		return ""
	}
	pvc, gerr := im.Claims.CoreV1().PersistentVolumeClaims(v.Import.ClaimNamespace).Get(ctx, v.Import.ClaimName, metav1.GetOptions{})
	if gerr != nil || string(pvc.UID) != v.Import.ClaimUID {
		return ""
	}
	pv, gerr := ClonedPV(ctx, im.Claims, im.Driver, pvc)
	if gerr != nil || pv.Spec.CSI.VolumeHandle != v.Source.ID {
		return ""
	}
	if at := pv.Annotations[names.MigrationSourceLost]; at != "" {
		return fmt.Sprintf("node %s is lost (its kubelet stayed away after its Node was deleted; podvol's node-loss judged so at %s)", v.Source.Node, at)
	}
	return ""
}

// keepCopy makes v ready from what it holds once its source is lost, if
// that is one instant: a migration's pre-copy (the record says the copy is
// its Base), or a pull complete and verified. The claim's DataCopied says
// which instant (reason names.ReasonPreCopyOnly for a pre-copy). false
// and no error: nothing to keep (a copy half pulled, or half changed
// towards the last data, is no instant); an error: the copy is kept, and
// asked about again.
func (im *Importer) keepCopy(ctx context.Context, p *pool.Pool, v *store.Volume, why string) (bool, error) {
	rec, err := p.Store().Volume(v.ID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.State == store.Ready {
		return true, nil
	}
	if rec.State != store.Importing || rec.Import == nil {
		return false, nil
	}
	imp := *rec.Import
	preCopy := imp.Identity == "" && imp.Base != ""
	if !preCopy && (imp.Identity == "" || imp.Size == 0 || imp.Verified != imp.Size) {
		return false, nil
	}
	if preCopy {
		// The copy is that image, whole and verified when it was pulled.
		if err := p.RecordImport(v.ID, imp.Base, "", imp.Size, imp.Size); err != nil {
			return false, err
		}
	}
	if err := im.claimStands(ctx, rec); err != nil {
		if errors.Is(err, errkind.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	if _, err := p.FinishImport(ctx, v.ID); err != nil {
		if final(err) {
			return false, nil
		}
		return false, err
	}
	reason, msg := "Verified", fmt.Sprintf("volume %s pulled from node %s and verified; then %s", v.Source.ID, v.Source.Node, why)
	if preCopy {
		reason = names.ReasonPreCopyOnly
		msg = fmt.Sprintf("%s before the last of volume %s's data was copied: this copy holds the volume as it was%s (its first copy, taken while its pod ran); what was written after that was lost with the node",
			why, v.Source.ID, at(imp.Base))
	}
	klog.FromContext(ctx).Info("The source of a pull is lost: its copy here is kept", "volume", v.ID, "name", v.Name, "sourceNode", v.Source.Node, "preCopyOnly", preCopy, "why", why)
	im.tellClaim(ctx, v, dataCopied(reason, msg))
	return true, nil
}

// at is " at <time>" for an image identity that says when the image was
// made (open's and move's: "<id>@<ns>", "<id>@moving-<ns>"), else "".
func at(identity string) string {
	_, after, ok := strings.Cut(identity, "@")
	if !ok {
		return ""
	}
	ns, err := strconv.ParseInt(strings.TrimPrefix(after, "moving-"), 10, 64)
	if err != nil || ns <= 0 {
		return ""
	}
	return " at " + time.Unix(0, ns).UTC().Format(time.RFC3339)
}

// claimStands says whether the claim a volume is pulled for is still
// there, unbound (errkind.ErrNotFound if not). Without Claims, yes.
func (im *Importer) claimStands(ctx context.Context, v *store.Volume) error {
	if im.Claims == nil {
		return nil
	}
	imp := v.Import
	pvc, err := im.Claims.CoreV1().PersistentVolumeClaims(imp.ClaimNamespace).Get(ctx, imp.ClaimName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("claim %s/%s was deleted during the copy: %w", imp.ClaimNamespace, imp.ClaimName, errkind.ErrNotFound)
	case err != nil:
		return fmt.Errorf("read claim %s/%s: %w", imp.ClaimNamespace, imp.ClaimName, err)
	case string(pvc.UID) != imp.ClaimUID || pvc.DeletionTimestamp != nil:
		return fmt.Errorf("claim %s/%s was deleted during the copy (UID %s now, %s before): %w", imp.ClaimNamespace, imp.ClaimName, pvc.UID, imp.ClaimUID, errkind.ErrNotFound)
	}
	return nil
}

// tellClaim sets a condition of the claim v is pulled for: DataCopied once
// its volume is ready (which wakes its provisioner), PreCopied once a
// migration's first copy is in. Only a hint, so a failure is logged and not
// retried: the provisioner's own retry still comes, and podvol-controller
// lets the pod go once its wait for the pre-copy ends.
func (im *Importer) tellClaim(ctx context.Context, v *store.Volume, c corev1.PersistentVolumeClaimCondition) {
	if im.Claims == nil {
		return
	}
	imp := v.Import
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // the job ends only when this does
	defer cancel()
	patch, err := ConditionPatch(imp.ClaimUID, c)
	if err == nil {
		_, err = im.Claims.CoreV1().PersistentVolumeClaims(imp.ClaimNamespace).Patch(ctx, imp.ClaimName,
			types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	}
	if err != nil {
		klog.FromContext(ctx).Info("Cannot set the claim's condition",
			"claim", imp.ClaimNamespace+"/"+imp.ClaimName, "condition", c.Type, "err", err)
	}
}

func dataCopied(reason, message string) corev1.PersistentVolumeClaimCondition {
	return corev1.PersistentVolumeClaimCondition{Type: names.DataCopied, Status: corev1.ConditionTrue, Reason: reason, Message: message}
}

// DataCopiedPatch is the strategic merge patch of a claim's status that
// sets its DataCopied condition, for the claim of that UID only (not one
// made again under its name).
func DataCopiedPatch(claimUID, message string) ([]byte, error) {
	return ConditionPatch(claimUID, dataCopied("Verified", message))
}

// ConditionPatch is the strategic merge patch of a claim's status that
// sets condition c (now), for the claim of that UID only.
func ConditionPatch(claimUID string, c corev1.PersistentVolumeClaimCondition) ([]byte, error) {
	c.LastTransitionTime = metav1.Now()
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": claimUID},
		"status":   map[string]any{"conditions": []corev1.PersistentVolumeClaimCondition{c}},
	})
}

func (im *Importer) pull(ctx context.Context, p *pool.Pool, id string, j *job) (transfer.Result, error) {
	f, v, err := p.ImportImage(id)
	if errors.Is(err, errkind.ErrConflict) || errors.Is(err, errkind.ErrNotFound) {
		return transfer.Result{}, fmt.Errorf("volume %s: %w (%w)", id, errNotImporting, err)
	}
	if err != nil {
		return transfer.Result{}, err
	}
	defer f.Close()
	imp := v.Import
	if imp.Identity != "" && imp.Size > 0 && imp.Verified == imp.Size {
		// Complete and verified (a pull whose source has more to come
		// is recorded as held, never so): what is left is local, and a
		// copy that the last step grew already is not pulled again.
		if err := f.Truncate(imp.Size); err != nil {
			return transfer.Result{}, fmt.Errorf("the copy of volume %s back to the %d bytes verified: %w", id, imp.Size, err)
		}
		return transfer.Result{Checkpoint: transfer.Checkpoint{Identity: imp.Identity, Size: imp.Size, Verified: imp.Size, Base: imp.Base}, Resumed: imp.Size}, nil
	}
	addr, err := im.Resolver.Address(ctx, v.Source.Node)
	if err != nil {
		return transfer.Result{}, err
	}
	im.mu.Lock()
	j.progress = transfer.Progress{} // each attempt counts from where it resumes
	im.mu.Unlock()
	pl := &transfer.Pull{
		Client:  transfer.Client(im.Credentials, v.Source.Node),
		Address: addr, Source: v.Source.ID,
		Claim:  transfer.Claim{Namespace: imp.ClaimNamespace, Name: imp.ClaimName, UID: imp.ClaimUID},
		Dst:    f,
		Resume: transfer.Checkpoint{Identity: imp.Identity, Size: imp.Size, Verified: imp.Verified, Base: imp.Base},
		Checkpoint: func(cp transfer.Checkpoint) error {
			return p.RecordImport(id, cp.Identity, cp.Base, cp.Size, cp.Verified)
		},
		Progress: func(pr transfer.Progress) {
			im.mu.Lock()
			// A resumed or restarted pull counts from 0 again.
			if d := pr.Done - j.progress.Done; d > 0 {
				im.pulled.Add(d)
			}
			j.progress = pr
			j.waiting, j.busy = nil, nil
			im.mu.Unlock()
		},
		SyncEvery: im.SyncEvery,
		// The source is another node: what it announces, it does not
		// decide how much of this pool the copy takes.
		MaxSize:     v.SizeBytes,
		IdleTimeout: im.IdleTimeout,
	}
	res, err := pl.Run(ctx)
	return res, outOfSpace(p, err)
}

// outOfSpace makes a pull that found the pool's filesystem full a final
// error: the pool admitted the volume, so its filesystem holds less than
// the pool promised (shared with other files, or a capacity forced above
// it), and a retry would only fill it again.
func outOfSpace(p *pool.Pool, err error) error {
	if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
		return err
	}
	return fmt.Errorf("the filesystem of pool %s (%s) is full, although the pool admitted the volume: something besides the pool's volumes fills it, or its capacity was forced above what it can give (--force-capacity); make room on it or lower the pool's capacity: %w: %w",
		p.Name(), p.Dir(), errkind.ErrNoSpace, err)
}

// inUsePoll is how often a migration's target asks whether the source's
// volume is free for the last of its data.
const inUsePoll = 3 * time.Second

// humanBytes is n for a person: MiB below a GiB, GiB above.
func humanBytes(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Stats are the pulls' counters, for metrics.
func (im *Importer) Stats() (pulled int64, inProgress int, done, givenUp int64) {
	im.mu.Lock()
	inProgress = len(im.jobs)
	im.mu.Unlock()
	return im.pulled.Load(), inProgress, im.done.Load(), im.givenUp.Load()
}
