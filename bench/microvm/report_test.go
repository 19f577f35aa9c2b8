package microvmbench

import (
	"fmt"
	"image/color"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/podvol/podvol/bench/internal/plot"
)

func (r *report) write(dir string) error {
	if err := r.plot(filepath.Join(dir, "microvm.png")); err != nil {
		return err
	}
	md := r.markdown()
	fmt.Print("\n" + md)
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(md), 0o644)
}

func (r *report) markdown() string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	tcg := r.Accel != "kvm"
	p("# MicroVM benchmark: direct-assigned volume vs virtio-fs")
	p("")
	p("`make bench-microvm` (as root, about 2½ minutes once the guest kernel is cached) writes this file and `microvm.png` beside it. It runs the real")
	p("plugin and the test runtime of `test/microvm` (a QEMU `-M microvm` guest, the runtime reading podvol's")
	p("`mountInfo.json` as Kata's does) on one 1 GiB ext4 volume published with `directAssign: always`, and measures:")
	p("")
	p("- **boot**: %d boots of the guest the tests use (kernel, %d KiB initramfs, agent as `/init`): QEMU started to", boots, r.Initramfs[0]>>10)
	p("  agent ready, and to the volume mounted in the guest;")
	p("- **fio in the guest** (%s, file of %s, `--ioengine=%s --direct=1`, queue depth 1, %d s a job after 1 s of ramp) on", r.FioVersion, fioSize, fioEngine, fioTime)
	p("  - *direct*: the volume's loop device as the guest's virtio-blk disk (`cache=none,aio=threads`), the guest mounting the ext4;")
	p("  - *virtio-fs*: the same volume unpublished, so mounted on the host at its staging path again, and that directory")
	p("    shared into the guest by `%s` with `cache=auto` (Kata's default), the same file fio wrote in the first run.", r.Virtiofsd)
	p("  The guest for fio carries fio and the libraries `ldd` lists (initramfs %d MiB) and the virtiofs module.", r.Initramfs[1]>>20)
	p("")
	if tcg {
		p("> **All figures below are TCG (emulated CPU), not KVM**: `/dev/kvm` is missing or unusable on this machine.")
		p("> Under TCG every guest instruction, the virtio drivers and fio included, is translated in software, so absolute")
		p("> numbers are far below what a KVM guest does and the CPU cost of each path weighs much more than the disk.")
		p("> The ratios say which path costs the guest less per I/O here; measure again on a KVM host before quoting them.")
		p("")
	}
	p("## Measured here (%s)", time.Now().Format("2006-01-02"))
	p("")
	p("Machine: %s, %d CPUs, host kernel %s, %s, accelerator **%s**, guest kernel %s.", plot.CPUModel(), plot.NumCPU(), plot.Uname(), qemuVersion(), strings.ToUpper(r.Accel), r.GuestKernel)
	p("")
	p("| boot (%d runs, %s) | median | min | max |", boots, strings.ToUpper(r.Accel))
	p("|---|---|---|---|")
	p("| QEMU start → agent ready | %s | %s | %s |", ms(median(r.Boot)), ms(slices.Min(r.Boot)), ms(slices.Max(r.Boot)))
	p("| QEMU start → volume mounted in the guest | %s | %s | %s |", ms(median(r.Mounted)), ms(slices.Min(r.Mounted)), ms(slices.Max(r.Mounted)))
	p("")
	p("Guest kernel uptime when the agent was ready: %s.", strings.Join(r.Uptime, ", "))
	p("")
	p("| fio job (%s) | direct: IOPS | MiB/s | mean latency | virtio-fs: IOPS | MiB/s | mean latency | direct / virtio-fs |", strings.ToUpper(r.Accel))
	p("|---|---|---|---|---|---|---|---|")
	for _, j := range jobs {
		d, f := r.Direct[j.Name], r.VirtioFS[j.Name]
		p("| %s | %.0f | %.1f | %.0f µs | %.0f | %.1f | %.0f µs | **%.2f×** |", j.Name,
			d.IOPS, d.BWBytes/(1<<20), d.MeanLatU, f.IOPS, f.BWBytes/(1<<20), f.MeanLatU, ratio(d, f))
	}
	p("")
	p("![direct-assigned vs virtio-fs, fio in the guest](microvm.png)")
	p("")
	p("## How to read it")
	p("")
	p("- The last column is direct throughput over virtio-fs throughput for the same job: above 1 the direct-assigned")
	p("  disk did more I/O in the same time. Each job ran once, with the host's load average at %s (1, 5, 15 min) when", plot.LoadAvg())
	p("  the report was written: on a shared machine two runs can differ by 2× on the 4k jobs, so read the ratios as rough.")
	p("- virtio-fs goes guest FUSE → vhost-user queue → virtiofsd → the host's ext4 on the loop device; direct goes guest")
	p("  ext4 → virtio-blk → QEMU (`cache=none`) → the loop device. `--direct=1` bypasses the guest's page cache on both")
	p("  paths, but not the host's: the loop device does buffered I/O on its image, and virtiofsd (as Kata starts it, without")
	p("  direct I/O allowed) on its files, so with a %s file both paths mostly move memory. What differs is the cost of each", fioSize)
	p("  request along the path, and under TCG that is emulated CPU: a FUSE request and a virtio-blk request through the")
	p("  guest's block layer and ext4 cost differently there than with KVM, where virtio-blk is usually the faster. These")
	p("  figures do not show direct assignment to be faster or slower on real hardware; they show both paths work and what")
	p("  they cost here.")
	p("- Boot time is the tests' guest, not the fio one (whose larger initramfs takes longer to unpack). Most of it under")
	p("  TCG is the guest kernel's own start (its uptime at agent ready), then loading modules and mounting.")
	return w.String()
}

func ratio(d, f result) float64 {
	if f.BWBytes == 0 {
		return 0
	}
	return d.BWBytes / f.BWBytes
}

func ms(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }

func qemuVersion() string {
	out, _ := exec.Command("qemu-system-x86_64", "--version").Output()
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(strings.TrimSpace(first), "QEMU emulator version ")
}

// plot draws, for each fio job, a bar for each path scaled to the larger of
// the two, its value above it, and the ratio below the pair.
func (r *report) plot(path string) error {
	const W, H, top, base, left = 900, 440, 70, 360, 40
	cv := plot.NewCanvas(W, H)
	ink := plot.Ink
	colors := []color.RGBA{plot.Blue, plot.Orange}
	text, centered, rect := cv.Text, cv.Centered, cv.Rect
	title := "fio in the guest: direct-assigned podvol volume (virtio-blk) vs the same filesystem over virtio-fs"
	centered(W/2, 20, title, ink)
	sub := fmt.Sprintf("accelerator %s%s; bars scaled per job to the faster path", strings.ToUpper(r.Accel),
		map[bool]string{true: " (emulated CPU: not KVM figures)", false: ""}[r.Accel != "kvm"])
	centered(W/2, 38, sub, ink)
	rect(left, base, W-left, base+1, ink)
	group := (W - 2*left) / len(jobs)
	bar := group / 4
	for i, j := range jobs {
		vals := []result{r.Direct[j.Name], r.VirtioFS[j.Name]}
		hi := max(vals[0].BWBytes, vals[1].BWBytes)
		gx := left + i*group
		for k, v := range vals {
			h := 0
			if hi > 0 {
				h = int(float64(base-top-20) * v.BWBytes / hi)
			}
			x0 := gx + group/2 - bar - 12 + k*(bar+24)
			rect(x0, base-h, x0+bar, base, colors[k])
			label := fmt.Sprintf("%.0f MiB/s", v.BWBytes/(1<<20))
			if strings.HasPrefix(j.BS, "4k") {
				label = fmt.Sprintf("%.0f IOPS", v.IOPS)
			}
			centered(x0+bar/2, base-h-6, label, ink)
		}
		centered(gx+group/2, base+18, j.Name, ink)
		centered(gx+group/2, base+34, fmt.Sprintf("direct/virtio-fs %.2fx", ratio(vals[0], vals[1])), ink)
	}
	for k, name := range []string{"direct-assigned (virtio-blk)", "virtio-fs (" + filepath.Base(r.Virtiofsd) + ", cache=auto)"} {
		x := left + k*320
		rect(x, H-22, x+14, H-8, colors[k])
		text(x+20, H-10, name, ink)
	}
	return cv.WritePNG(path)
}
