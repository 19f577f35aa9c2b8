package kubectlplugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const usage = `kubectl podvol: podvol's pools, volumes and released volumes, from the Kubernetes API.

Usage:
  kubectl podvol status                per node: pool size, allocated, free, volumes, snapshots,
                                       released volumes, plugin version, health
  kubectl podvol volumes [--node N]    podvol's volumes: claim, pods, node, size, used, class,
                                       direct-assigned, snapshots (-n NAMESPACE, or -A)
  kubectl podvol released              volumes node-loss released from lost nodes, each with the
                                       command that reclaims it
  kubectl podvol reclaim NODE PV       delete a released volume from its node's pool (which must be
                                       back) and drop its record; asks first unless --yes

Flags:
`

// Main runs kubectl-podvol with args (without the program's name) and
// returns its exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kubectl-podvol", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		kubeconfig = fs.String("kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
		kubeCtx    = fs.String("context", "", "the kubeconfig context to use")
		namespace  = fs.StringP("namespace", "n", "", "volumes: the claims' namespace (default: the context's)")
		all        = fs.BoolP("all-namespaces", "A", false, "volumes: claims of every namespace")
		output     = fs.StringP("output", "o", OutputTable, "output format: "+strings.Join(outputs, ", "))
		podvolNS   = fs.String("podvol-namespace", DefaultNamespace, "the namespace podvol runs in (its node pods and node-loss's records)")
		node       = fs.String("node", "", "volumes: only those on this node")
		yes        = fs.BoolP("yes", "y", false, "reclaim: do not ask for confirmation")
		timeout    = fs.Duration("timeout", 3*time.Minute, "reclaim: how long to wait for the claim to bind and for the volume to be deleted")
		noStats    = fs.Bool("no-stats", false, "volumes: do not read the kubelets' stats (USED); they need get nodes/proxy")
	)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 1
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
	if !slices.Contains(outputs, *output) {
		return fail(fmt.Errorf("-o %s: want one of %s", *output, strings.Join(outputs, ", ")))
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 1
	}
	cmd, rest := rest[0], rest[1:]
	want := map[string]int{"status": 0, "volumes": 0, "released": 0, "reclaim": 2}
	n, ok := want[cmd]
	if !ok {
		fs.Usage()
		return fail(fmt.Errorf("unknown command %q: want status, volumes, released or reclaim", cmd))
	}
	if len(rest) != n {
		if cmd == "reclaim" {
			return fail(fmt.Errorf("reclaim takes NODE and PV (kubectl podvol released lists them), got %q", rest))
		}
		return fail(fmt.Errorf("%s takes no arguments, got %q", cmd, rest))
	}

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: *kubeCtx}
	overrides.Context.Namespace = *namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	if *all {
		ns = ""
	}
	cfg.UserAgent = "kubectl-podvol"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	c := Clients{Kube: kube, Dynamic: dyn}
	if !*noStats {
		c.Summary = NodeProxySummary(kube)
	}
	// reclaim waits twice (the claim bound, the volume deleted), each up
	// to --timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2**timeout+time.Minute)
	defer cancel()

	switch cmd {
	case "reclaim":
		o := ReclaimOptions{Namespace: *podvolNS, Out: stdout, Timeout: *timeout, Poll: time.Second}
		if !*yes {
			in := bufio.NewReader(stdin)
			o.Confirm = func(plan string) (bool, error) {
				fmt.Fprintf(stderr, "%s\nReclaim? [y/N] ", plan)
				line, err := in.ReadString('\n')
				if err != nil && line == "" {
					fmt.Fprintln(stderr)
					return false, fmt.Errorf("no answer (pass --yes to reclaim without a question): %w", ErrNotConfirmed)
				}
				a := strings.ToLower(strings.TrimSpace(line))
				return a == "y" || a == "yes", nil
			}
		}
		if err := Reclaim(ctx, c, rest[0], rest[1], o); err != nil {
			if errors.Is(err, ErrNotConfirmed) {
				return fail(fmt.Errorf("%w: nothing was changed", err))
			}
			return fail(err)
		}
		return 0
	}
	st, err := Gather(ctx, c, *podvolNS, GatherOptions{Pods: cmd != "released", Stats: cmd == "volumes"})
	if err != nil {
		return fail(err)
	}
	switch cmd {
	case "status":
		err = PrintStatus(stdout, *output, st.Status())
	case "volumes":
		err = PrintVolumes(stdout, stderr, *output, st.Volumes(VolumeFilter{Namespace: ns, Node: *node}))
	case "released":
		rows := st.Released()
		if len(rows) == 0 && *output == OutputTable {
			fmt.Fprintf(stderr, "No released volumes recorded in %s.\n", *podvolNS)
			return 0
		}
		err = PrintReleased(stdout, *output, rows)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}
