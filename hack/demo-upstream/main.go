//go:build linux

// Command demo-upstream is the private HTTPS service of `make demo`'s
// egress example (examples/egress): a stand-in for the internet
// (internal/rig/upstream) whose resolver answers the names under
// demo.test, and an HTTPS server on port 443 there, with a certificate of
// a CA of its own, that answers only requests carrying
// "Authorization: Bearer <the token>". It writes the CA's certificate to
// --ca-file, prints one line "upstream is up: resolver A, https://api.demo.test at A:443"
// and serves until SIGINT or SIGTERM. It needs root.
package main

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// domain is the DNS domain the upstream's resolver answers.
const domain = "demo.test"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-upstream:", err)
		os.Exit(1)
	}
}

func run() error {
	tokenFile := flag.String("token-file", "", "file holding the bearer token the server accepts (one trailing line break is dropped)")
	caFile := flag.String("ca-file", "", "file to write the server's CA certificate to, in PEM")
	slot := flag.Int("slot", os.Getpid()%upstream.Slots, "which /30 of 198.18.0.0/15 to take")
	flag.Parse()
	if *tokenFile == "" || *caFile == "" {
		return errors.New("--token-file and --ca-file are required")
	}
	raw, err := os.ReadFile(*tokenFile)
	if err != nil {
		return err
	}
	token := strings.TrimSuffix(string(raw), "\n")
	if token == "" {
		return fmt.Errorf("%s is empty", *tokenFile)
	}
	cert, caPEM, err := upstream.ServerCert([]string{"*." + domain}, 24*time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*caFile, caPEM, 0o644); err != nil {
		return err
	}
	u, err := upstream.Start(upstream.Config{Name: fmt.Sprintf("bt-demo-upstream-%d", os.Getpid()), Link: fmt.Sprintf("vdu%d", *slot),
		Slot: *slot, Domains: []string{domain}})
	if err != nil {
		return err
	}
	defer u.Close()
	l, err := u.Listen(443)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler(token), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	fmt.Printf("upstream is up: resolver %s, https://api.%s at %s:443\n", u.Addr, domain, u.Addr)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return srv.Close()
}

// handler answers 200 to a request with the bearer token and 401 to any
// other, without ever writing the token.
func handler(token string) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, "%s: 401, the request had no valid token\n", r.Host)
			return
		}
		fmt.Fprintf(w, "%s: 200, the request carried the token; %s %s\n", r.Host, r.Method, r.URL.Path)
	})
}
