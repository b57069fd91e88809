package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Chart geometry, in SVG user units (pixels at 100%).
const (
	chartWidth   = 1000
	chartCols    = 2
	panelW       = 470
	panelH       = 290
	panelGap     = 20
	chartMargin  = 20
	chartHeaderH = 130
	plotLeft     = 58 // inside a panel: room for the y labels
	plotRight    = 16
	plotTop      = 40 // room for the panel title
	plotBottom   = 46 // room for the x labels and axis title
	cdfPointsMax = 400
)

// libStyle gives each library a colour (from a palette that stays apart for
// the common kinds of colour blindness) and a dash pattern.
var libStyle = map[string]struct{ color, dash string }{
	"quorumlock":      {"#0072B2", ""},
	"quorumlock+poll": {"#56B4E9", "7 3"},
	"redsync":         {"#D55E00", ""},
	"redislock":       {"#009E73", "7 3"},
	"floor":           {"#555555", "3 3"},
}

var fallbackColors = []string{"#CC79A7", "#E69F00", "#56B4E9", "#F0E442"}

func styleOf(lib string, i int) (color, dash string) {
	if s, ok := libStyle[lib]; ok {
		return s.color, s.dash
	}
	return fallbackColors[i%len(fallbackColors)], ""
}

var panelTitles = map[string]string{
	"uncontended": "uncontended · Lock + Unlock",
	"extend":      "extend · one renewal round",
	"slow":        "slow node · Lock with node 0 delayed",
	"contended":   "contended · wait in Lock",
	"clients":     "clients · wait in Lock, an instance each",
	"handoff":     "handoff · Unlock → waiter holds it",
	"parallel":    "parallel · Lock + Unlock, a resource per client",
}

// writeSVG draws one panel per scenario with the empirical CDF of each
// library's latencies on a log-scaled time axis.
func writeSVG(w io.Writer, rep *Report) error {
	var scen []string
	byScen := map[string][]*Result{}
	var libsSeen []string
	for _, r := range rep.Results {
		if r.Summary.N == 0 {
			continue
		}
		if _, ok := byScen[r.Scenario]; !ok {
			scen = append(scen, r.Scenario)
		}
		byScen[r.Scenario] = append(byScen[r.Scenario], r)
		if !slices.Contains(libsSeen, r.Lib) {
			libsSeen = append(libsSeen, r.Lib)
		}
	}
	rows := max(1, (len(scen)+chartCols-1)/chartCols)
	height := chartHeaderH + rows*(panelH+panelGap) + chartMargin - panelGap + 24

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif">`+"\n",
		chartWidth, height, chartWidth, height)
	b.WriteString(`<style>
.t{font-size:20px;font-weight:600;fill:#1a1a1a}
.s{font-size:12.5px;fill:#555}
.pt{font-size:14px;font-weight:600;fill:#222}
.ax{font-size:11px;fill:#666}
.at{font-size:11.5px;fill:#444}
.lg{font-size:13px;fill:#222}
.grid{stroke:#e6e6e6;stroke-width:1}
.frame{fill:#fff;stroke:#d9d9d9;stroke-width:1}
.axis{stroke:#999;stroke-width:1}
</style>
`)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc("lockbench: lock latency CDFs · "+rep.Versions.String()))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fafafa"/>`+"\n", chartWidth, height)
	fmt.Fprintf(&b, `<text class="t" x="%d" y="%d">Lock latency: share of operations completed within a time</text>`+"\n", chartMargin, chartMargin+18)
	runs := fmt.Sprintf("%s per run", rep.Duration)
	if rep.Count > 1 {
		runs = fmt.Sprintf("%d runs of %s each, all samples", rep.Count, rep.Duration)
	}
	fmt.Fprintf(&b, `<text class="s" x="%d" y="%d">%s</text>`+"\n", chartMargin, chartMargin+40,
		esc(fmt.Sprintf("%s · TTL %s, %s · %s", rep.Nodes, rep.TTL, runs, rep.Started.Format("2006-01-02"))))
	fmt.Fprintf(&b, `<text class="s" x="%d" y="%d">%s</text>`+"\n", chartMargin, chartMargin+58, esc(rep.Versions.String()))
	fmt.Fprintf(&b, `<text class="s" x="%d" y="%d">%s</text>`+"\n", chartMargin, chartMargin+76,
		esc(rep.Machine+" · further left is faster; a curve that rises late or trails right waits · slow: node 0 +"+rep.Slow+" each way"))

	// Legend.
	lx := chartMargin
	ly := chartMargin + 102
	for i, lib := range libsSeen {
		color, dash := styleOf(lib, i)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>`+"\n", lx, ly-4, lx+26, ly-4, color, dashAttr(dash))
		fmt.Fprintf(&b, `<text class="lg" x="%d" y="%d">%s</text>`+"\n", lx+32, ly, esc(lib))
		lx += 32 + 9*len(lib) + 28
	}

	for k, s := range scen {
		px := chartMargin + (k%chartCols)*(panelW+panelGap)
		py := chartHeaderH + (k/chartCols)*(panelH+panelGap)
		drawPanel(&b, px, py, s, byScen[s], libsSeen)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func drawPanel(b *strings.Builder, px, py int, scen string, rs []*Result, libsSeen []string) {
	fmt.Fprintf(b, `<g transform="translate(%d,%d)">`+"\n", px, py)
	fmt.Fprintf(b, `<rect class="frame" width="%d" height="%d" rx="6"/>`+"\n", panelW, panelH)
	title := panelTitles[scen]
	if title == "" {
		title = scen
	}
	fmt.Fprintf(b, `<text class="pt" x="%d" y="24">%s</text>`+"\n", plotLeft, esc(title))

	x0, x1 := float64(plotLeft), float64(panelW-plotRight)
	y0, y1 := float64(panelH-plotBottom), float64(plotTop)

	// Time range over every curve of the panel, widened to whole 1-2-5 steps.
	lo, hi := time.Duration(math.MaxInt64), time.Duration(1)
	sorted := make([][]time.Duration, len(rs))
	for i, r := range rs {
		d := make([]time.Duration, len(r.Samples))
		for j, s := range r.Samples {
			d[j] = max(s.D, 1)
		}
		slices.Sort(d)
		sorted[i] = d
		lo, hi = min(lo, d[0]), max(hi, d[len(d)-1])
	}
	ticks := logTicks(lo, hi)
	lmin, lmax := math.Log10(float64(ticks[0])), math.Log10(float64(ticks[len(ticks)-1]))
	xOf := func(d time.Duration) float64 {
		return x0 + (math.Log10(float64(max(d, 1)))-lmin)/(lmax-lmin)*(x1-x0)
	}
	yOf := func(share float64) float64 { return y0 + share*(y1-y0) }

	// Grid and y labels.
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := yOf(q)
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(b, `<text class="ax" x="%.1f" y="%.1f" text-anchor="end">%d%%</text>`+"\n", x0-6, y+4, int(q*100))
	}
	y99 := yOf(0.99)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb" stroke-dasharray="2 3"/>`+"\n", x0, y99, x1, y99)
	fmt.Fprintf(b, `<text class="ax" x="%.1f" y="%.1f" text-anchor="end">p99</text>`+"\n", x1, y99-3)
	for _, t := range ticks {
		x := xOf(t)
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", x, y0, x, y1)
		fmt.Fprintf(b, `<text class="ax" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y0+16, esc(fmtTick(t)))
	}
	fmt.Fprintf(b, `<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", x0, y0, x1, y0)
	fmt.Fprintf(b, `<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n", x0, y0, x0, y1)
	fmt.Fprintf(b, `<text class="at" x="%.1f" y="%d" text-anchor="middle">latency (log scale)</text>`+"\n", (x0+x1)/2, panelH-8)
	fmt.Fprintf(b, `<text class="at" transform="translate(14,%.1f) rotate(-90)" text-anchor="middle">share of operations ≤ latency</text>`+"\n", (y0+y1)/2)

	// Curves: a step CDF, starting at 0 at the smallest sample.
	for i, r := range rs {
		color, dash := styleOf(r.Lib, slices.Index(libsSeen, r.Lib))
		pts := cdfPoints(sorted[i], cdfPointsMax)
		var p strings.Builder
		fmt.Fprintf(&p, "M%.1f,%.1f", xOf(pts[0].D), yOf(0))
		prev := 0.0
		for _, pt := range pts {
			x := xOf(pt.D)
			fmt.Fprintf(&p, " L%.1f,%.1f L%.1f,%.1f", x, yOf(prev), x, yOf(pt.Share))
			prev = pt.Share
		}
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="2.2" stroke-linejoin="round"%s><title>%s</title></path>`+"\n",
			p.String(), color, dashAttr(dash), esc(fmt.Sprintf("%s: p50 %s, p99 %s, max %s (%d ops)", r.Lib, fmtDur(r.Summary.P50), fmtDur(r.Summary.P99), fmtDur(r.Summary.Max), r.Summary.N)))
		// The median as a dot, labelled in the tooltip.
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.2" fill="%s"/>`+"\n", xOf(r.Summary.P50), yOf(0.5), color)
	}
	b.WriteString("</g>\n")
}

// logTicks returns the 1-2-5 steps that cover [lo, hi], thinned to whole
// decades when there would be more than eight.
func logTicks(lo, hi time.Duration) []time.Duration {
	lo, hi = max(lo, 1), max(hi, 1)
	var all []time.Duration
	for dec := time.Duration(1); dec <= time.Hour; dec *= 10 {
		for _, m := range []time.Duration{1, 2, 5} {
			all = append(all, m*dec)
		}
	}
	first, last := 0, len(all)-1
	for i, t := range all {
		if t <= lo {
			first = i
		}
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i] >= hi {
			last = i
		}
	}
	ticks := all[first : last+1]
	if len(ticks) < 2 {
		ticks = all[first : first+2]
	}
	if len(ticks) > 8 {
		var dec []time.Duration
		for _, t := range ticks {
			if isPow10(int64(t)) {
				dec = append(dec, t)
			}
		}
		if dec[0] > ticks[0] {
			dec = append([]time.Duration{dec[0] / 10}, dec...)
		}
		if dec[len(dec)-1] < ticks[len(ticks)-1] {
			dec = append(dec, dec[len(dec)-1]*10)
		}
		ticks = dec
	}
	return ticks
}

// fmtTick prints a 1-2-5 tick without trailing zeros: 50µs, 1ms, 200ms.
func fmtTick(d time.Duration) string {
	for _, u := range []struct {
		name string
		size time.Duration
	}{{"s", time.Second}, {"ms", time.Millisecond}, {"µs", time.Microsecond}} {
		if d >= u.size && d%u.size == 0 {
			return fmt.Sprintf("%d%s", d/u.size, u.name)
		}
	}
	return fmtDur(d)
}

func isPow10(v int64) bool {
	for v >= 10 && v%10 == 0 {
		v /= 10
	}
	return v == 1
}

func dashAttr(d string) string {
	if d == "" {
		return ""
	}
	return ` stroke-dasharray="` + d + `"`
}

func esc(s string) string { return html.EscapeString(s) }
