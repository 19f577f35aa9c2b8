// Command pause is the sandbox image's process: it sleeps until signalled.
// Built into the dev cluster's pause image (no registry to pull one from).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
