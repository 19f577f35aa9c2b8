package directvolume

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podvol/podvol/internal/names"
)

// Decider tells, for directAssign=auto, whether a pod runs in a sandbox that
// takes direct-assigned volumes: its RuntimeClass carries the annotation.
type Decider struct {
	Client kubernetes.Interface
	// TTL bounds how long a RuntimeClass's answer is reused.
	TTL time.Duration

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	direct  bool
	expires time.Time
}

// Direct looks the pod up, then its RuntimeClass. Any failure is an error:
// guessing would either hand a microVM a host mount or a runc pod a device
// it cannot mount.
func (d *Decider) Direct(ctx context.Context, namespace, name string) (bool, error) {
	if name == "" || namespace == "" {
		return false, fmt.Errorf("directAssign=auto needs the pod's name and namespace in the volume context: set podInfoOnMount: true in the CSIDriver")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := d.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("directAssign=auto: cannot read pod %s/%s to decide between a host mount and a direct assignment (check --kubeconfig and the plugin's RBAC): %w", namespace, name, err)
	}
	rc := pod.Spec.RuntimeClassName
	if rc == nil || *rc == "" {
		return false, nil
	}
	d.mu.Lock()
	c, ok := d.cache[*rc]
	d.mu.Unlock()
	if ok && time.Now().Before(c.expires) {
		return c.direct, nil
	}
	obj, err := d.Client.NodeV1().RuntimeClasses().Get(ctx, *rc, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("directAssign=auto: cannot read RuntimeClass %s of pod %s/%s: %w", *rc, namespace, name, err)
	}
	direct := obj.Annotations[names.DirectAssignAnnotation] == "true"
	d.mu.Lock()
	if d.cache == nil {
		d.cache = map[string]cached{}
	}
	d.cache[*rc] = cached{direct: direct, expires: time.Now().Add(d.TTL)}
	d.mu.Unlock()
	return direct, nil
}
