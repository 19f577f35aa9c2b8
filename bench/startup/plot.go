package main

import (
	"fmt"
	"image/color"
	"math"
	"time"

	"github.com/podvol/podvol/bench/internal/plot"
)

// eventColor colours a phase by the event that ends it.
func eventColor(e Event) color.RGBA {
	return plot.Series[(int(e)-1+len(plot.Series))%len(plot.Series)]
}

// Plot draws one horizontal bar per cell and mode: the p50 of each phase of
// the pod's start-up stacked, coloured by the event that ends it, and the
// p50 of pod created → Ready marked and written after it.
func Plot(r *Result, m Meta) *plot.Canvas {
	const W, left, right, top, rowH, barH = 1000, 250, 90, 60, 24, 16
	rows := len(r.Modes) * (len(r.Cells) + 1)
	H := top + rows*rowH + 80
	cv := plot.NewCanvas(W, H)
	cv.Centered(W/2, 20, "Pod start-up on the dev cluster, phase by phase (p50 of each phase, seconds)", plot.Ink)
	cv.Centered(W/2, 38, fmt.Sprintf("%s, Kubernetes %s, pods per cell: %d one at a time, %d %d at once; | = p50 of pod created -> Ready",
		m.Date.Format("2006-01-02"), m.Kubernetes, m.PodsOne, m.Pods, m.Burst), plot.Ink)
	// The scale: whole seconds, to the longest bar.
	var longest time.Duration
	for _, mode := range r.Modes {
		for _, c := range r.Cells {
			var sum time.Duration
			for _, row := range r.Breakdown(c, mode.Name) {
				if row.Phase != Total && InPodStartup(c.Kind, row.Phase) {
					sum += row.Stats.P50
				}
			}
			longest = max(longest, sum, r.TotalStats(c.Name, mode.Name).P50)
		}
	}
	secs := max(1, int(math.Ceil(longest.Seconds())))
	width := W - left - right
	px := func(d time.Duration) int { return int(d.Seconds() / float64(secs) * float64(width)) }
	bottom := top + rows*rowH
	step := max(1, secs/10)
	for s := 0; s <= secs; s += step {
		x := left + px(time.Duration(s)*time.Second)
		cv.Rect(x, top-4, x+1, bottom, plot.Grid)
		cv.Centered(x, bottom+14, fmt.Sprintf("%ds", s), plot.Ink)
	}
	y := top
	for _, mode := range r.Modes {
		cv.Text(10, y+rowH-8, mode.Name+":", plot.Ink)
		y += rowH
		for _, c := range r.Cells {
			cv.Right(left-8, y+barH-3, c.Name, plot.Ink)
			x := left
			for _, row := range r.Breakdown(c, mode.Name) {
				if row.Phase == Total || !InPodStartup(c.Kind, row.Phase) {
					continue
				}
				w := px(row.Stats.P50)
				cv.Rect(x, y, x+w, y+barH, eventColor(row.Phase.To))
				x += w
			}
			t := r.TotalStats(c.Name, mode.Name)
			tx := left + px(t.P50)
			cv.Rect(tx, y-3, tx+2, y+barH+3, plot.Ink)
			cv.Text(max(x, tx)+6, y+barH-3, ms(t.P50), plot.Ink)
			y += rowH
		}
	}
	// The legend: one swatch per phase end.
	lx, ly := 10, bottom+40
	for e := ClaimCreated; e < numEvents; e++ {
		label := "-> " + e.String()
		if lx+20+len(label)*plot.CharWidth > W {
			lx, ly = 10, ly+20
		}
		cv.Rect(lx, ly-11, lx+14, ly+3, eventColor(e))
		cv.Text(lx+20, ly, label, plot.Ink)
		lx += 20 + len(label)*plot.CharWidth + 20
	}
	return cv
}
