package mobility

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/transfer"
)

type creds struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

func (c creds) Certificate() (*tls.Certificate, error) { return c.cert, nil }
func (c creds) Roots() (*x509.CertPool, error)         { return c.roots, nil }

// nodeCreds issues certificates for the nodes named, from one test CA.
func nodeCreds(t *testing.T, nodes ...string) map[string]creds {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	out := map[string]creds{}
	for i, n := range nodes {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: transfer.CommonName(n)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = creds{cert: &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, roots: roots}
	}
	return out
}

type staticResolver map[string]string

func (s staticResolver) Address(_ context.Context, node string) (string, error) {
	if a, ok := s[node]; ok {
		return a, nil
	}
	return "", fmt.Errorf("no node %s", node)
}

// authorizer answers err, marks requests Move if move, and keeps what it
// was asked.
type authorizer struct {
	err  error
	move bool
	mu   sync.Mutex
	seen []transfer.Request
}

func (a *authorizer) Authorize(_ context.Context, r *transfer.Request) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r.Move = a.move
	a.seen = append(a.seen, *r)
	return a.err
}

func openPool(t *testing.T) *pool.Pool {
	t.Helper()
	p, err := pool.Open(pool.Config{Dir: filepath.Join(t.TempDir(), "pool"), Capacity: 4 << 30, Device: devicetest.New()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// nodes is node-a (the source: a pool with a snapshot, serving it) and
// node-b (the target's pool and Importer).
type nodes struct {
	src, dst *pool.Pool
	vol      *store.Volume
	snap     *store.Snapshot
	data     []byte
	authz    *authorizer
	im       *Importer
	// inUse: the source volume is staged (for Move); noFirst: the source
	// takes no first copy of it then (no room, no reflink).
	inUse, noFirst atomic.Bool
	// cutRefused: the source volume cannot be cut while in use (for
	// Cut: a raw block volume on a pool without reflink, node.Quiesce).
	cutRefused atomic.Bool
	// oldTarget: node-b's requests reach node-a without their version,
	// as a plugin older than versions sends them.
	oldTarget atomic.Bool
	// warnings: node-a's (Server.Mismatch).
	warnings atomic.Pointer[Warnings]
	// freezes counts the source's volume quiesced for a cut.
	freezes atomic.Int64
	// front, if set, sees each request to node-a first; true: it
	// answered.
	front atomic.Pointer[func(http.ResponseWriter, *http.Request) bool]
}

// asNodeA is node-a's server: its Mismatch posts with n.warnings, and
// node-b's requests reach it as an old plugin's if n.oldTarget.
func (n *nodes) asNodeA(srv *transfer.Server) http.Handler {
	srv.Mismatch = func(ctx context.Context, r transfer.Request, err error) { n.warnings.Load().Mismatch(ctx, r, err) }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.oldTarget.Load() {
			r.Header.Del("Podvol-Transfer-Version")
		}
		if f := n.front.Load(); f != nil && (*f)(w, r) {
			return
		}
		srv.ServeHTTP(w, r)
	})
}

func setup(t *testing.T) *nodes {
	t.Helper()
	n := &nodes{src: openPool(t), dst: openPool(t), authz: &authorizer{}}
	v, err := n.src.CreateVolume(context.Background(), pool.CreateRequest{Name: "data", SizeBytes: 64 << 20, FsType: "ext4", Format: true})
	if err != nil {
		t.Fatal(err)
	}
	// Data past the filesystem's signature, as a pod would write it.
	n.data = make([]byte, 5<<20+123)
	if _, err := rand.Read(n.data); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(n.src.ImagePath(v.ID), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(n.data, 16<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	n.vol = v
	if n.snap, err = n.src.CreateSnapshot(pool.SnapshotRequest{Name: "snap", SourceID: v.ID}); err != nil {
		t.Fatal(err)
	}
	c := nodeCreds(t, "node-a", "node-b")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- transfer.Serve(ctx, lis, c["node-a"], n.asNodeA(&transfer.Server{
			Images: Images{Pool: func(name string) (*pool.Pool, bool) { return n.src, name == n.src.Name() },
				// The driver's CutForTransfer, less its locks, its freeze
				// counted.
				Cut: func(id string, c store.Claim) (*pool.Pool, *store.Snapshot, error) {
					s, err := n.src.CreateSnapshot(pool.SnapshotRequest{Name: pool.TransferSnapshotName(c.UID), SourceID: id, For: &c,
						Quiesce: func(id string) (func(), error) {
							if n.cutRefused.Load() {
								return nil, fmt.Errorf("volume %s is a raw block volume in use and this pool's filesystem has no reflink: %w", id, errkind.ErrInUse)
							}
							n.freezes.Add(1)
							return func() {}, nil
						}})
					return n.src, s, err
				},
				// The driver's CutForMove, with "staged" a flag.
				Move: func(id string, c store.Claim) (*pool.Pool, *store.Snapshot, *store.Volume, error) {
					if n.inUse.Load() && n.noFirst.Load() {
						return nil, nil, nil, fmt.Errorf("no first copy here: %w", errkind.ErrInUse)
					}
					if n.inUse.Load() {
						s, err := n.src.CreateSnapshot(pool.SnapshotRequest{Name: pool.TransferSnapshotName(c.UID), SourceID: id, For: &c})
						return n.src, s, nil, err
					}
					v, err := n.src.MarkMoving(id, c)
					if err != nil {
						return nil, nil, nil, err
					}
					s, err := n.src.Store().SnapshotByName(pool.TransferSnapshotName(c.UID))
					if err != nil {
						s = nil
					}
					return n.src, s, v, nil
				}},
			Authorizer: n.authz,
		}))
	}()
	n.im = &Importer{Credentials: c["node-b"], Resolver: staticResolver{"node-a": lis.Addr().String()}, RetryMin: 10 * time.Millisecond, SyncEvery: 1 << 20}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return n
}

func (n *nodes) restore(t *testing.T, name string, size int64, fs string) *store.Volume {
	t.Helper()
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: name, SizeBytes: size, FsType: fs,
		Source: &store.Source{Kind: store.FromSnapshot, ID: n.snap.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: name, ClaimUID: "uid-" + name}})
	if err != nil {
		t.Fatal(err)
	}
	if v.State != store.Importing {
		t.Fatalf("a restore from another node is %s, want importing", v.State)
	}
	return v
}

// wait calls Ensure, as the provisioner's retries do, until the volume is
// ready or gone.
func (n *nodes) wait(t *testing.T, v *store.Volume) (*store.Volume, []string) {
	t.Helper()
	return n.poll(t, v, true)
}

// poll waits for the volume to be ready or gone, calling Ensure if ensure.
func (n *nodes) poll(t *testing.T, v *store.Volume, ensure bool) (*store.Volume, []string) {
	t.Helper()
	var said []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got, err := n.dst.Store().Volume(v.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, said
		}
		if err != nil {
			t.Fatal(err)
		}
		if got.State == store.Ready {
			return got, said
		}
		if ensure {
			said = append(said, n.im.Ensure(n.dst, got))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("volume %s not ready after 30 s: %v", v.ID, said)
	return nil, nil
}

// A restore on node-b of node-a's snapshot pulls it: the image is the
// snapshot's, grown to the claim's size (filesystem grown at first stage),
// and its progress says what it copies.
func TestImportPullsTheSnapshot(t *testing.T) {
	n := setup(t)
	v := n.restore(t, "restored", 96<<20, "ext4")
	got, said := n.wait(t, v)
	if got == nil {
		t.Fatalf("the import was given up: %v (%v)", n.im.Failed("restored"), said)
	}
	if !got.GrowFs || got.Import != nil {
		t.Errorf("ready volume %+v: want its filesystem to grow and no import left", got)
	}
	if len(said) == 0 || !strings.Contains(said[0], "copying snapshot "+n.snap.ID+" from node node-a") {
		t.Errorf("progress %q", said)
	}
	img, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.SnapshotPath(n.snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	if len(img) != 96<<20 || !bytes.Equal(img[:len(src)], src) || !bytes.Equal(img[16<<20:16<<20+len(n.data)], n.data) {
		t.Fatalf("the restored image (%d bytes) is not the snapshot (%d bytes) grown", len(img), len(src))
	}
	pulled, inProgress, done, givenUp := n.im.Stats()
	if pulled < int64(len(n.data)) || pulled > int64(len(src)) || inProgress != 0 || done != 1 || givenUp != 0 {
		t.Errorf("stats: pulled %d (data %d, image %d), in progress %d, done %d, given up %d", pulled, len(n.data), len(src), inProgress, done, givenUp)
	}
}

// A pull the source refuses is given up: the volume and its image go, and
// the next CreateVolume is told why, once.
func TestImportRefusedIsGivenUp(t *testing.T) {
	n := setup(t)
	n.authz.err = fmt.Errorf("claim team-a/denied is to be provisioned on node-c: %w", errkind.ErrDenied)
	v := n.restore(t, "denied", 96<<20, "ext4")
	if got, _ := n.wait(t, v); got != nil {
		t.Fatalf("a refused import became ready: %+v", got)
	}
	if _, err := os.Stat(n.dst.ImagePath(v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the abandoned volume's image is left: %v", err)
	}
	err := n.im.Failed("denied")
	if !errors.Is(err, errkind.ErrDenied) || !strings.Contains(err.Error(), "node-c") {
		t.Errorf("Failed: %v, want the refusal", err)
	}
	if err := n.im.Failed("denied"); err != nil {
		t.Errorf("Failed a second time: %v, want nil", err)
	}
	if _, _, done, givenUp := n.im.Stats(); done != 0 || givenUp != 1 {
		t.Errorf("stats: done %d, given up %d; want 0 and 1", done, givenUp)
	}
}

// A snapshot of another filesystem than the class's is refused after the
// pull (the source does not say what it holds; the data does).
func TestImportOfAnotherFilesystemIsRefused(t *testing.T) {
	n := setup(t)
	v := n.restore(t, "xfs-claim", 400<<20, "xfs")
	if got, _ := n.wait(t, v); got != nil {
		t.Fatalf("an ext4 snapshot restored into an xfs volume: %+v", got)
	}
	if err := n.im.Failed("xfs-claim"); !errors.Is(err, errkind.ErrInvalid) || !strings.Contains(err.Error(), "holds ext4") {
		t.Errorf("Failed: %v", err)
	}
}

// The plugin restarted mid-pull: Start finds the Importing volume and
// resumes it from its checkpoint.
func TestImportResumesAtStart(t *testing.T) {
	n := setup(t)
	v := n.restore(t, "resumed", 96<<20, "ext4")
	// A checkpoint as a stopped pull leaves it: the first MiB verified.
	f, _, err := n.dst.ImportImage(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.SnapshotPath(n.snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(src))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(src[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	img, err := Images{Pool: func(string) (*pool.Pool, bool) { return n.src, true }}.Open(context.Background(), transfer.Request{Source: n.snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	img.File.Close()
	if err := n.dst.RecordImport(v.ID, img.Identity, "", img.Size, 1<<20); err != nil {
		t.Fatal(err)
	}
	n.im.Start(context.Background(), []*pool.Pool{n.dst})
	// No CreateVolume comes (the provisioner may be waiting out a backoff):
	// the pull goes on by itself.
	if got, said := n.poll(t, v, false); got == nil {
		t.Fatalf("not resumed: %v %v", n.im.Failed("resumed"), said)
	}
	out, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:len(src)], src) {
		t.Fatal("the resumed image is not the snapshot")
	}
}

// A claim deleted while its copy ran gives the volume up when the copy is
// done, rather than leaving a ready volume no one asks for; a claim still
// there (same UID) lets it become ready.
func TestImportChecksTheClaimBeforeReady(t *testing.T) {
	for _, c := range []struct {
		name  string
		objs  []runtime.Object
		ready bool
	}{
		{"gone", nil, false},
		{"replaced", []runtime.Object{&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "restored", UID: "another"}}}, false},
		{"there", []runtime.Object{&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "restored", UID: "uid-restored"}}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := setup(t)
			n.im.Claims = fake.NewClientset(c.objs...)
			v := n.restore(t, "restored", 96<<20, "ext4")
			got, said := n.wait(t, v)
			if (got != nil) != c.ready {
				t.Fatalf("ready %v, want %v (%v)", got != nil, c.ready, said)
			}
			err := n.im.Failed("restored")
			if c.ready != (err == nil) || (!c.ready && (!errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "deleted during the copy"))) {
				t.Errorf("Failed: %v", err)
			}
			// A ready volume's claim says so, which wakes its provisioner
			// (just after the volume is ready: looked at for 5 s).
			if c.ready {
				var conds []corev1.PersistentVolumeClaimCondition
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					pvc, err := n.im.Claims.CoreV1().PersistentVolumeClaims("team-a").Get(context.Background(), "restored", metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					conds = pvc.Status.Conditions
					i := slices.IndexFunc(conds, func(c corev1.PersistentVolumeClaimCondition) bool { return c.Type == names.DataCopied })
					if i >= 0 && conds[i].Status == corev1.ConditionTrue && strings.Contains(conds[i].Message, "pulled from node node-a") {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the claim's conditions 5 s after the copy: %+v", conds)
					}
				}
			}
		})
	}
}

// A CreateVolume that read the record as importing just before its pull
// finished starts a job on a ready volume: that job ends quietly, the
// volume stays ready and no failure is reported.
func TestEnsureAfterTheCopyIsQuiet(t *testing.T) {
	n := setup(t)
	v := n.restore(t, "restored", 96<<20, "ext4")
	if got, said := n.wait(t, v); got == nil {
		t.Fatalf("not ready: %v", said)
	}
	n.im.Ensure(n.dst, v) // v: the stale importing record
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, inProgress, _, _ := n.im.Stats(); inProgress == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the late job did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := n.im.Failed("restored"); err != nil {
		t.Errorf("a failure was reported for a ready volume: %v", err)
	}
	if got, err := n.dst.Store().Volume(v.ID); err != nil || got.State != store.Ready {
		t.Errorf("the volume after the late job: %+v, %v", got, err)
	}
	if _, _, done, givenUp := n.im.Stats(); done != 1 || givenUp != 0 {
		t.Errorf("done %d, given up %d; want 1 and 0", done, givenUp)
	}
}

// A clone on node-b of node-a's volume pulls a snapshot node-a cuts for
// the claim: the image is the volume's.
func TestImportPullsAVolume(t *testing.T) {
	n := setup(t)
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "clone", SizeBytes: 64 << 20, FsType: "ext4",
		Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "clone", ClaimUID: "uid-clone"}})
	if err != nil {
		t.Fatal(err)
	}
	got, said := n.wait(t, v)
	if got == nil {
		t.Fatalf("the import was given up: %v (%v)", n.im.Failed("clone"), said)
	}
	if len(said) == 0 || !strings.Contains(said[0], "copying volume "+n.vol.ID+" from node node-a") {
		t.Errorf("progress %q", said)
	}
	img, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.ImagePath(n.vol.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, src) {
		t.Fatalf("the clone's image (%d bytes) is not the volume's (%d bytes)", len(img), len(src))
	}
}

// A clone's source is cut (frozen, copied) once per claim: a pull for the
// claim after one was sent whole (a target that lost its copy, or a node
// that asks again) reads the same snapshot, which stays until the sweep
// finds the claim bound.
func TestCloneIsCutOncePerClaim(t *testing.T) {
	n := setup(t)
	var images [][]byte
	for _, name := range []string{"clone", "clone-again"} {
		v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: name, SizeBytes: 64 << 20, FsType: "ext4",
			Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
			Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "clone", ClaimUID: "uid-clone"}})
		if err != nil {
			t.Fatal(err)
		}
		if got, said := n.wait(t, v); got == nil {
			t.Fatalf("pull %s was given up: %v (%v)", name, n.im.Failed(name), said)
		}
		img, err := os.ReadFile(n.dst.ImagePath(v.ID))
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, img)
		// The source's volume changes between the pulls: a second cut
		// would hold it.
		f, err := os.OpenFile(n.src.ImagePath(n.vol.ID), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("written after the first pull"), 16<<20); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if got := n.freezes.Load(); got != 1 {
		t.Fatalf("the source's volume was cut (frozen and copied) %d times for one claim, want once", got)
	}
	if !bytes.Equal(images[0], images[1]) {
		t.Fatal("the second pull for the claim read another image than the first")
	}
	left, err := n.src.TransferSnapshots()
	if err != nil || len(left) != 1 {
		t.Fatalf("snapshots cut for the claim: %d (%v), want the one, kept for the claim until it is bound", len(left), err)
	}
	bound := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "clone", UID: "uid-clone"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-clone"}}
	if swept := (&Sweeper{Client: fake.NewClientset(bound), Pools: []*pool.Pool{n.src}}).Sweep(context.Background()); swept != 1 {
		t.Fatalf("the sweep deleted %d snapshots once the claim was bound, want its one", swept)
	}
}

// A clone of a volume that its node cannot cut while a pod uses it (a raw
// block volume on a pool without reflink: the copy would be torn) waits,
// not given up, its progress saying why; once no pod uses the volume, it
// is pulled whole.
func TestImportWaitsForASourceThatCannotBeCut(t *testing.T) {
	n := setup(t)
	n.cutRefused.Store(true)
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "clone", SizeBytes: 64 << 20, FsType: "ext4",
		Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "clone", ClaimUID: "uid-clone"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	said := ""
	for ; !strings.Contains(said, "nothing is copied while a pod uses the source volume on node node-a"); said = n.im.Ensure(n.dst, v) {
		if time.Now().After(deadline) {
			t.Fatalf("the pull never said it waits: %q", said)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(said, "raw block volume in use") || strings.Contains(said, "first copy") {
		t.Errorf("the progress %q does not say why nothing is copied, or claims a first copy", said)
	}
	if left, err := n.src.TransferSnapshots(); err != nil || len(left) != 0 {
		t.Fatalf("the refused cut left snapshots %+v (%v)", left, err)
	}
	n.cutRefused.Store(false)
	got, all := n.wait(t, v)
	if got == nil {
		t.Fatalf("the pull was given up: %v (%v)", n.im.Failed("clone"), all)
	}
	img, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.ImagePath(n.vol.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, src) {
		t.Fatal("the clone's image is not the volume's")
	}
}

// The sweep deletes the snapshots cut for claims that are bound, deleted or
// replaced, and keeps those of claims still waiting for their copy.
func TestSweeperDeletesWhatNoClaimNeeds(t *testing.T) {
	p := openPool(t)
	v, err := p.CreateVolume(context.Background(), pool.CreateRequest{Name: "data", SizeBytes: 16 << 20, FsType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(name, uid, volume string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(uid)},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
	}
	kc := fake.NewClientset(claim("waiting", "u-waiting", ""), claim("bound", "u-bound", "pv-x"), claim("replaced", "u-new", ""))
	cut := map[string]string{}
	for _, c := range []string{"waiting", "bound", "replaced", "deleted"} {
		uid := "u-" + c
		s, err := p.CreateSnapshot(pool.SnapshotRequest{Name: pool.TransferSnapshotName(uid), SourceID: v.ID, For: &store.Claim{Namespace: "team-a", Name: c, UID: uid}})
		if err != nil {
			t.Fatal(err)
		}
		cut[c] = s.ID
	}
	// A VolumeSnapshot's snapshot is never swept.
	own, err := p.CreateSnapshot(pool.SnapshotRequest{Name: "snapshot-1", SourceID: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	if n := (&Sweeper{Client: kc, Pools: []*pool.Pool{p}}).Sweep(context.Background()); n != 3 {
		t.Errorf("swept %d snapshots, want 3", n)
	}
	for c, id := range cut {
		_, err := p.ReadySnapshot(id)
		if kept := err == nil; kept != (c == "waiting") {
			t.Errorf("the snapshot cut for claim %s: kept %v (%v)", c, kept, err)
		}
	}
	if _, err := p.ReadySnapshot(own.ID); err != nil {
		t.Errorf("a VolumeSnapshot's snapshot was swept: %v", err)
	}
}

// A volume pulled for a claim deleted before any PV named it is deleted
// by the sweep, only after it has been seen so for the grace period; one
// whose claim is still there, or that a PV names, is kept, the latter
// for good (a PV kept by reclaim policy Retain and then deleted leaves its
// volume to the admin).
func TestSweeperDeletesVolumesPulledForNothing(t *testing.T) {
	n := setup(t)
	claim := func(name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name)}}
	}
	kc := fake.NewClientset(claim("gone"), claim("pending"), claim("retained"))
	n.im.Claims = kc
	pulled := map[string]*store.Volume{}
	for _, name := range []string{"gone", "pending", "retained"} {
		v, said := n.wait(t, n.restore(t, name, 64<<20, "ext4"))
		if v == nil {
			t.Fatalf("%s: not ready: %v", name, said)
		}
		if want := (store.Claim{Namespace: "team-a", Name: name, UID: "uid-" + name}); v.PulledFor == nil || *v.PulledFor != want {
			t.Fatalf("%s: the ready volume records it was pulled for %+v, want %+v", name, v.PulledFor, want)
		}
		pulled[name] = v
	}
	ctx := context.Background()
	for _, name := range []string{"gone", "retained"} {
		if err := kc.CoreV1().PersistentVolumeClaims("team-a").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "retained"},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
			Driver: names.Driver, VolumeHandle: pulled["retained"].ID}}}}
	if _, err := kc.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kept := func(when string, want map[string]bool) {
		t.Helper()
		for name, v := range pulled {
			_, err := n.dst.Store().Volume(v.ID)
			if errors.Is(err, store.ErrNotFound) == want[name] {
				t.Errorf("%s: volume %s of claim %s kept %v, want %v", when, v.ID, name, err == nil, want[name])
			}
		}
	}
	s := &Sweeper{Client: kc, Pools: []*pool.Pool{n.dst}, Grace: 50 * time.Millisecond}
	all := map[string]bool{"gone": true, "pending": true, "retained": true}
	s.Sweep(ctx)
	kept("first seen unclaimed", all)
	s.Sweep(ctx)
	kept("seen again within the grace period", all)
	if err := kc.CoreV1().PersistentVolumes().Delete(ctx, "retained", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	s.Sweep(ctx)
	kept("after the grace period", map[string]bool{"pending": true, "retained": true})
	if _, err := os.Stat(n.dst.ImagePath(pulled["gone"].ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted volume's image: %v", err)
	}
}

// A migration's pull copies the volume while it is in use, waits, saying
// so, until it is not, then pulls what changed since its first copy: the
// copy is the volume as it was last written; the source keeps the first
// snapshot for the sweep and the volume marked moving.
func TestImportMovesAVolumeInUse(t *testing.T) {
	n := setup(t)
	n.authz.move = true
	n.inUse.Store(true)
	n.im.InUsePoll = 20 * time.Millisecond
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "moved", SizeBytes: 64 << 20, FsType: "ext4",
		Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "moved", ClaimUID: "uid-moved"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for said := ""; !strings.Contains(said, "the rest follows once no pod uses the source volume on node node-a"); said = n.im.Ensure(n.dst, v) {
		if time.Now().After(deadline) {
			t.Fatalf("the first copy never said it waits: %q", said)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rec, err := n.dst.Store().Volume(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.Importing || rec.Import.Base == "" || rec.Import.Identity != "" {
		t.Fatalf("after the first copy the volume is %s with import %+v, want importing, holding the first copy", rec.State, rec.Import)
	}
	// The pod writes on, then lets go.
	later := make([]byte, 3<<20)
	if _, err := rand.Read(later); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(n.src.ImagePath(n.vol.ID), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(later, 40<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	n.inUse.Store(false)
	got, said := n.wait(t, v)
	if got == nil {
		t.Fatalf("the move was given up: %v (%v)", n.im.Failed("moved"), said)
	}
	img, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.ImagePath(n.vol.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, src) {
		t.Fatal("the moved image is not the volume as last written")
	}
	n.authz.mu.Lock()
	last := n.authz.seen[len(n.authz.seen)-1]
	n.authz.mu.Unlock()
	if last.Since != rec.Import.Base {
		t.Errorf("the last pull asked since %q, want the first copy %q", last.Since, rec.Import.Base)
	}
	left, err := n.src.TransferSnapshots()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 {
		t.Errorf("%d snapshots cut for the move left on the source, want the first one for the sweep (the last copy is of the volume)", len(left))
	}
	if v, err := n.src.Store().Volume(n.vol.ID); err != nil || v.Moving == nil || v.Moving.Claim.UID != "uid-moved" {
		t.Errorf("the source volume after its last data was taken: %+v, %v: want it marked moving for the claim", v, err)
	}
}

// A migration cancelled after its last copy took the volume (uncordoned,
// its copy's claim deleted) and started again makes a copy's claim of the
// same name and a new UID: the volume, still marked moving for the first,
// is handed to the new copy, which pulls it whole; the mark then names the
// new claim (it used to answer the new copy HTTP 500 for ever).
func TestImportMovesAVolumeAgainForANewCopy(t *testing.T) {
	n := setup(t)
	n.authz.move = true
	moveFor := func(uid string) *store.Volume {
		v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "moved-" + uid, SizeBytes: 64 << 20, FsType: "ext4",
			Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
			Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "podvol-move-x", ClaimUID: uid}})
		if err != nil {
			t.Fatal(err)
		}
		got, said := n.wait(t, v)
		if got == nil {
			t.Fatalf("the copy for %s was given up: %v (%v)", uid, n.im.Failed(v.Name), said)
		}
		return got
	}
	first := moveFor("uid-first")
	// The first copy is given up (its claim deleted: its volume goes).
	if err := n.dst.DeleteVolume(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	second := moveFor("uid-second")
	img, err := os.ReadFile(n.dst.ImagePath(second.ID))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(n.src.ImagePath(n.vol.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, src) {
		t.Fatal("the second copy is not the volume")
	}
	if v, err := n.src.Store().Volume(n.vol.ID); err != nil || v.Moving == nil || v.Moving.Claim.UID != "uid-second" {
		t.Errorf("the source volume: %+v, %v: want it marked moving for the second copy's claim", v, err)
	}
}

// A volume marked moving stays so while its copy's claim exists (bound or
// not) or its PV carries a migration's phase (switching, switched); once
// neither (a migration cancelled), the sweep lets it be staged again.
func TestSweeperClearsCancelledMoves(t *testing.T) {
	p := openPool(t)
	mark := func(name, claim string) *store.Volume {
		v, err := p.CreateVolume(context.Background(), pool.CreateRequest{Name: name, SizeBytes: 16 << 20, FsType: "ext4"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.MarkMoving(v.ID, store.Claim{Namespace: "team-a", Name: claim, UID: "u-" + claim}); err != nil {
			t.Fatal(err)
		}
		return v
	}
	pending, bound, switched, cancelled := mark("a", "pending"), mark("b", "bound"), mark("c", "switched"), mark("d", "cancelled")
	pv := func(handle string, phase string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + handle, Annotations: map[string]string{names.MigrationPhase: phase}},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}}}}
	}
	kc := fake.NewClientset(
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pending", UID: "u-pending"}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "bound", UID: "u-bound"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-new"}},
		pv(switched.ID, names.MigrationSwitched), pv(cancelled.ID, ""))
	(&Sweeper{Client: kc, Pools: []*pool.Pool{p}}).Sweep(context.Background())
	for _, c := range []struct {
		v      *store.Volume
		moving bool
	}{{pending, true}, {bound, true}, {switched, true}, {cancelled, false}} {
		got, err := p.Store().Volume(c.v.ID)
		if err != nil {
			t.Fatal(err)
		}
		if (got.Moving != nil) != c.moving {
			t.Errorf("volume %s (claim %s): moving %v, want %v", c.v.Name, c.v.Name, got.Moving != nil, c.moving)
		}
	}
}

// events records what was posted on which object.
type events struct {
	mu  sync.Mutex
	got []string // "namespace/name reason: message"
}

func (e *events) Event(obj runtime.Object, kind, reason, msg string) {
	m, _ := obj.(metav1.Object)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, fmt.Sprintf("%s/%s %s %s: %s", m.GetNamespace(), m.GetName(), kind, reason, msg))
}

func (e *events) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	e.Event(obj, kind, reason, fmt.Sprintf(format, args...))
}

func (e *events) AnnotatedEventf(obj runtime.Object, _ map[string]string, kind, reason, format string, args ...any) {
	e.Eventf(obj, kind, reason, format, args...)
}

func (e *events) on(claim string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, g := range e.got {
		if strings.HasPrefix(g, claim+" ") {
			out = append(out, g)
		}
	}
	return out
}

// A migration's copy pulled by a plugin older than versions (which would
// take the first copy for the whole volume and switch) is refused by the
// source, which says so on the copy's claim and on the claim that moves;
// a target that finds the source speaking another version says so too,
// and neither gives the copy up: it is retried, and passes once both
// speak the same version.
func TestVersionMismatchRefusesTheMigrationAndSaysSo(t *testing.T) {
	n := setup(t)
	n.authz.move = true
	n.inUse.Store(true)
	claims := fake.NewClientset(
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "data", UID: "uid-data"}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "podvol-move-x", UID: "uid-move"},
			Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}}},
	)
	source, target := &events{}, &events{}
	n.warnings.Store(&Warnings{Client: claims, Recorder: source})
	n.im.Warnings = &Warnings{Client: claims, Recorder: target}
	n.oldTarget.Store(true)
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "moved", SizeBytes: 64 << 20, FsType: "ext4",
		Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "podvol-move-x", ClaimUID: "uid-move"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	said := ""
	for len(source.on("team-a/data")) == 0 || len(target.on("team-a/data")) == 0 || !strings.Contains(said, "retrying") {
		if time.Now().After(deadline) {
			t.Fatalf("no warnings after 30 s: source %q, target %q; status %q", source.got, target.got, said)
		}
		said = n.im.Ensure(n.dst, v)
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range []struct {
		who   string
		ev    *events
		claim string
		want  []string
	}{
		{"source", source, "team-a/data", []string{"Warning TransferVersionMismatch", "node node-b's plugin announced no transfer protocol version", "too old to take a migration's copy", "upgrade the podvol node plugins"}},
		{"source", source, "team-a/podvol-move-x", []string{"Warning TransferVersionMismatch", "upgrade the podvol node plugins"}},
		{"target", target, "team-a/data", []string{"Warning TransferVersionMismatch", "copying volume " + n.vol.ID + " from node node-a", "upgrade the podvol node plugins"}},
		{"target", target, "team-a/podvol-move-x", []string{"Warning TransferVersionMismatch", "upgrade the podvol node plugins"}},
	} {
		got := c.ev.on(c.claim)
		if len(got) == 0 {
			t.Errorf("the %s posted nothing on claim %s", c.who, c.claim)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(got[0], w) {
				t.Errorf("the %s posted %q on claim %s, which does not say %q", c.who, got[0], c.claim, w)
			}
		}
	}
	if !strings.Contains(said, "upgrade the podvol node plugins") {
		t.Errorf("the copy's status %q does not say what to do", said)
	}
	// The target warns once for the same refusal, however often it tries.
	if got := target.on("team-a/data"); len(got) != 1 {
		t.Errorf("the target posted %d warnings on the claim, want 1: %q", len(got), got)
	}
	rec, err := n.dst.Store().Volume(v.ID)
	if err != nil || rec.State != store.Importing || rec.Import.Base != "" || rec.Import.Verified != 0 {
		t.Fatalf("after the refusals the copy is %+v (%v): want it importing, nothing pulled", rec, err)
	}
	// The plugins upgraded, the copy goes on.
	n.oldTarget.Store(false)
	for said = ""; !strings.Contains(said, "the rest follows once no pod uses the source volume"); said = n.im.Ensure(n.dst, v) {
		if time.Now().After(deadline) {
			t.Fatalf("the first copy never came after the upgrade: %q", said)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A pull that finds the pool's filesystem full is given up, not retried for
// ever, and says why: the write's own error (/dev/full's ENOSPC, as a full
// filesystem's), as the pull returns it.
func TestPullOutOfSpaceIsFinal(t *testing.T) {
	p := openPool(t)
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := f.WriteAt(make([]byte, 4096), 0)
	f.Close()
	werr = fmt.Errorf("pull snap-1 from 10.0.0.1:9816: write 4096 bytes at 0 of the copy: %w", werr)
	err = outOfSpace(p, werr)
	if !final(err) || !errors.Is(err, errkind.ErrNoSpace) || !strings.Contains(err.Error(), "the filesystem of pool default") ||
		!strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("a pull into a full filesystem: %v (final: %v), want a final ErrNoSpace naming the pool", err, final(err))
	}
	other := errors.New("connection reset")
	if err := outOfSpace(p, other); err.Error() != other.Error() || errors.Is(err, errkind.ErrNoSpace) || final(err) {
		t.Errorf("another error: %v (final %v), want it as it was, retried", err, final(err))
	}
}

// condition is the claim's condition of that type, nil if it has none.
func condition(t *testing.T, kc *fake.Clientset, claim, typ string) *corev1.PersistentVolumeClaimCondition {
	t.Helper()
	pvc, err := kc.CoreV1().PersistentVolumeClaims("team-a").Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pvc.Status.Conditions {
		if string(pvc.Status.Conditions[i].Type) == typ {
			return &pvc.Status.Conditions[i]
		}
	}
	return nil
}

// A migration's source lost after its pre-copy (its Node gone from the
// cluster, or its PV marked lost by node-loss while the node does not
// answer) leaves the copy's node the only good copy: it is kept and made
// ready, the claim saying which instant it holds; a copy that is no
// instant (the last data half applied) is given up, the claim saying why.
func TestImportKeepsThePreCopyWhenTheSourceIsLost(t *testing.T) {
	for _, how := range []string{"node gone", "PV marked lost", "no instant"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			n := setup(t)
			n.authz.move = true
			n.inUse.Store(true)
			n.im.InUsePoll, n.im.RetryMax = 10*time.Millisecond, 50*time.Millisecond
			_, port, err := net.SplitHostPort(n.im.Resolver.(staticResolver)["node-a"])
			if err != nil {
				t.Fatal(err)
			}
			portN, _ := strconv.Atoi(port)
			srcPV := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-src"},
				Spec: corev1.PersistentVolumeSpec{
					PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: n.vol.ID}},
					ClaimRef:               &corev1.ObjectReference{Namespace: "team-a", Name: "data", UID: "uid-data"}}}
			kc := fake.NewClientset(
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}},
				&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "data", UID: "uid-data"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-src"}},
				srcPV,
				&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "moved", UID: "uid-moved"},
					Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}}})
			n.im.Claims, n.im.Driver = kc, names.Driver
			n.im.Resolver = NodeAddresses{Client: kc, Port: portN}
			v, err := n.dst.CreateVolume(ctx, pool.CreateRequest{Name: "moved", SizeBytes: 64 << 20, FsType: "ext4",
				Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
				Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "moved", ClaimUID: "uid-moved"}})
			if err != nil {
				t.Fatal(err)
			}
			if how == "no instant" {
				// As a last pull cut short leaves it: changes towards the
				// moving image half applied over the first copy.
				if err := n.dst.RecordImport(v.ID, n.vol.ID+"@moving-1", "snap@1", 64<<20, 8<<20); err != nil {
					t.Fatal(err)
				}
				if err := kc.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				if got, said := n.wait(t, v); got != nil {
					t.Fatalf("a copy that is no instant was made ready: %+v (%v)", got, said)
				}
				if err := n.im.Failed("moved"); !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "no copy of it that is one instant") {
					t.Errorf("Failed: %v", err)
				}
				if c := condition(t, kc, "moved", names.DataCopied); c == nil || c.Status != corev1.ConditionFalse || c.Reason != names.ReasonSourceLost {
					t.Errorf("the claim's DataCopied: %+v, want False, %s", c, names.ReasonSourceLost)
				}
				return
			}
			deadline := time.Now().Add(30 * time.Second)
			for said := ""; !strings.Contains(said, "a first copy"); said = n.im.Ensure(n.dst, v) {
				if time.Now().After(deadline) {
					t.Fatalf("the first copy never said it waits: %q", said)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if c := condition(t, kc, "moved", names.PreCopied); c == nil || c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "as it was at ") {
				t.Errorf("the claim's PreCopied after the first copy: %+v", c)
			}
			snaps, err := n.src.TransferSnapshots()
			if err != nil || len(snaps) != 1 {
				t.Fatalf("the first copy's snapshot on the source: %v, %v", snaps, err)
			}
			first, err := os.ReadFile(n.src.SnapshotPath(snaps[0].ID))
			if err != nil {
				t.Fatal(err)
			}
			// The pod writes on; then its node is lost before it lets go.
			f, err := os.OpenFile(n.src.ImagePath(n.vol.ID), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 40<<20); err != nil {
				t.Fatal(err)
			}
			f.Close()
			switch how {
			case "node gone":
				err = kc.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{})
			case "PV marked lost":
				// The node answers no more (nothing listens there)...
				node, _ := kc.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
				node.Status.Addresses[0].Address = "127.0.0.2"
				if _, err = kc.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
					break
				}
				time.Sleep(200 * time.Millisecond) // ...and that alone gives nothing up
				if rec, err := n.dst.Store().Volume(v.ID); err != nil || rec.State != store.Importing {
					t.Fatalf("a source that does not answer ended the pull: %+v, %v", rec, err)
				}
				srcPV.Annotations = map[string]string{names.MigrationSourceLost: "2026-12-03T10:00:00Z"}
				_, err = kc.CoreV1().PersistentVolumes().Update(ctx, srcPV, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			got, said := n.poll(t, v, false)
			if got == nil {
				t.Fatalf("the pre-copy was given up when its source was lost: %v (%v)", n.im.Failed("moved"), said)
			}
			img, err := os.ReadFile(n.dst.ImagePath(v.ID))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(img, first) {
				t.Fatal("the volume kept is not the first copy")
			}
			c := condition(t, kc, "moved", names.DataCopied)
			if c == nil || c.Status != corev1.ConditionTrue || c.Reason != names.ReasonPreCopyOnly || !strings.Contains(c.Message, "as it was at ") {
				t.Errorf("the claim's DataCopied: %+v, want True, %s, saying as of when", c, names.ReasonPreCopyOnly)
			}
		})
	}
}

// A plugin stopped inside the last step of a pull (the copy complete and
// verified, grown to the claim's size, not yet ready) finishes it at its
// next start from what it holds: nothing is pulled again (here the source
// refuses every pull, so a pull would give the copy up).
func TestImportFinishesAfterAStopInItsLastStep(t *testing.T) {
	n := setup(t)
	v := n.restore(t, "restored", 96<<20, "ext4")
	snap, err := os.ReadFile(n.src.SnapshotPath(n.snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(n.dst.ImagePath(v.ID), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(snap, 0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.dst.RecordImport(v.ID, n.snap.ID+"@1", "", int64(len(snap)), int64(len(snap))); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(n.dst.ImagePath(v.ID), 96<<20); err != nil { // FinishImport's growth, then the stop
		t.Fatal(err)
	}
	n.authz.err = fmt.Errorf("no pull expected: %w", errkind.ErrDenied)
	got, said := n.wait(t, v)
	if got == nil {
		t.Fatalf("the copy was given up: %v (%v)", n.im.Failed("restored"), said)
	}
	n.authz.mu.Lock()
	asked := len(n.authz.seen)
	n.authz.mu.Unlock()
	if asked != 0 {
		t.Errorf("the source was asked %d times for a copy complete here", asked)
	}
	img, err := os.ReadFile(n.dst.ImagePath(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if len(img) != 96<<20 || !bytes.Equal(img[:len(snap)], snap) {
		t.Fatalf("the volume (%d bytes) is not the snapshot grown to the claim's size", len(img))
	}
}

// A source that takes no first copy while the pod runs: the copy's claim
// is told at once (PreCopied False), so that the pod's eviction does not
// wait for one; the whole is pulled once the pod is gone.
func TestImportTellsWhenNoFirstCopyComes(t *testing.T) {
	n := setup(t)
	n.authz.move = true
	n.inUse.Store(true)
	n.noFirst.Store(true)
	n.im.InUsePoll = 20 * time.Millisecond
	kc := fake.NewClientset(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "moved", UID: "uid-moved"}})
	n.im.Claims = kc
	v, err := n.dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "moved", SizeBytes: 64 << 20, FsType: "ext4",
		Source: &store.Source{Kind: store.FromVolume, ID: n.vol.ID, Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "moved", ClaimUID: "uid-moved"}})
	if err != nil {
		t.Fatal(err)
	}
	n.im.Ensure(n.dst, v)
	deadline := time.Now().Add(10 * time.Second)
	for c := condition(t, kc, "moved", names.PreCopied); c == nil || c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "no first copy here"); c = condition(t, kc, "moved", names.PreCopied) {
		if time.Now().After(deadline) {
			t.Fatalf("the claim's PreCopied: %+v, want False saying why", c)
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.inUse.Store(false)
	if got, said := n.wait(t, v); got == nil {
		t.Fatalf("the move was given up: %v (%v)", n.im.Failed("moved"), said)
	}
}
