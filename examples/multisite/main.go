// Command multisite is a multi-site LuffyMQ demo on one machine: it starts
// one RabbitMQ node and one luffymq broker per site, joins the sites through
// RabbitMQ exchange federation (full mesh) over links delayed like the
// cities of scenarios.md §C, publishes MQTT messages at the first site and
// prints how many messages each site's MQTT subscriber received and how
// late. It needs the Debian package rabbitmq-server.
//
//	go run ./examples/multisite -sites berlin,tunis,tokyo -n 50
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

func main() {
	sites := flag.String("sites", "berlin,tunis,tokyo", "comma-separated site names (cities of scenarios.md §C get their delays)")
	n := flag.Int("n", 50, "messages to publish at the first site (10 per second)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, strings.Split(*sites, ","), *n); err != nil {
		fmt.Fprintln(os.Stderr, "multisite:", err)
		os.Exit(1)
	}
}

// receiver records when each numbered message arrived.
type receiver struct {
	mu      sync.Mutex
	warm    bool // a warm-up message arrived
	latency []time.Duration
}

func run(ctx context.Context, sites []string, n int) error {
	if len(sites) < 2 {
		return errors.New("-sites needs at least two names")
	}
	fmt.Printf("starting %d RabbitMQ nodes (about 20 s)...\n", len(sites))
	h, err := rabbitharness.Start(ctx, rabbitharness.Config{Sites: sites})
	if err != nil {
		return err
	}
	defer h.Close()

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	brokers := map[string]*broker.Broker{}
	for _, s := range sites {
		b, err := broker.New(broker.Config{MQTTListen: "127.0.0.1:0", Logger: quiet, AMQPURL: h.Node(s).AMQPURL(), Site: s, Exports: []string{"demo/#"}})
		if err != nil {
			return err
		}
		if err := b.Start(); err != nil {
			return err
		}
		defer b.Close()
		brokers[s] = b
	}
	for _, s := range sites {
		n := h.Node(s)
		var linkErr error
		ups := bridge.FullMesh(s, sites, func(from, to string) string {
			l, err := h.Link(h.Node(from), h.Node(to))
			if err != nil {
				linkErr = err
				return ""
			}
			fmt.Printf("link %-12s -> %-12s one-way delay %v\n", from, to, l.Delay)
			return l.AMQPURL()
		})
		if linkErr != nil {
			return linkErr
		}
		if err := bridge.ApplyFederation(ctx, bridge.FederationConfig{ManagementURL: n.ManagementURL(),
			Username: rabbitharness.User, Password: rabbitharness.Password, Upstreams: ups, MaxHops: 1}); err != nil {
			return err
		}
	}

	recv := map[string]*receiver{}
	for _, s := range sites {
		r := &receiver{}
		recv[s] = r
		c, err := connect(ctx, brokers[s].MQTTAddr(), "demo-sub-"+s, func(p *paho.Publish) {
			r.mu.Lock()
			defer r.mu.Unlock()
			switch {
			case p.Topic == "demo/warmup":
				r.warm = true
			case len(p.Payload) == 8:
				sent := time.Unix(0, int64(binary.BigEndian.Uint64(p.Payload)))
				r.latency = append(r.latency, time.Since(sent))
			}
		})
		if err != nil {
			return err
		}
		defer c.Disconnect(&paho.Disconnect{})
		if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "demo/#", QoS: 1}}}); err != nil {
			return err
		}
	}
	pub, err := connect(ctx, brokers[sites[0]].MQTTAddr(), "demo-pub", nil)
	if err != nil {
		return err
	}
	defer pub.Disconnect(&paho.Disconnect{})

	// Bindings travel to the other sites through federation: warm up
	// until every site hears the publisher.
	fmt.Println("waiting for federation links and bindings...")
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "demo/warmup", QoS: 1, Payload: []byte("warmup")}); err != nil {
			return err
		}
		if allWarm(recv) {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("federation did not come up within 60 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}

	fmt.Printf("publishing %d QoS 1 messages at %s, 10 per second...\n", n, sites[0])
	rate := time.NewTicker(100 * time.Millisecond)
	defer rate.Stop()
	for range n {
		payload := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "demo/data", QoS: 1, Payload: payload}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-rate.C:
		}
	}
	drain := time.NewTimer(2 * time.Second) // let the farthest site catch up
	<-drain.C
	fmt.Printf("\n%-12s %8s %10s %10s %10s\n", "site", "received", "mean", "median", "max")
	for _, s := range sites {
		r := recv[s]
		r.mu.Lock()
		lat := slices.Clone(r.latency)
		r.mu.Unlock()
		slices.Sort(lat)
		var sum time.Duration
		for _, l := range lat {
			sum += l
		}
		if len(lat) == 0 {
			fmt.Printf("%-12s %8d\n", s, 0)
			continue
		}
		fmt.Printf("%-12s %8d %10v %10v %10v\n", s, len(lat), (sum / time.Duration(len(lat))).Round(time.Millisecond),
			lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}
	return nil
}

// allWarm reports whether every site has heard a warm-up message.
func allWarm(recv map[string]*receiver) bool {
	for _, r := range recv {
		r.mu.Lock()
		warm := r.warm
		r.mu.Unlock()
		if !warm {
			return false
		}
	}
	return true
}

func connect(ctx context.Context, addr, id string, on func(*paho.Publish)) (*paho.Client, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			if on != nil {
				on(pr.Packet)
			}
			return true, nil
		},
	}})
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}); err != nil {
		return nil, err
	}
	return c, nil
}
