// Command init is PID 1 of a NodeGate dev real node (no systemd runs there).
//
// It does what a real init must do and a shell cannot do reliably: it reaps every orphan that is
// re-parented to it (containerd shims among them), and it hands SIGTERM on to the node's processes
// before it exits. It runs one child, the node's boot script; when that child ends, the node is down.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: init PROGRAM [ARG...]")
		os.Exit(2)
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	boot := exec.Command(os.Args[1], os.Args[2:]...)
	boot.Stdin, boot.Stdout, boot.Stderr = nil, os.Stdout, os.Stderr
	if err := boot.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "init: cannot start %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			// Shutdown: everyone gets SIGTERM, then whatever is left ends with us (the kernel kills
			// every process of a PID namespace whose init exits).
			_ = syscall.Kill(-1, syscall.SIGTERM)
			time.Sleep(3 * time.Second)
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == boot.Process.Pid {
				fmt.Fprintf(os.Stderr, "init: the boot script ended (%v); the node stops\n", status)
				os.Exit(status.ExitStatus())
			}
		}
	}
}
