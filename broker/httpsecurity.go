package broker

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"net"
	"net/http"
	"strings"
)

// httpTLSConfig returns the TLS configuration of the HTTP server, or nil
// when cfg serves plain HTTP.
func httpTLSConfig(cfg Config) (*tls.Config, error) {
	if cfg.HTTPListen == "" || cfg.HTTPTLSCertFile == "" {
		return nil, nil
	}
	cert, err := loadKeyPair("http-tls-cert", "http-tls-key", cfg.HTTPTLSCertFile, cfg.HTTPTLSKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// listenHTTP opens the HTTP listener, with TLS when configured.
func (b *Broker) listenHTTP() (net.Listener, error) {
	ln, err := net.Listen("tcp", b.cfg.HTTPListen)
	if err != nil {
		return nil, err
	}
	if b.httpTLSConfig != nil {
		ln = tls.NewListener(ln, b.httpTLSConfig)
	}
	return ln, nil
}

// requireHTTPAccess guards the API and dashboard:
//
//   - On a loopback address, a request whose Host header is not
//     localhost, 127.0.0.1 or [::1] (with any port) gets 403: a web page
//     that rebinds its own name to 127.0.0.1 (DNS rebinding) cannot read
//     the API through the user's browser.
//   - With an HTTP token (required beyond loopback), a request without it
//     gets 401, except GET /healthz. The token travels as
//     "Authorization: Bearer <token>", or as the password of HTTP Basic
//     authentication (any user name), which a browser asks for and then
//     sends with the dashboard's own requests.
func (b *Broker) requireHTTPAccess(next http.Handler) http.Handler {
	loopback, _ := parseListenAddress("http", b.cfg.HTTPListen) // validated by withDefaults
	g := &httpGuard{next: next, checkHost: loopback}
	if b.cfg.HTTPToken != "" {
		sum := sha256.Sum256([]byte(b.cfg.HTTPToken))
		g.tokenSum = &sum
	}
	return g
}

// httpGuard is the handler requireHTTPAccess returns.
type httpGuard struct {
	next      http.Handler
	checkHost bool
	// tokenSum is the SHA-256 of the token (nil: no token). Comparing
	// digests in constant time reveals neither the token nor its length.
	tokenSum *[sha256.Size]byte
}

func (g *httpGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.checkHost && !isLocalHostHeader(r.Host) {
		http.Error(w, "403 forbidden: the Host header must be localhost, 127.0.0.1 or [::1] (this server listens on loopback only)", http.StatusForbidden)
		return
	}
	if g.tokenSum != nil && !(r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead)) && !g.authorized(r) {
		w.Header().Add("WWW-Authenticate", `Bearer realm="luffymq"`)
		w.Header().Add("WWW-Authenticate", `Basic realm="luffymq", charset="UTF-8"`)
		http.Error(w, "401 unauthorized: send Authorization: Bearer <the --http-token>", http.StatusUnauthorized)
		return
	}
	g.next.ServeHTTP(w, r)
}

// authorized reports whether r carries the token, as a bearer token or as
// a Basic password.
func (g *httpGuard) authorized(r *http.Request) bool {
	scheme, credentials, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok {
		return false
	}
	credentials = strings.TrimSpace(credentials)
	var presented string
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		presented = credentials
	case strings.EqualFold(scheme, "Basic"):
		decoded, err := base64.StdEncoding.DecodeString(credentials)
		if err != nil {
			return false
		}
		_, password, ok := strings.Cut(string(decoded), ":")
		if !ok {
			return false
		}
		presented = password
	default:
		return false
	}
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], g.tokenSum[:]) == 1
}

// isLocalHostHeader reports whether a Host header names the local host
// by a loopback name: localhost, 127.0.0.1 or [::1], with or without a
// port.
func isLocalHostHeader(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	return strings.EqualFold(host, "localhost") || host == "127.0.0.1" || host == "::1"
}
