// Package directauto tests directAssign=auto against a real kube-apiserver:
// the plugin reads each pod's RuntimeClass to choose between a host mount and
// a direct assignment.
package directauto

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/test/kubetest"
	"github.com/podvol/podvol/test/plugintest"
)

func TestAutoDecidesByRuntimeClass(t *testing.T) {
	plugintest.RequireRoot(t)
	api := kubetest.Start(t)
	kc := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for name, ann := range map[string]map[string]string{
		"kata": {names.DirectAssignAnnotation: "true"},
		"runc": nil,
	} {
		_, err := kc.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Handler: name}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	for pod, rc := range map[string]*string{"in-vm": ptr.To("kata"), "in-runc": ptr.To("runc"), "no-class": nil} {
		_, err := kc.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod},
			Spec:       corev1.PodSpec{RuntimeClassName: rc, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	dir := plugintest.TempDir(t)
	kata := filepath.Join(dir, "direct-volumes")
	p := plugintest.Start(t, plugintest.Options{Dir: dir, Args: []string{"--kubeconfig", api.Kubeconfig, "--kata-direct-volumes-dir", kata}})
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
	publish := func(pod string) (target string, err error) {
		v, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: pod, VolumeCapabilities: []*csi.VolumeCapability{c},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, Parameters: map[string]string{"directAssign": "auto"}})
		if err != nil {
			t.Fatal(err)
		}
		id := v.GetVolume().GetVolumeId()
		staging, target := filepath.Join(dir, "staging-"+pod), filepath.Join(dir, "target-"+pod)
		if _, err := p.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = p.Node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			_, _ = p.Node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		})
		_, err = p.Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c,
			VolumeContext: map[string]string{"csi.storage.k8s.io/pod.name": pod, "csi.storage.k8s.io/pod.namespace": "default"}})
		return target, err
	}
	mounted := func(path string) bool {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Contains(string(b), " "+path+" ")
	}
	assigned := func(target string) bool {
		_, err := os.Stat(filepath.Join(kata, base64.URLEncoding.EncodeToString([]byte(target)), "mountInfo.json"))
		return err == nil
	}

	target, err := publish("in-vm")
	if err != nil || mounted(target) || !assigned(target) {
		t.Fatalf("pod with an annotated RuntimeClass: err=%v mounted=%v assigned=%v, want a direct assignment", err, mounted(target), assigned(target))
	}
	for _, pod := range []string{"in-runc", "no-class"} {
		target, err := publish(pod)
		if err != nil || !mounted(target) || assigned(target) {
			t.Fatalf("pod %s: err=%v mounted=%v assigned=%v, want a host mount", pod, err, mounted(target), assigned(target))
		}
	}
	_, err = publish("missing")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cannot read pod default/missing") {
		t.Fatalf("pod that does not exist: %v", err)
	}
}
