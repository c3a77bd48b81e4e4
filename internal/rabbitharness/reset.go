package rabbitharness

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
)

// Reset returns the harness to the state Start left it in, for the next
// test: every link accepts connections again, every virtual host but "/"
// is deleted and "/" is emptied of what tests declare (policies, runtime
// parameters such as federation upstreams, queues with their messages,
// exchanges other than the default and amq.* ones, and with them their
// bindings and federation links). "/" itself stays: the event exchange
// plugin declares amq.rabbitmq.event in it once, at boot. Every node must
// be running.
//
// Without it, what the tests of one package leave behind accumulates:
// each federation link is a connection and an Erlang process that keeps
// consuming, and after a few dozen tests the nodes' management APIs
// answered in seconds and every test ran several times slower.
func (h *Harness) Reset(ctx context.Context) error {
	h.mu.Lock()
	links := make([]*Link, 0, len(h.links))
	for _, l := range h.links {
		links = append(links, l)
	}
	h.mu.Unlock()
	for _, l := range links {
		if err := l.Restore(); err != nil {
			return err
		}
	}
	for _, n := range h.nodes {
		if err := n.reset(ctx); err != nil {
			return fmt.Errorf("rabbitharness: resetting %s: %w", n.Site, err)
		}
	}
	h.mu.Lock()
	h.resets++
	h.mu.Unlock()
	return nil
}

// Resets counts the calls to Reset that succeeded: state a test set up
// on the nodes (a federation mesh, say) is gone once it changes.
func (h *Harness) Resets() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resets
}

// reset deletes every virtual host of the node but "/" and empties "/".
func (n *Node) reset(ctx context.Context) error {
	rh, err := rabbithole.NewClient(n.ManagementURL(), User, Password)
	if err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok {
		rh.SetTimeout(time.Until(deadline))
	} else {
		rh.SetTimeout(30 * time.Second)
	}
	vhosts, err := rh.ListVhosts()
	if err != nil {
		return fmt.Errorf("listing virtual hosts: %w", err)
	}
	for _, v := range vhosts {
		if v.Name == "/" {
			continue
		}
		if err := answered(rh.DeleteVhost(v.Name)); err != nil {
			return fmt.Errorf("deleting virtual host %q: %w", v.Name, err)
		}
	}
	// Policies and upstreams first: their federation links stop before
	// the exchanges and queues they feed go.
	policies, err := rh.ListPolicies()
	if err != nil {
		return fmt.Errorf("listing policies: %w", err)
	}
	for _, p := range policies {
		if p.Vhost == "/" {
			if err := answered(rh.DeletePolicy(p.Vhost, p.Name)); err != nil {
				return fmt.Errorf("deleting policy %q: %w", p.Name, err)
			}
		}
	}
	params, err := rh.ListRuntimeParameters()
	if err != nil {
		return fmt.Errorf("listing runtime parameters: %w", err)
	}
	for _, p := range params {
		if p.Vhost == "/" {
			if err := answered(rh.DeleteRuntimeParameter(p.Component, p.Vhost, p.Name)); err != nil {
				return fmt.Errorf("deleting %s %q: %w", p.Component, p.Name, err)
			}
		}
	}
	queues, err := rh.ListQueuesIn("/")
	if err != nil {
		return fmt.Errorf("listing queues: %w", err)
	}
	for _, q := range queues {
		if err := answered(rh.DeleteQueue("/", q.Name)); err != nil {
			return fmt.Errorf("deleting queue %q: %w", q.Name, err)
		}
	}
	exchanges, err := rh.ListExchangesIn("/")
	if err != nil {
		return fmt.Errorf("listing exchanges: %w", err)
	}
	for _, e := range exchanges {
		if e.Name == "" || strings.HasPrefix(e.Name, "amq.") {
			continue
		}
		if err := answered(rh.DeleteExchange("/", e.Name)); err != nil {
			return fmt.Errorf("deleting exchange %q: %w", e.Name, err)
		}
	}
	return nil
}

// answered closes a management API response. rabbit-hole turns answers
// of 400 and above into errors, except a 404 to a DELETE: what is to be
// deleted is gone already (an auto-delete queue or exchange, say).
func answered(res *http.Response, err error) error {
	if err != nil {
		return err
	}
	res.Body.Close()
	return nil
}
