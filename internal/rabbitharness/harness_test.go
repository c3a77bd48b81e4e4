package rabbitharness

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestCityDelay(t *testing.T) {
	tests := []struct {
		a, b string
		want time.Duration
	}{
		{"berlin", "tunis", 22 * time.Millisecond},
		{"Tunis", "Berlin", 22 * time.Millisecond},
		{"Montréal", "Mexico City", 33 * time.Millisecond},
		{"tokyo-2", "tunis", 120 * time.Millisecond},
		{"mexico-city", "tokyo", 75 * time.Millisecond},
		{"berlin", "berlin", 0},
		{"paris", "berlin", 0},
	}
	for _, tt := range tests {
		t.Run(tt.a+"/"+tt.b, func(t *testing.T) {
			require.Equal(t, tt.want, CityDelay(tt.a, tt.b))
		})
	}
}

// amqpHandshake sends the AMQP protocol header to addr and returns how long
// the server took to answer with its first frame.
func amqpHandshake(addr string) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return 0, err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func TestHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts RabbitMQ nodes")
	}
	h := StartT(t, Config{Sites: []string{"berlin", "tunis"}})
	berlin, tunis := h.Node("berlin"), h.Node("tunis")
	require.NotNil(t, berlin)
	require.NotNil(t, tunis)
	require.NotEqual(t, berlin.Name, tunis.Name)
	require.Regexp(t, `^site-berlin-[0-9a-f]+@localhost$`, berlin.Name)

	t.Run("management and plugins", func(t *testing.T) {
		for _, n := range h.Nodes() {
			req, err := http.NewRequest(http.MethodGet, n.ManagementURL()+"/api/overview", nil)
			require.NoError(t, err)
			req.SetBasicAuth(User, Password)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			var overview struct {
				Node          string `json:"node"`
				ExchangeTypes []struct {
					Name string `json:"name"`
				} `json:"exchange_types"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&overview))
			resp.Body.Close()
			require.Equal(t, n.Name, overview.Node)
			var types []string
			for _, et := range overview.ExchangeTypes {
				types = append(types, et.Name)
			}
			require.Contains(t, types, "x-consistent-hash")
			require.Contains(t, types, "x-federation-upstream")
		}
	})

	t.Run("link delays, cuts and restores", func(t *testing.T) {
		link, err := h.Link(berlin, tunis)
		require.NoError(t, err)
		again, err := h.Link(berlin, tunis)
		require.NoError(t, err)
		require.Same(t, link, again)
		require.Equal(t, 22*time.Millisecond, link.Delay)

		rtt, err := amqpHandshake(link.Addr())
		require.NoError(t, err)
		require.GreaterOrEqual(t, rtt, 2*link.Delay, "a round trip crosses the link twice")
		direct, err := amqpHandshake(tunis.AMQPAddr())
		require.NoError(t, err)
		require.Less(t, direct, rtt)

		link.Cut()
		_, err = amqpHandshake(link.Addr())
		require.Error(t, err, "a cut link refuses connections")
		require.NoError(t, link.Restore())
		_, err = amqpHandshake(link.Addr())
		require.NoError(t, err)
	})

	t.Run("reset empties the nodes and restores cut links", func(t *testing.T) {
		ch := amqpChannel(t, berlin.AMQPURL())
		_, err := ch.QueueDeclare("left-behind", true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.PublishWithContext(context.Background(), "", "left-behind", false, false, amqp.Publishing{Body: []byte("x")}))
		require.NoError(t, ch.ExchangeDeclare("left-behind-x", "fanout", true, false, false, false, nil))
		rh, err := rabbithole.NewClient(berlin.ManagementURL(), User, Password)
		require.NoError(t, err)
		res, err := rh.PutPolicy("/", "left-behind-p", rabbithole.Policy{Pattern: "^left", ApplyTo: "queues", Definition: rabbithole.PolicyDefinition{"max-length": 5}})
		require.NoError(t, err)
		res.Body.Close()
		berlin.AddVhost(t, "other")
		link, err := h.Link(berlin, tunis)
		require.NoError(t, err)
		link.Cut()
		before := h.Resets()

		require.NoError(t, h.Reset(context.Background()))
		require.Equal(t, before+1, h.Resets())
		_, err = amqpHandshake(link.Addr())
		require.NoError(t, err, "a cut link accepts connections again")
		vhosts, err := rh.ListVhosts()
		require.NoError(t, err)
		require.Len(t, vhosts, 1)
		require.Equal(t, "/", vhosts[0].Name)
		queues, err := rh.ListQueues()
		require.NoError(t, err)
		require.Empty(t, queues, "the queue a test declared is gone with its message")
		policies, err := rh.ListPolicies()
		require.NoError(t, err)
		require.Empty(t, policies)
		exchanges, err := rh.ListExchangesIn("/")
		require.NoError(t, err)
		var names []string
		for _, e := range exchanges {
			names = append(names, e.Name)
		}
		require.NotContains(t, names, "left-behind-x")
		require.Contains(t, names, "amq.rabbitmq.event", "the event exchange plugin's exchange stays")
		// "/" is usable again by the harness user.
		ch = amqpChannel(t, berlin.AMQPURL())
		q, err := ch.QueueDeclare("left-behind", true, false, false, false, nil)
		require.NoError(t, err)
		require.Zero(t, q.Messages)
	})

	t.Run("close leaves no process", func(t *testing.T) {
		require.NotEmpty(t, markedPIDs(func(v string) bool { return strings.HasPrefix(v, h.marker) }))
		require.NoError(t, h.Close())
		require.Empty(t, markedPIDs(func(v string) bool { return strings.HasPrefix(v, h.marker) }))
	})
}

// TestKillRestartNode crashes a node holding a durable queue with a
// persistent message and restarts it: the message is there again, on the
// same ports; so it is after a clean stop; and Close still stops
// everything, a killed node among them.
func TestKillRestartNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts RabbitMQ nodes")
	}
	h := StartT(t, Config{Sites: []string{"berlin", "tunis"}})
	berlin := h.Node("berlin")
	publish := func(queue, body string, mode uint8) {
		conn, err := amqp.Dial(berlin.AMQPURL())
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
		require.NoError(t, err)
		conf, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{DeliveryMode: mode, Body: []byte(body)})
		require.NoError(t, err)
		require.True(t, conf.Wait())
	}
	publish("durable", "kept", amqp.Persistent)
	publish("durable-transient", "lost", amqp.Transient)
	conn, err := amqp.Dial(berlin.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	require.NoError(t, h.KillNode("berlin"))
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("a client's connection outlived the node")
	}
	_, err = amqpHandshake(berlin.AMQPAddr())
	require.Error(t, err, "the killed node still answers")
	_, err = amqpHandshake(h.Node("tunis").AMQPAddr())
	require.NoError(t, err, "killing berlin took tunis with it")
	require.Error(t, h.KillNode("nowhere"))
	// While it is down, its ports are kept from others.
	for _, port := range []int{berlin.amqpPort, berlin.mgmtPort, berlin.distPort} {
		require.Error(t, bindPlain(port), "port %d of the killed node was free to take", port)
	}

	require.NoError(t, h.RestartNode(context.Background(), "berlin"))
	require.Error(t, h.RestartNode(context.Background(), "berlin"), "a running node restarted")
	berlin.mu.Lock()
	require.Empty(t, berlin.reserved, "the restarted node's ports are still reserved")
	berlin.mu.Unlock()
	conn2, err := amqp.Dial(berlin.AMQPURL())
	require.NoError(t, err)
	defer conn2.Close()
	ch, err := conn2.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get("durable", true)
	require.NoError(t, err)
	require.True(t, ok, "the persistent message did not survive the crash")
	require.Equal(t, "kept", string(d.Body))
	q, err := ch.QueueDeclarePassive("durable-transient", true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "a transient message survived the crash")

	// A clean stop and start keep it too.
	publish("durable", "kept again", amqp.Persistent)
	require.NoError(t, h.StopNode("berlin", 0))
	require.NoError(t, h.RestartNode(context.Background(), "berlin"))
	conn3, err := amqp.Dial(berlin.AMQPURL())
	require.NoError(t, err)
	defer conn3.Close()
	ch3, err := conn3.Channel()
	require.NoError(t, err)
	d, ok, err = ch3.Get("durable", true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "kept again", string(d.Body))

	// Close with one node restarted twice and now killed again.
	require.NoError(t, h.KillNode("berlin"))
	require.NoError(t, h.Close())
	require.Empty(t, markedPIDs(func(v string) bool { return strings.HasPrefix(v, h.marker) }), "a process survived Close after a restart and a kill")
	require.NoDirExists(t, h.dir)
	require.Contains(t, h.Node("tunis").LogTail(keptLogTail), "Server startup complete", "Close keeps the log tails for a failure reported after it")
}

// TestReservePort: a reserved port is refused to a bind without
// SO_REUSEADDR, as to a second one, and open to a listener that sets it
// (Go's do, as the Erlang VM's do), which then works.
func TestReservePort(t *testing.T) {
	port, err := freePort()
	require.NoError(t, err)
	fd, err := reservePort(port)
	require.NoError(t, err)
	require.Error(t, bindPlain(port))
	fd2, err := reservePort(port)
	require.NoError(t, err, "SO_REUSEADDR on both, neither listening: Linux allows it")
	require.NoError(t, syscall.Close(fd2))
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err, "a listener with SO_REUSEADDR could not bind the reserved port")
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			_ = c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	_ = c.Close()
	require.NoError(t, syscall.Close(fd))
}

// TestReservedPortsAvoided: the kernel's own choices of a port, for a
// listener on port 0 and for an outgoing connection's local port, skip
// reserved ports. 300 ports of the 28 000 or so in the ephemeral range are
// reserved; 600 of each choice would land on about 6 of them if they did
// not (all of them missing by chance: 0.2 %).
func TestReservedPortsAvoided(t *testing.T) {
	reserved := map[int]bool{}
	for len(reserved) < 300 {
		port, err := freePort()
		require.NoError(t, err)
		if reserved[port] {
			continue
		}
		fd, err := reservePort(port)
		require.NoError(t, err)
		t.Cleanup(func() { _ = syscall.Close(fd) })
		reserved[port] = true
	}
	for range 600 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		require.False(t, reserved[port], "a listener on port 0 got reserved port %d", port)
	}
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for range 600 {
		c, err := net.Dial("tcp", srv.Addr().String())
		require.NoError(t, err)
		port := c.LocalAddr().(*net.TCPAddr).Port
		require.NoError(t, c.Close())
		require.False(t, reserved[port], "an outgoing connection got reserved port %d", port)
	}
}

// bindPlain binds a socket without SO_REUSEADDR to 127.0.0.1:port and
// closes it.
func bindPlain(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
}

// amqpChannel opens a channel to url, closed with its connection when t
// ends.
func amqpChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}
