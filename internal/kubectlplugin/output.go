package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Output formats (-o).
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

var outputs = []string{OutputTable, OutputJSON, OutputYAML}

// HumanBytes writes a size as kubectl users read quantities: in binary
// units, with one decimal when it is not whole (1.5Gi).
func HumanBytes(n int64) string {
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
	if n < 1024 && n > -1024 {
		return strconv.FormatInt(n, 10)
	}
	f, u := float64(n), 0
	for (f >= 1024 || f <= -1024) && u < len(units)-1 {
		f /= 1024
		u++
	}
	s := strconv.FormatFloat(f, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + units[u]
}

func humanPtr(n *int64) string {
	if n == nil {
		return "-"
	}
	return HumanBytes(*n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}

// structured writes v as JSON or YAML under key (one list per command, so
// that the documents can grow fields).
func structured(w io.Writer, format, key string, v any) error {
	doc := map[string]any{key: v}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if format == OutputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// PrintStatus writes `kubectl podvol status`.
func PrintStatus(w io.Writer, format string, rows []NodeStatus) error {
	if format != OutputTable {
		return structured(w, format, "nodes", rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPOOL\tSIZE\tALLOCATED\tFREE\tVOLUMES\tSNAPSHOTS\tRELEASED\tVERSION\tHEALTH")
	for _, r := range rows {
		vols := strconv.Itoa(r.Volumes)
		if r.InlineVolumes > 0 {
			vols = fmt.Sprintf("%d (%d inline)", r.Volumes, r.InlineVolumes)
		}
		health := "ok"
		if len(r.Health) > 0 {
			health = strings.Join(r.Health, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Node, r.Pool, humanPtr(r.PoolBytes), HumanBytes(r.AllocatedBytes),
			humanPtr(r.FreeBytes), vols, r.Snapshots, r.Released, dash(r.Version), health)
	}
	return tw.Flush()
}

// PrintVolumes writes `kubectl podvol volumes`; why USED is "-", when the
// reason is not that no pod mounts the volume, goes to notes.
func PrintVolumes(w, notes io.Writer, format string, rows []Volume) error {
	if format != OutputTable {
		return structured(w, format, "volumes", rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLAIM\tPODS\tNODE\tSIZE\tUSED\tCLASS\tDIRECT\tSNAPSHOTS")
	why := map[string]bool{}
	for _, r := range rows {
		ns, claim, _ := strings.Cut(r.Claim, "/")
		if r.Inline != "" {
			var pod, vol string
			ns, pod, _ = strings.Cut(r.Inline, "/")
			pod, vol, _ = strings.Cut(pod, "/")
			claim = "(inline " + pod + "/" + vol + ")"
		}
		var pods []string
		for _, p := range r.Pods {
			pns, name, _ := strings.Cut(p, "/")
			if pns != ns {
				name = p
			}
			pods = append(pods, name)
		}
		var snaps []string
		for _, s := range r.Snapshots {
			sns, name, _ := strings.Cut(s, "/")
			if sns != ns {
				name = s
			}
			snaps = append(snaps, name)
		}
		if r.UsedBytes == nil && r.UsedUnknown != "" {
			why[r.UsedUnknown] = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(ns), dash(claim), list(pods), dash(r.Node), HumanBytes(r.Bytes),
			humanPtr(r.UsedBytes), dash(r.Class), r.Direct, list(snaps))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var reasons []string
	for k := range why {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for _, k := range reasons {
		fmt.Fprintf(notes, "USED -: %s\n", k)
	}
	return nil
}

// PrintReleased writes `kubectl podvol released`.
func PrintReleased(w io.Writer, format string, rows []ReleasedVolume) error {
	if format != OutputTable {
		return structured(w, format, "released", rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPV\tVOLUME\tCLAIM\tRELEASED\tNODE STATE\tRECLAIM")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.PV, dash(r.Handle), dash(r.Claim), dash(r.Released), r.NodeState, r.Reclaim)
	}
	return tw.Flush()
}
