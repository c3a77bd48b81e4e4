package broker

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestMosquittoClientsShareAGroup: standard clients work unchanged — two
// mosquitto_sub members of one shared group and mosquitto_pub deliver every
// message to exactly one member, whether the members speak MQTT 3.1.1, 5
// or one of each, at QoS 0 and 1.
func TestMosquittoClientsShareAGroup(t *testing.T) {
	subBin := testenv.RequireBinary(t, "mosquitto_sub", "mosquitto-clients")
	pubBin := testenv.RequireBinary(t, "mosquitto_pub", "mosquitto-clients")
	for _, tc := range []struct {
		name     string
		versions [2]string // mosquitto_sub -V of sub1 and sub2
		qos      string
	}{
		{"mqttv5", [2]string{"mqttv5", "mqttv5"}, "0"},
		{"mqttv311", [2]string{"mqttv311", "mqttv311"}, "0"},
		{"mixed-qos1", [2]string{"mqttv311", "mqttv5"}, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runMosquittoSubMembers(t, subBin, pubBin, tc.versions, tc.qos)
		})
	}
}

// runMosquittoSubMembers runs two mosquitto_sub members of $share/g/t, at
// the given protocol versions and QoS, against 100 messages from
// mosquitto_pub, and checks each message reached exactly one of them.
func runMosquittoSubMembers(t *testing.T, subBin, pubBin string, versions [2]string, qos string) {
	b := startBroker(t, nil)
	host, port, err := net.SplitHostPort(b.MQTTAddr())
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := map[string][]string{}
	var subs []*exec.Cmd
	for i, id := range []string{"sub1", "sub2"} {
		cmd := exec.CommandContext(ctx, subBin, "-V", versions[i], "-q", qos, "-h", host, "-p", port, "-i", id, "-t", "$share/g/t")
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		subs = append(subs, cmd)
		go func(id string) {
			scanner := bufio.NewScanner(out)
			for scanner.Scan() {
				mu.Lock()
				got[id] = append(got[id], scanner.Text())
				mu.Unlock()
			}
		}(id)
	}
	t.Cleanup(func() {
		for _, c := range subs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	eventually(t, 10*time.Second, func() bool {
		groups := getGroups(t, b)
		return len(groups.Groups) == 1 && len(groups.Groups[0].Members) == 2
	}, "both mosquitto_sub members joined")

	const total = 100
	var lines strings.Builder
	for i := 0; i < total; i++ {
		fmt.Fprintf(&lines, "message-%d\n", i)
	}
	pub := exec.CommandContext(ctx, pubBin, "-V", "mqttv5", "-q", qos, "-h", host, "-p", port, "-t", "t", "-l")
	pub.Stdin = strings.NewReader(lines.String())
	pubOut := new(testenv.LockedBuffer)
	pub.Stdout, pub.Stderr = pubOut, pubOut
	require.NoError(t, pub.Start())
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Wait() }()

	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["sub1"])+len(got["sub2"]) >= total
	}, "all messages delivered")
	select {
	case err := <-pubDone:
		require.NoError(t, err, pubOut.String())
	case <-time.After(5 * time.Second):
		// mosquitto_pub -l sometimes never exits after its input ends
		// (a client race, eclipse-mosquitto/mosquitto#1448; one CI run
		// hung here until the 30 s deadline). Every message was
		// delivered, which is what this test checks: stop it.
		_ = pub.Process.Kill()
		<-pubDone
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	for _, msgs := range got {
		for _, m := range msgs {
			seen[m]++
		}
	}
	require.Len(t, seen, total, "every message arrived")
	for m, n := range seen {
		require.Equal(t, 1, n, "message %s delivered to exactly one member", m)
	}
	require.NotEmpty(t, got["sub1"], "both members took part")
	require.NotEmpty(t, got["sub2"], "both members took part")
	t.Logf("sub1 (%s)=%d sub2 (%s)=%d", versions[0], len(got["sub1"]), versions[1], len(got["sub2"]))
}

// TestReportsOverTLSAndWebSocket: the PINGREQ-lifting reader sits on every
// listener kind.
func TestReportsOverTLSAndWebSocket(t *testing.T) {
	certFile, keyFile := writeSelfSignedCert(t)
	tlsAddr := freeLoopbackAddr(t)
	wsAddr := freeLoopbackAddr(t)
	b := startBroker(t, func(c *Config) {
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = tlsAddr, certFile, keyFile
		c.WSListen = wsAddr
	})

	t.Run("tls", func(t *testing.T) {
		conn, err := tls.Dial("tcp", tlsAddr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test cert
		require.NoError(t, err)
		rc, _ := dialRaw(t, conn, "tls-worker")
		rc.subscribe("$share/g/tls", 0)
		rc.writeBytes(report.EncodePingreq(report.Report{Pending: 11, ProcessingTime: 3 * time.Millisecond}))
		require.Equal(t, packets.PINGRESP, rc.read().Type)
		m, ok := member(getGroups(t, b), "$share/g/tls", "tls-worker")
		require.True(t, ok)
		require.Equal(t, 11, m.ReportedPending)
	})

	t.Run("websocket", func(t *testing.T) {
		var ws *websocket.Conn
		eventually(t, 5*time.Second, func() bool {
			var err error
			ws, _, err = websocket.DefaultDialer.Dial("ws://"+wsAddr+"/", map[string][]string{"Sec-WebSocket-Protocol": {"mqtt"}})
			return err == nil
		}, "websocket listener up")
		rc, _ := dialRaw(t, &wsNetConn{Conn: ws}, "ws-worker")
		rc.subscribe("$share/g/ws", 0)
		rc.writeBytes(report.EncodePingreq(report.Report{Pending: 13, ProcessingTime: 3 * time.Millisecond}))
		require.Equal(t, packets.PINGRESP, rc.read().Type)
		m, ok := member(getGroups(t, b), "$share/g/ws", "ws-worker")
		require.True(t, ok)
		require.Equal(t, 13, m.ReportedPending)
	})
}

// wsNetConn carries an MQTT byte stream in binary websocket messages.
type wsNetConn struct {
	*websocket.Conn
	pending []byte
}

func (c *wsNetConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return 0, err
		}
		c.pending = msg
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *wsNetConn) Write(p []byte) (int, error) {
	if err := c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsNetConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func writeSelfSignedCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}
