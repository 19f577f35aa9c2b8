package devcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// The dev cluster's Service networking, for the one Service podvol uses:
// `kubernetes`, which every in-cluster client reaches at its ClusterIP
// (KUBERNETES_SERVICE_HOST and _PORT, which the kubelet puts in every
// container). A real cluster's kube-proxy DNATs the ClusterIP to the API
// server's advertised address; here the API server listens on loopback only
// (nothing of the dev cluster listens on a network), so kube-proxy's rule
// would reach nothing. serviceNet programs the same translation to the
// loopback listener instead, so that podvol's manifests run unpatched:
//   - the nodes' bridge, with route_localnet on it, so that a packet from a
//     node or a pod (nodes route everything they do not hold to the host)
//     DNATed to 127.0.0.1 may be routed there;
//   - a route to the ClusterIP through the bridge, so that a packet from the
//     host itself has a route before the nat OUTPUT chain rewrites it;
//   - a nat chain of podvol-dev's own, jumped to from PREROUTING (nodes and
//     their pods) and OUTPUT (the host), DNATing ClusterIP:443 to the API
//     server.
const (
	serviceCIDR  = "10.0.0.0/24"
	apiServiceIP = "10.0.0.1" // the first address of serviceCIDR
	natChain     = "PODVOL-DEV-SERVICES"
)

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func iptables(args ...string) error {
	if out, err := exec.Command("iptables", append([]string{"-w", "-t", "nat"}, args...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("iptables -t nat %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// serviceNet sets up the bridge and the translation of the kubernetes
// Service; running it again changes nothing. The bridge is the network the
// nodes are on (see Node); the host routes between them and to their pods.
func (c *Cluster) serviceNet() error {
	if ipCmd("link", "show", bridge) != nil {
		if err := ipCmd("link", "add", bridge, "type", "bridge"); err != nil {
			return err
		}
	}
	if out, _ := exec.Command("ip", "-4", "addr", "show", "dev", bridge).Output(); !strings.Contains(string(out), hostGateway+"/") {
		if err := ipCmd("addr", "add", hostGateway+"/24", "dev", bridge); err != nil {
			return err
		}
	}
	if err := ipCmd("link", "set", bridge, "up"); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+bridge+"/route_localnet", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("allow routing to loopback from the nodes' bridge: %w", err)
	}
	if err := ipCmd("route", "replace", apiServiceIP+"/32", "dev", bridge, "src", hostGateway); err != nil {
		return err
	}
	_ = c.removeServiceRules()
	for _, rule := range [][]string{
		{"-N", natChain},
		{"-A", natChain, "-d", apiServiceIP + "/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", "127.0.0.1:6443",
			"-m", "comment", "--comment", "podvol-dev: the kubernetes Service, to the API server on loopback"},
		{"-I", "PREROUTING", "-j", natChain},
		{"-I", "OUTPUT", "-j", natChain},
	} {
		if err := iptables(rule...); err != nil {
			return err
		}
	}
	c.p.note("the kubernetes Service (%s:443) leads to the API server on 127.0.0.1:6443 for the nodes and their pods", apiServiceIP)
	return nil
}

// removeServiceRules removes podvol-dev's nat chain and the jumps to it,
// whatever is left of them; the bridge takes its route with it.
func (c *Cluster) removeServiceRules() error {
	var errs []error
	for _, from := range []string{"PREROUTING", "OUTPUT"} {
		for iptables("-C", from, "-j", natChain) == nil {
			if err := iptables("-D", from, "-j", natChain); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if iptables("-S", natChain) == nil {
		for _, op := range []string{"-F", "-X"} {
			if err := iptables(op, natChain); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
