package devcluster

import (
	"fmt"
	"io"
	"time"
)

// progress prints which step runs, how far along the whole is, and how long
// it has taken so far: building Kubernetes takes minutes.
type progress struct {
	out   io.Writer
	start time.Time
	step  int
	total int
}

// begin starts counting the steps of one command (Up, Down) afresh.
func (p *progress) begin(total int) {
	p.start, p.step, p.total = time.Now(), 0, total
}

func (p *progress) next(format string, a ...any) {
	p.step++
	fmt.Fprintf(p.out, "[%d/%d] %s (%s so far)\n", p.step, p.total, fmt.Sprintf(format, a...), time.Since(p.start).Round(time.Second))
}

func (p *progress) note(format string, a ...any) {
	fmt.Fprintf(p.out, "      %s\n", fmt.Sprintf(format, a...))
}
