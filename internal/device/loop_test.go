package device

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// withoutLoopConfigure makes AttachLoop meet a kernel older than 5.8, which
// answers LOOP_CONFIGURE with EINVAL, for the rest of the test.
func withoutLoopConfigure(t *testing.T) {
	saved := loopConfigure
	loopConfigure = func(int, *unix.LoopConfig) error { return unix.EINVAL }
	t.Cleanup(func() { loopConfigure = saved })
}

// ramfsDir is a directory on a filesystem that refuses direct I/O.
func ramfsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("podvol-test", dir, "ramfs", 0, "mode=0700"); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount ramfs %s: %v", dir, err)
		}
	})
	return dir
}

func attach(t *testing.T, img string, opts LoopOptions) (string, LoopIO) {
	t.Helper()
	dev, err := AttachLoop(img, opts)
	if err != nil {
		t.Fatalf("attach %s with %+v: %v", img, opts, err)
	}
	t.Cleanup(func() { _ = DetachLoop(dev, img) })
	got, err := LoopStatus(dev)
	if err != nil {
		t.Fatal(err)
	}
	return dev, got
}

// The options hold whichever way the kernel is asked: LOOP_CONFIGURE, or
// the ioctls before it. A filesystem that refuses direct I/O gets a
// buffered device, not an error, either way.
func TestAttachOptions(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "LOOP_CONFIGURE"
		if legacy {
			name = "LOOP_SET_FD"
		}
		t.Run(name, func(t *testing.T) {
			if legacy {
				withoutLoopConfigure(t)
			}
			img := image(t, 16<<20)
			pool := PoolBlockSize(img)
			if pool != 4096 {
				t.Logf("the test directory's filesystem has %d-byte blocks", pool)
			}
			for _, tc := range []struct {
				opts LoopOptions
				want LoopIO
			}{
				{LoopOptions{DirectIO: true}, LoopIO{DirectIO: true, BlockSize: pool}},
				{LoopOptions{DirectIO: true, BlockSize: 512}, LoopIO{DirectIO: true, BlockSize: 512}},
				{LoopOptions{BlockSize: 512}, LoopIO{BlockSize: 512}},
			} {
				dev, got := attach(t, img, tc.opts)
				if got != tc.want {
					t.Errorf("%+v: got %+v, want %+v", tc.opts, got, tc.want)
				}
				// Data goes through to the image.
				f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
				if err != nil {
					t.Fatal(err)
				}
				buf := alignedBlock(t, 4096, byte(tc.want.BlockSize>>8))
				if _, err := f.WriteAt(buf, 8192); err != nil {
					t.Fatalf("%+v: write: %v", tc.opts, err)
				}
				f.Close()
				back := make([]byte, 4096)
				if r, err := os.Open(img); err != nil {
					t.Fatal(err)
				} else if _, err := r.ReadAt(back, 8192); err != nil || back[0] != buf[0] || back[4095] != buf[4095] {
					t.Fatalf("%+v: the image holds %x... after a write of %x...: %v", tc.opts, back[:4], buf[:4], err)
				} else {
					r.Close()
				}
				if err := DetachLoop(dev, img); err != nil {
					t.Fatal(err)
				}
			}
			refused := filepath.Join(ramfsDir(t), "img")
			if err := os.WriteFile(refused, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(refused, 16<<20); err != nil {
				t.Fatal(err)
			}
			if _, got := attach(t, refused, LoopOptions{DirectIO: true, BlockSize: 512}); got.DirectIO {
				t.Fatalf("on ramfs: %+v, want buffered", got)
			}
		})
	}
}

// alignedBlock is n bytes from b on, page-aligned for O_DIRECT (an
// anonymous mapping), unmapped when the test ends.
func alignedBlock(t *testing.T, n int, b byte) []byte {
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(buf) })
	for i := range buf {
		buf[i] = b + byte(i)
	}
	return buf
}

// Volumes made before podvol chose block sizes (xfs with 512-byte sectors,
// ext4 below 512 MiB with 1 KiB blocks: exactly the commands it ran) still
// mount: the device takes their size, with direct I/O.
func TestOldFilesystemsStillMount(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		fs   string
		size int64
		mkfs []string
		want int
	}{
		{"xfs", 300 << 20, []string{"mkfs.xfs", "-q", "-f", "-K"}, 512},
		{"ext4", 64 << 20, []string{"mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}, 1024},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			img := image(t, tc.size)
			if out, err := exec.Command(tc.mkfs[0], append(tc.mkfs[1:], img)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", tc.mkfs, err, out)
			}
			if got, err := FilesystemBlockLimit(img); err != nil || got != tc.want {
				t.Fatalf("FilesystemBlockLimit: %d, %v; want %d", got, err, tc.want)
			}
			dev, got := attach(t, img, LoopOptions{DirectIO: true})
			if got != (LoopIO{DirectIO: true, BlockSize: tc.want}) {
				t.Fatalf("attached as %+v, want %d-byte blocks with direct I/O", got, tc.want)
			}
			if err := FsckIfNeeded(ctx, dev, tc.fs); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			if err := Mount(ctx, dev, mnt, tc.fs, nil); err != nil {
				t.Fatalf("an old %s does not mount: %v", tc.fs, err)
			}
			if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o600); err != nil {
				t.Error(err)
			}
			if err := Unmount(mnt); err != nil {
				t.Fatal(err)
			}
		})
	}
	// What Format makes now has the pool's block size.
	for _, fs := range []string{"xfs", "ext4"} {
		img := image(t, 300<<20)
		if err := Format(ctx, img, fs); err != nil {
			t.Fatal(err)
		}
		if got, err := FilesystemBlockLimit(img); err != nil || got != PoolBlockSize(img) {
			t.Errorf("new %s: FilesystemBlockLimit %d, %v; want the pool's %d", fs, got, err, PoolBlockSize(img))
		}
	}
}

// A trim through a handle on the volume's filesystem punches the space of
// deleted files out of the image, through a direct-I/O loop device.
func TestTrimGivesSpaceBack(t *testing.T) {
	ctx := context.Background()
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			img := image(t, 400<<20)
			if err := Format(ctx, img, fs); err != nil {
				t.Fatal(err)
			}
			dev, _ := attach(t, img, LoopOptions{DirectIO: true})
			mnt := t.TempDir()
			if err := Mount(ctx, dev, mnt, fs, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = Unmount(mnt) })
			before := allocatedBytes(t, img)
			data := filepath.Join(mnt, "data")
			if err := os.WriteFile(data, make([]byte, 128<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			unix.Sync()
			full := allocatedBytes(t, img)
			if full < before+100<<20 {
				t.Fatalf("128 MiB written, the image grew from %d to %d MiB", before>>20, full>>20)
			}
			used, err := Statfs(mnt)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(data); err != nil {
				t.Fatal(err)
			}
			// xfs frees a deleted file's blocks in the background: a
			// trim gives back what the filesystem has freed.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if now, err := Statfs(mnt); err == nil && now.UsedBytes < used.UsedBytes-100<<20 {
					break
				}
			}
			f, err := OpenFilesystemOn(mnt, dev)
			if err != nil {
				t.Fatal(err)
			}
			n, err := Trim(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			// xfs may complete its discards after FITRIM returns.
			after := allocatedBytes(t, img)
			for deadline := time.Now().Add(5 * time.Second); after > before+16<<20 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				after = allocatedBytes(t, img)
			}
			t.Logf("%s: image %d MiB, %d MiB with 128 MiB of data, %d MiB after delete and trim (%d MiB trimmed)", fs, before>>20, full>>20, after>>20, n>>20)
			if after > before+16<<20 {
				t.Fatalf("the image holds %d MiB after the data was deleted and trimmed (%d MiB before)", after>>20, before>>20)
			}
			if err := Unmount(mnt); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
