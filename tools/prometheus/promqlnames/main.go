// Command promqlnames parses PromQL expressions with Prometheus' own parser
// (the version tools/prometheus/go.mod pins) and prints the metric names each
// selects. podvol's tests use it to check the alert rules and the Grafana
// dashboard against the metrics podvol exports, without the main module
// depending on Prometheus.
//
// Input (stdin): a JSON array of expressions. Output (stdout): a JSON array,
// one object per expression in order: {"expr", "metrics", "error"}. It exits
// 0 whether or not the expressions parse; the caller judges.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintf(os.Stderr, "promqlnames: stdin must be a JSON array of strings: %v\n", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	out := make([]result, 0, len(exprs))
	for _, e := range exprs {
		r := result{Expr: e, Metrics: []string{}}
		expr, err := p.ParseExpr(e)
		if err != nil {
			r.Error = err.Error()
			out = append(out, r)
			continue
		}
		names := map[string]bool{}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name == "" {
				r.Error = fmt.Sprintf("selector %s names no metric: it cannot be checked against what podvol exports", vs)
				return nil
			}
			names[name] = true
			return nil
		})
		for n := range names {
			r.Metrics = append(r.Metrics, n)
		}
		sort.Strings(r.Metrics)
		out = append(out, r)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "promqlnames: %v\n", err)
		os.Exit(1)
	}
}
