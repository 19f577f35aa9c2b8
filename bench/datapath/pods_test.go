package datapath

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/names"
)

func TestPodManifestsPutEachCellOnTheNode(t *testing.T) {
	c := DefaultConfig
	for _, cell := range PodCells {
		m, err := PodManifest(cell, "ns", "node-1", "xfs", "/var/tmp/hp", c)
		if err != nil {
			t.Fatalf("%s: %v", cell.Name, err)
		}
		docs := strings.Split(m, "\n---\n")
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), &pod); err != nil {
			t.Fatalf("%s: the pod does not parse: %v\n%s", cell.Name, err, m)
		}
		if pod.Namespace != "ns" || pod.Spec.NodeSelector["kubernetes.io/hostname"] != "node-1" || pod.Spec.Containers[0].Image != FioImage {
			t.Errorf("%s: %+v", cell.Name, pod)
		}
		if len(pod.Spec.Volumes) != 1 || pod.Spec.Containers[0].VolumeMounts[0].MountPath != podMount {
			t.Fatalf("%s: volumes %+v", cell.Name, pod.Spec.Volumes)
		}
		vs := pod.Spec.Volumes[0].VolumeSource
		want := map[string]bool{"emptyDir": vs.EmptyDir != nil, "hostPath": vs.HostPath != nil && vs.HostPath.Path == "/var/tmp/hp",
			"pvc": vs.PersistentVolumeClaim != nil, "ephemeral": vs.Ephemeral != nil && *vs.Ephemeral.VolumeClaimTemplate.Spec.StorageClassName == "podvol-xfs",
			"inline": vs.CSI != nil && vs.CSI.Driver == names.Driver && vs.CSI.VolumeAttributes["fsType"] == "xfs" && vs.CSI.VolumeAttributes["size"] == "2560Mi"}
		if !want[cell.Name] {
			t.Errorf("%s: volume %+v", cell.Name, vs)
		}
		if cell.Name == "pvc" {
			var pvc corev1.PersistentVolumeClaim
			if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), &pvc) != nil || *pvc.Spec.StorageClassName != "podvol-xfs" || pvc.Spec.Resources.Requests.Storage().String() != "2560Mi" {
				t.Errorf("pvc: the claim %q", docs[0])
			}
		}
	}
	if _, err := PodManifest(PodCell{Name: "nfs"}, "ns", "n", "xfs", "/x", c); err == nil {
		t.Error("an unknown cell got a manifest")
	}
	if _, err := PodManifest(PodCells[1], "ns", "n", "xfs", "relative", c); err == nil {
		t.Error("a relative hostPath accepted")
	}
	if _, err := PodManifest(PodCells[2], "ns", "n", "btrfs", "/x", c); err == nil {
		t.Error("a filesystem without a StorageClass accepted")
	}
}

// The scripts go through kubectl exec's sh -c: each argument must reach
// fio as it was, whatever it holds.
func TestPodScriptsQuoteForTheShell(t *testing.T) {
	for _, s := range []string{"plain", "--name=x", "a b", "it's", `"$HOME"`, "`id`", "a;b", ""} {
		out, err := exec.Command("sh", "-c", "printf '%s' "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("%q came through sh as %q (%v)", s, out, err)
		}
	}
	script, err := PodJobScript(DefaultConfig, Jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(script, "fio --name=randread --filename=/data/fio.dat ") || !strings.Contains(script, "--direct=1") || !strings.HasSuffix(script, "cat "+fioOutput) {
		t.Errorf("job script %q", script)
	}
	if s, _ := PodJobScript(DefaultConfig, job(t, "fdatasync")); !strings.Contains(s, "--filename=/data/etcd.dat") {
		t.Errorf("etcd's script %q", s)
	}
	if _, err := PodJobScript(DefaultConfig, job(t, "residency")); err == nil {
		t.Error("residency got an fio script")
	}
	if s := PodWriteScript(DefaultConfig); !strings.Contains(s, "count=1024 conv=fsync") {
		t.Errorf("write script %q", s)
	}
}

func TestNewImages(t *testing.T) {
	got := NewImages([]string{"/p/a.img", "/p/b.img"}, []string{"/p/a.img", "/p/c.img", "/p/b.img"})
	if !slices.Equal(got, []string{"/p/c.img"}) {
		t.Errorf("got %v", got)
	}
}
