package rabbitharness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// process returns the node's current start script process and the channel
// closed when it exits (nil before the first start).
func (n *Node) process() (*exec.Cmd, chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd, n.exited
}

// node returns the node of site or an error.
func (h *Harness) node(site string) (*Node, error) {
	n := h.bySite[site]
	if n == nil {
		return nil, fmt.Errorf("rabbitharness: no node for site %q", site)
	}
	return n, nil
}

// KillNode crashes site's node: SIGKILL to its process group (the start
// script and the Erlang VM), as a crash or power loss would, without
// RabbitMQ's shutdown. It returns once every process of the node is gone
// (the harness's epmd, which other nodes use, stays); its ports are then
// free for RestartNode. Clients see their connections reset.
func (h *Harness) KillNode(site string) error {
	n, err := h.node(site)
	if err != nil {
		return err
	}
	cmd, exited := n.process()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("rabbitharness: node %s was never started", n.Name)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if err := n.waitGone(exited, 10*time.Second); err != nil {
		return err
	}
	return n.reservePorts()
}

// StopNode stops site's node cleanly (SIGTERM: RabbitMQ closes its
// connections and queues and exits) and returns once every process of the
// node is gone, within timeout (60 s when 0); past it the node is killed.
func (h *Harness) StopNode(site string, timeout time.Duration) error {
	n, err := h.node(site)
	if err != nil {
		return err
	}
	if timeout <= 0 {
		timeout = time.Minute
	}
	cmd, exited := n.process()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("rabbitharness: node %s was never started", n.Name)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err := n.waitGone(exited, 10*time.Second); err != nil {
		return err
	}
	return n.reservePorts()
}

// reservePorts keeps the stopped node's ports (AMQP, management,
// distribution) from anyone else until RestartNode: while the node is down
// they are free, and any process on the machine could take one, as a
// listener on port 0 or as the local port of an outgoing connection (the
// node's ports lie in the ephemeral range). One CI run's restart failed
// so: the node booted, could not bind a port and stopped itself. Other
// sites' federation upstreams hold the node's AMQP URI, so it must come
// back on the same ports.
//
// Each port is held by a socket bound to 127.0.0.1 with SO_REUSEADDR and
// never listening. Linux then refuses the port to a bind that does not set
// SO_REUSEADDR, to a bind on port 0, and to connect's choice of a local
// port, but lets a listener that sets SO_REUSEADDR bind it, as RabbitMQ's
// listeners and the Erlang distribution do: the node can start while the
// reservation holds, so no gap is left between release and bind.
func (n *Node) reservePorts() error {
	var fds []int
	for _, port := range []int{n.amqpPort, n.mgmtPort, n.distPort} {
		fd, err := reservePort(port)
		if err != nil {
			for _, f := range fds {
				_ = syscall.Close(f)
			}
			return fmt.Errorf("rabbitharness: node %s: reserving port %d while it is down: %w", n.Name, port, err)
		}
		fds = append(fds, fd)
	}
	n.mu.Lock()
	n.reserved = fds
	n.mu.Unlock()
	return nil
}

// releasePorts closes the sockets of reservePorts.
func (n *Node) releasePorts() {
	n.mu.Lock()
	fds := n.reserved
	n.reserved = nil
	n.mu.Unlock()
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// reservePort binds a TCP socket to 127.0.0.1:port with SO_REUSEADDR,
// without listening, and returns its descriptor.
func reservePort(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// waitGone waits until the node's start script exited and no process
// carrying its marker (the VM, erl_child_setup, inet_gethost; not epmd)
// is alive, killing those left.
func (n *Node) waitGone(exited <-chan struct{}, timeout time.Duration) error {
	select {
	case <-exited:
	case <-time.After(timeout):
		return fmt.Errorf("rabbitharness: node %s did not exit within %v", n.Name, timeout)
	}
	return killAll(func() []int {
		var pids []int
		for _, pid := range markedPIDs(func(v string) bool { return v == n.marker }) {
			if comm, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "comm")); err == nil && strings.TrimSpace(string(comm)) == "epmd" {
				continue // shared by the harness's nodes
			}
			pids = append(pids, pid)
		}
		return pids
	})
}

// RestartNode starts site's node again after KillNode or StopNode: the
// same node name, ports, configuration and data directory (its durable
// queues, persistent messages, policies, parameters and federation
// upstreams come back). It returns once the node answers, as Start does,
// or an error (ctx's deadline, else Config.StartTimeout, bounds the wait).
func (h *Harness) RestartNode(ctx context.Context, site string) error {
	n, err := h.node(site)
	if err != nil {
		return err
	}
	if _, exited := n.process(); exited != nil {
		select {
		case <-exited:
		default:
			return fmt.Errorf("rabbitharness: node %s is still running", n.Name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.StartTimeout)
	defer cancel()
	defer n.releasePorts() // once the node holds them, or has failed
	return h.startNode(ctx, n)
}
