package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// PKI is a throwaway certificate authority made for one test: a CA, a
// server certificate for 127.0.0.1 and localhost, and a client certificate,
// all signed by the CA, valid for an hour. Keys are ECDSA P-256, made with
// crypto/rand; nothing outside the test trusts them.
type PKI struct {
	CAFile   string // the CA certificate, PEM
	CertFile string // the server certificate, PEM
	KeyFile  string // the server key, PEM (PKCS #8)

	roots  *x509.CertPool
	client tls.Certificate
}

// NewPKI makes a PKI in a directory of t.TempDir.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{
		CAFile:   filepath.Join(dir, "ca.crt"),
		CertFile: filepath.Join(dir, "server.crt"),
		KeyFile:  filepath.Join(dir, "server.key"),
		roots:    x509.NewCertPool(),
	}
	p.roots.AddCert(ca)
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)

	leaf := func(serial int64, cn string, usage []x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	// Redis also presents its server certificate as a client one (to its
	// master, or on the cluster bus), so it gets both usages.
	srvDER, srvKey := leaf(2, "redistest server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	writePEM(t, p.CertFile, "CERTIFICATE", srvDER)
	srvPKCS8, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.KeyFile, "PRIVATE KEY", srvPKCS8)

	cliDER, cliKey := leaf(3, "redistest client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	p.client = tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey}
	return p
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ServerArgs returns the redis-server arguments that serve TLS on tlsPort
// with the server certificate, and require clients to present a certificate
// signed by the CA (tls-auth-clients yes, the default).
func (p *PKI) ServerArgs(tlsPort int) []string {
	return []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", p.CertFile,
		"--tls-key-file", p.KeyFile,
		"--tls-ca-cert-file", p.CAFile,
		"--tls-auth-clients", "yes",
	}
}

// ClientConfig returns a TLS config that trusts only the CA and presents
// the client certificate. Each call returns a new config.
func (p *PKI) ClientConfig() *tls.Config {
	return &tls.Config{
		RootCAs:      p.roots,
		Certificates: []tls.Certificate{p.client},
		MinVersion:   tls.VersionTLS12,
	}
}

// StartTLS starts one node (see Start) that also serves TLS with pki's
// server certificate, and returns it with the TLS address. The node keeps
// its plain port, behind the proxy as usual, for Admin and the readiness
// probe; lock clients under test use the TLS address, which no proxy fronts.
func StartTLS(t testing.TB, pki *PKI, opts ...Option) (*Cluster, string) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	rc := Start(t, 1, append(opts, WithArgs(pki.ServerArgs(port)...))...)
	return rc, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
