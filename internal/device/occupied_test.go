package device

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// On a filesystem with reflink, a block two files share counts once: a copy
// and the part of it rewritten take what the rewrite took. Without shared,
// stat's blocks are added up; a file gone counts nothing.
func TestOccupiedCountsSharedBlocksOnce(t *testing.T) {
	ctx := context.Background()
	img := image(t, 400<<20)
	if err := Format(ctx, img, "xfs"); err != nil {
		t.Fatal(err)
	}
	dev, _ := attach(t, img, LoopOptions{})
	mnt := t.TempDir()
	if err := Mount(ctx, dev, mnt, "xfs", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(mnt) })
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i)
	}
	if err := os.WriteFile(a, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CopyImage(a, b, int64(len(data)), true); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(b, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	files := []string{a, b, filepath.Join(mnt, "gone")}
	once, err := Occupied(files, true)
	if err != nil {
		t.Fatal(err)
	}
	twice, err := Occupied(files, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("16 MiB and a copy with 1 MiB rewritten: %d KiB with shared blocks once, %d KiB counted in each", once>>10, twice>>10)
	if once < 17<<20 || once > 17<<20+256<<10 {
		t.Errorf("occupied with shared blocks once: %d bytes, want 17 MiB", once)
	}
	if twice < 32<<20 || twice > 32<<20+256<<10 {
		t.Errorf("occupied, each file's blocks: %d bytes, want 32 MiB", twice)
	}
}
