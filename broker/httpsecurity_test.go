package broker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

const testHTTPToken = "test-token-0123456789abcdef"

// httpStatus sends a GET to path on b's HTTP server with the given Host
// header (empty: the address) and Authorization header (empty: none).
func httpStatus(t *testing.T, client *http.Client, scheme string, b *Broker, path, host, authorization string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+b.HTTPAddr()+path, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	if resp.StatusCode == http.StatusUnauthorized {
		require.Contains(t, resp.Header.Values("WWW-Authenticate"), `Bearer realm="luffymq"`)
	}
	return resp.StatusCode
}

// TestHTTPRefusesToStartBeyondLoopbackWithoutToken: New refuses an HTTP
// address other hosts can reach unless a token is set.
func TestHTTPRefusesToStartBeyondLoopbackWithoutToken(t *testing.T) {
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0", "192.0.2.1:8080"} {
		_, err := New(Config{MQTTListen: "127.0.0.1:0", HTTPListen: addr, Logger: discardLogger()})
		require.ErrorIs(t, err, ErrInvalidConfig, addr)
		require.Contains(t, err.Error(), "http-token", addr)
		require.Contains(t, err.Error(), addr)
	}
}

// TestHTTPTokenIsRequired: with a token, every request but GET /healthz
// needs it, as a bearer token or a Basic password; others get 401.
func TestHTTPTokenIsRequired(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.HTTPToken = testHTTPToken })
	client := http.DefaultClient
	for _, path := range []string{"/api/v1/groups", "/api/v1/overview", "/metrics", "/", "/no-such-page"} {
		require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "http", b, path, "", ""), path)
		require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "http", b, path, "", "Bearer wrong-token-0123456789abc"), path)
		require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "http", b, path, "", "Bearer "+testHTTPToken+"x"), path)
		require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "http", b, path, "", testHTTPToken), path+": no scheme")
	}
	for _, path := range []string{"/api/v1/groups", "/api/v1/overview", "/metrics", "/"} {
		require.Equal(t, http.StatusOK, httpStatus(t, client, "http", b, path, "", "Bearer "+testHTTPToken), path)
		require.Equal(t, http.StatusOK, httpStatus(t, client, "http", b, path, "", "bearer "+testHTTPToken), path)
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+b.HTTPAddr()+"/api/v1/groups", nil)
	require.NoError(t, err)
	req.SetBasicAuth("anyone", testHTTPToken)
	require.Equal(t, http.StatusOK, httpStatus(t, client, "http", b, "/api/v1/groups", "", req.Header.Get("Authorization")), "Basic, for browsers")
	req.SetBasicAuth(testHTTPToken, "wrong")
	require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "http", b, "/api/v1/groups", "", req.Header.Get("Authorization")), "the token is the password")

	require.Equal(t, http.StatusOK, httpStatus(t, client, "http", b, "/healthz", "", ""), "health checks need no token")
}

// TestHTTPLoopbackChecksHostHeader: bound to loopback, the server answers
// only requests addressed to a loopback name (DNS rebinding protection),
// token or not.
func TestHTTPLoopbackChecksHostHeader(t *testing.T) {
	b := startBroker(t, nil)
	_, port, err := net.SplitHostPort(b.HTTPAddr())
	require.NoError(t, err)
	client := http.DefaultClient
	for _, host := range []string{"", "localhost:" + port, "LOCALHOST:" + port, "localhost", "127.0.0.1", "[::1]:" + port, "[::1]"} {
		require.Equal(t, http.StatusOK, httpStatus(t, client, "http", b, "/api/v1/groups", host, ""), "Host %q", host)
	}
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.2:" + port, "localhost.attacker.example", "0.0.0.0:" + port} {
		require.Equal(t, http.StatusForbidden, httpStatus(t, client, "http", b, "/api/v1/groups", host, ""), "Host %q", host)
		require.Equal(t, http.StatusForbidden, httpStatus(t, client, "http", b, "/healthz", host, ""), "Host %q", host)
	}

	// With a token, the Host header is checked too.
	bt := startBroker(t, func(c *Config) { c.HTTPToken = testHTTPToken })
	require.Equal(t, http.StatusForbidden, httpStatus(t, client, "http", bt, "/api/v1/groups", "attacker.example", "Bearer "+testHTTPToken))
}

// TestHTTPBeyondLoopbackSkipsHostCheck: bound to every address (checked
// on the handler, without binding one), the token is the guard and any
// Host is answered.
func TestHTTPBeyondLoopbackSkipsHostCheck(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b := &Broker{cfg: Config{HTTPListen: ":8080", HTTPToken: testHTTPToken}}
	h := b.requireHTTPAccess(ok)
	for _, tt := range []struct {
		auth string
		want int
	}{{"", http.StatusUnauthorized}, {"Bearer " + testHTTPToken, http.StatusOK}} {
		req := httptest.NewRequest(http.MethodGet, "http://broker.example:8080/api/v1/groups", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, tt.want, rec.Code)
	}
}

// TestHTTPOverTLS: with http-tls-cert and http-tls-key the API is served
// over HTTPS only.
func TestHTTPOverTLS(t *testing.T) {
	cert, key := writeSelfSignedCert(t)
	b := startBroker(t, func(c *Config) {
		c.HTTPTLSCertFile, c.HTTPTLSKeyFile = cert, key
		c.HTTPToken = testHTTPToken
	})
	pemBytes, err := os.ReadFile(cert)
	require.NoError(t, err)
	block, _ := pem.Decode(pemBytes)
	parsed, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(parsed)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	require.Equal(t, http.StatusOK, httpStatus(t, client, "https", b, "/api/v1/groups", "", "Bearer "+testHTTPToken))
	require.Equal(t, http.StatusUnauthorized, httpStatus(t, client, "https", b, "/api/v1/groups", "", ""))

	resp, err := http.Get("http://" + b.HTTPAddr() + "/healthz")
	if err == nil {
		_ = resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to a TLS server")
	}
}
