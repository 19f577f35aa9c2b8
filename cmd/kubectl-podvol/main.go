// Command kubectl-podvol is `kubectl podvol`, a kubectl plugin (on the PATH,
// kubectl runs it for `kubectl podvol ...`): podvol's pools, volumes and
// released volumes from the Kubernetes API, and the reclaim of a released
// volume. The logic is internal/kubectlplugin.
package main

import (
	"fmt"
	"os"

	"github.com/podvol/podvol/internal/kubectlplugin"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Println("kubectl-podvol", version)
		return
	}
	os.Exit(kubectlplugin.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
