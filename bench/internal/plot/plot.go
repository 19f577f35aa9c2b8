// Package plot holds what the benchmarks under bench/ share to write their
// reports: a small canvas that draws text and filled rectangles into a PNG
// (golang.org/x/image's fixed 7×13 font, no other dependency), and the
// machine facts a report states (CPU, kernel, load).
package plot

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Colours the reports use.
var (
	Ink    = color.RGBA{0x20, 0x20, 0x20, 0xff}
	Grid   = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	Blue   = color.RGBA{0x2f, 0x6f, 0xb3, 0xff}
	Orange = color.RGBA{0xe0, 0x8a, 0x2c, 0xff}
	// Series is a palette for stacked or grouped series, Blue and Orange
	// first.
	Series = []color.RGBA{
		Blue, Orange,
		{0x4c, 0xa1, 0x4c, 0xff},
		{0xc8, 0x3e, 0x3e, 0xff},
		{0x8c, 0x6b, 0xb8, 0xff},
		{0x8c, 0x56, 0x4b, 0xff},
		{0xd9, 0x77, 0xc2, 0xff},
		{0x7f, 0x7f, 0x7f, 0xff},
	}
)

// CharWidth and LineHeight are the font's cell.
const (
	CharWidth  = 7
	LineHeight = 13
)

// Canvas is a white RGBA image to draw a report's figure on.
type Canvas struct {
	Img  *image.RGBA
	face font.Face
}

// NewCanvas returns a white canvas of w×h pixels.
func NewCanvas(w, h int) *Canvas {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	return &Canvas{Img: img, face: basicfont.Face7x13}
}

// Text draws s with its baseline starting at (x, y).
func (c *Canvas) Text(x, y int, s string, col color.Color) {
	d := &font.Drawer{Dst: c.Img, Src: image.NewUniform(col), Face: c.face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// Centered draws s centred on cx, baseline at y.
func (c *Canvas) Centered(cx, y int, s string, col color.Color) {
	c.Text(cx-len(s)*CharWidth/2, y, s, col)
}

// Right draws s ending at x, baseline at y.
func (c *Canvas) Right(x, y int, s string, col color.Color) {
	c.Text(x-len(s)*CharWidth, y, s, col)
}

// Rect fills the rectangle [x0,x1)×[y0,y1).
func (c *Canvas) Rect(x0, y0, x1, y1 int, col color.Color) {
	draw.Draw(c.Img, image.Rect(x0, y0, x1, y1), image.NewUniform(col), image.Point{}, draw.Src)
}

// WritePNG writes the canvas to path.
func (c *Canvas) WritePNG(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.Img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// LoadAvg is /proc/loadavg's 1, 5 and 15 minute averages, or "?".
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], ", ")
}

// CPUModel is the first "model name" of /proc/cpuinfo, or the architecture.
func CPUModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// Uname is the running kernel's release.
func Uname() string {
	out, _ := exec.Command("uname", "-r").Output()
	return strings.TrimSpace(string(out))
}

// NumCPU is how many CPUs this process may use.
func NumCPU() int { return runtime.NumCPU() }
