package main

import (
	"bufio"
	"strconv"
	"strings"
)

// Scrape is what the benchmark reads from one node's /metrics.
type Scrape struct {
	Ops     OpTotals
	Volumes int // podvol_volumes, every kind
}

// ParseMetrics reads the Prometheus text format for
// podvol_csi_operation_duration_seconds_{sum,count} (summed over codes, by
// method) and podvol_volumes (summed over kinds).
func ParseMetrics(text string) Scrape {
	s := Scrape{Ops: OpTotals{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch name {
		case "podvol_csi_operation_duration_seconds_sum", "podvol_csi_operation_duration_seconds_count":
			m := labels["method"]
			v := s.Ops[m]
			if strings.HasSuffix(name, "_sum") {
				v[0] += value
			} else {
				v[1] += value
			}
			s.Ops[m] = v
		case "podvol_volumes":
			s.Volumes += int(value)
		}
	}
	return s
}

// splitSample splits `name{a="b",c="d"} value [timestamp]`.
func splitSample(line string) (string, map[string]string, float64, bool) {
	labels := map[string]string{}
	var name, rest string
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name, rest = line[:i], strings.TrimSpace(line[j+1:])
		for _, kv := range strings.Split(line[i+1:j], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
		}
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return "", nil, 0, false
		}
		name, rest = f[0], strings.Join(f[1:], " ")
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, false
	}
	return name, labels, v, true
}
