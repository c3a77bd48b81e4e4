package broker

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
)

// MinHTTPTokenLength is the shortest --http-token accepted.
const MinHTTPTokenLength = 16

// parseListenAddress checks addr, the value of the setting key, as a
// listen address (host:port with a port from 0 to 65535 and a host that is
// empty, an IP address or a DNS name) and reports whether only the local
// host can connect to it: a loopback IP address or "localhost". An empty
// host (":1883") or an unspecified address (0.0.0.0, ::) listens on every
// address of the machine, so it is not loopback.
func parseListenAddress(key, addr string) (loopback bool, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("%w: %s %q is not host:port (e.g. 127.0.0.1:1883, or :1883 for every address)", ErrInvalidConfig, key, addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return false, fmt.Errorf("%w: %s %q: the port %q is not a number from 0 to 65535", ErrInvalidConfig, key, addr, port)
	}
	if host == "" {
		return false, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.IsLoopback(), nil
	}
	if !isDNSName(host) {
		return false, fmt.Errorf("%w: %s %q: the host %q is neither an IP address nor a host name", ErrInvalidConfig, key, addr, host)
	}
	return strings.EqualFold(host, "localhost"), nil
}

// isDNSName reports whether s is made of DNS labels (letters, digits, '-'
// and '_', separated by dots).
func isDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// checkListenersAndAccess checks the listen addresses and who may reach
// what through them:
//
//   - MQTT: without an auth file, anonymous clients are accepted on
//     loopback listeners only, as in Mosquitto 2; a listener that other
//     hosts can reach needs AuthFile, or AllowAnonymous to accept anyone.
//   - HTTP: bound beyond loopback, the API and dashboard need HTTPToken.
//
// It also refuses settings that would otherwise be ignored in silence
// (a TLS certificate without a TLS listener, HTTP options without HTTP).
func (c Config) checkListenersAndAccess() error {
	type listener struct{ key, addr string }
	var reachable []listener // MQTT listeners other hosts can reach
	for _, l := range []listener{{"listen", c.MQTTListen}, {"tls-listen", c.TLSListen}, {"ws-listen", c.WSListen}} {
		if l.addr == "" {
			continue
		}
		loopback, err := parseListenAddress(l.key, l.addr)
		if err != nil {
			return err
		}
		if !loopback {
			reachable = append(reachable, l)
		}
	}
	if c.TLSListen == "" && (c.TLSCertFile != "" || c.TLSKeyFile != "") {
		return fmt.Errorf("%w: tls-cert %q / tls-key %q given without tls-listen: they serve MQTT over TLS (set tls-listen, e.g. :8883; for HTTPS use http-tls-cert and http-tls-key)", ErrInvalidConfig, c.TLSCertFile, c.TLSKeyFile)
	}
	if c.AllowAnonymous && c.AuthFile != "" {
		return fmt.Errorf("%w: allow-anonymous and auth-file %q exclude each other: the auth file decides who may connect (a rule with no username and allow: true admits anonymous clients)", ErrInvalidConfig, c.AuthFile)
	}
	if c.AuthFile == "" && !c.AllowAnonymous && len(reachable) > 0 {
		l := reachable[0]
		return fmt.Errorf("%w: %s %q accepts connections from other hosts, and anonymous access is allowed on loopback listeners only: set auth-file (credentials and ACLs), or allow-anonymous to accept anyone, or listen on 127.0.0.1", ErrInvalidConfig, l.key, l.addr)
	}

	if c.HTTPListen == "" {
		if c.HTTPToken != "" || c.HTTPTLSCertFile != "" || c.HTTPTLSKeyFile != "" {
			return fmt.Errorf("%w: http-token, http-tls-cert and http-tls-key need http, which is empty (the HTTP server is off)", ErrInvalidConfig)
		}
		return nil
	}
	httpLoopback, err := parseListenAddress("http", c.HTTPListen)
	if err != nil {
		return err
	}
	if (c.HTTPTLSCertFile == "") != (c.HTTPTLSKeyFile == "") {
		return fmt.Errorf("%w: http-tls-cert %q and http-tls-key %q go together: set both or neither", ErrInvalidConfig, c.HTTPTLSCertFile, c.HTTPTLSKeyFile)
	}
	if c.HTTPToken != "" {
		if err := checkHTTPToken(c.HTTPToken); err != nil {
			return err
		}
	}
	if !httpLoopback && c.HTTPToken == "" {
		return fmt.Errorf("%w: http %q accepts connections from other hosts: set http-token (clients then send Authorization: Bearer <token>), or bind http to 127.0.0.1", ErrInvalidConfig, c.HTTPListen)
	}
	return nil
}

// checkHTTPToken refuses tokens that are short or cannot travel in an HTTP
// header. The token itself never appears in the error.
func checkHTTPToken(token string) error {
	if len(token) < MinHTTPTokenLength {
		return fmt.Errorf("%w: http-token is %d characters long; use at least %d (e.g. openssl rand -hex 16)", ErrInvalidConfig, len(token), MinHTTPTokenLength)
	}
	for i := 0; i < len(token); i++ {
		if token[i] <= ' ' || token[i] >= 0x7f {
			return fmt.Errorf("%w: http-token holds a space, control or non-ASCII character at byte %d; use printable ASCII only", ErrInvalidConfig, i)
		}
	}
	return nil
}

// loadKeyPair loads the PEM certificate and key named by the settings
// certKey and keyKey.
func loadKeyPair(certKey, keyKey, certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return cert, fmt.Errorf("%w: %s %s / %s %s: %s", ErrInvalidConfig, certKey, certFile, keyKey, keyFile, oneLine(err.Error()))
	}
	return cert, nil
}

// readAuthFile reads the auth ledger at path and checks that Mochi can
// parse it.
func readAuthFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: auth-file: %s", ErrInvalidConfig, oneLine(err.Error()))
	}
	if err := new(auth.Ledger).Unmarshal(data); err != nil {
		return nil, fmt.Errorf("%w: auth-file %s is not a valid auth ledger (YAML or JSON): %s", ErrInvalidConfig, path, oneLine(err.Error()))
	}
	return data, nil
}

// checkFiles reads the files c names (TLS key pairs, auth file) so that an
// unreadable or invalid one is reported before anything starts.
func (c Config) checkFiles() error {
	if c.TLSListen != "" {
		if _, err := loadKeyPair("tls-cert", "tls-key", c.TLSCertFile, c.TLSKeyFile); err != nil {
			return err
		}
	}
	if c.HTTPListen != "" && c.HTTPTLSCertFile != "" {
		if _, err := loadKeyPair("http-tls-cert", "http-tls-key", c.HTTPTLSCertFile, c.HTTPTLSKeyFile); err != nil {
			return err
		}
	}
	if c.AuthFile != "" {
		if _, err := readAuthFile(c.AuthFile); err != nil {
			return err
		}
	}
	return nil
}

// oneLine joins the lines of a multi-line message (YAML errors list one
// problem per line) into one.
func oneLine(s string) string {
	var parts []string
	for _, line := range strings.Split(strings.ReplaceAll(s, "\r", "\n"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, " ")
}

// anonymousAccessWarning is the line logged at start when there is no
// auth file.
func anonymousAccessWarning(c Config) string {
	if c.AllowAnonymous {
		return "anonymous access allowed on every listener (--allow-anonymous): any client that reaches them may connect; set --auth-file to require credentials"
	}
	return "anonymous access allowed, on loopback listeners only; set --auth-file to require credentials (and to listen on other addresses)"
}
