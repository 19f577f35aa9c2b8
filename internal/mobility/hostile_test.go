package mobility

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/transfer"
)

// A restore's pull from a source that announces an image four times its
// claim is given up before the copy is sized or written: the target's
// image never grows past the claim, whatever the source sends (here: a
// chunk far past the claim, then nothing).
func TestImportBoundsAHostileSource(t *testing.T) {
	const claimBytes = 64 << 20
	c := nodeCreds(t, "node-a", "node-b")
	chunk := make([]byte, 4096)
	frame := []byte{'D'}
	frame = binary.BigEndian.AppendUint64(frame, 100<<20)
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(chunk)))
	frame = binary.BigEndian.AppendUint32(frame, crc32.Checksum(chunk, crc32.MakeTable(crc32.Castagnoli)))
	frame = append(frame, chunk...)
	release := make(chan struct{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- transfer.Serve(ctx, lis, c["node-a"], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Podvol-Transfer-Version", strconv.Itoa(transfer.Version))
			h.Set("Podvol-Image-Size", strconv.Itoa(4*claimBytes))
			h.Set("Podvol-Image-Identity", "big")
			h.Set("Podvol-Data-Bytes", strconv.Itoa(len(chunk)))
			_, _ = w.Write(frame)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
	}()
	t.Cleanup(func() {
		close(release)
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})

	dst := openPool(t)
	im := &Importer{Credentials: c["node-b"], Resolver: staticResolver{"node-a": lis.Addr().String()}, RetryMin: 10 * time.Millisecond, SyncEvery: 1 << 20}
	v, err := dst.CreateVolume(context.Background(), pool.CreateRequest{Name: "restored", SizeBytes: claimBytes, FsType: "ext4",
		Source: &store.Source{Kind: store.FromSnapshot, ID: "snap-0123456789abcdef01234567", Node: "node-a"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "restored", ClaimUID: "uid-restored"}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if fi, err := os.Stat(dst.ImagePath(v.ID)); err == nil && fi.Size() > claimBytes {
			t.Fatalf("the restore's image was sized to %d bytes, past its claim's %d: the source chose how much this node writes", fi.Size(), claimBytes)
		}
		got, err := dst.Store().Volume(v.ID)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pull from a source announcing %d bytes for a claim of %d is still %s after 10 s", 4*claimBytes, claimBytes, got.State)
		}
		im.Ensure(dst, got)
	}
	err = im.Failed("restored")
	if !errors.Is(err, errkind.ErrOutOfRange) || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("the pull was given up with %v, want out of range before anything was written", err)
	}
}
