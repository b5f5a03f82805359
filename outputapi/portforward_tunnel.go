package outputapi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
)

// upgradeAfterHijack adapts the SPDY upgrade of the port-forward server
// (which sets its headers, writes 101 and then hijacks) to apiserver's
// WebSocket tunneling handler, which expects the upstream of an upgrade
// proxy: the 101 response as raw bytes on the hijacked connection. It
// keeps the headers and the 101 back and writes them to the connection
// Hijack returns; any other status passes through with its headers, as
// the tunneling handler answers non-upgrade responses itself.
type upgradeAfterHijack struct {
	w      http.ResponseWriter
	header http.Header
	status int
}

func newUpgradeAfterHijack(w http.ResponseWriter) *upgradeAfterHijack {
	return &upgradeAfterHijack{w: w, header: http.Header{}}
}

func (u *upgradeAfterHijack) Header() http.Header { return u.header }

func (u *upgradeAfterHijack) WriteHeader(status int) {
	if status == http.StatusSwitchingProtocols {
		u.status = status
		return
	}
	maps.Copy(u.w.Header(), u.header)
	u.w.WriteHeader(status)
}

func (u *upgradeAfterHijack) Write(b []byte) (int, error) {
	if u.status == http.StatusSwitchingProtocols {
		return 0, errors.New("write after a 101 response: hijack the connection")
	}
	maps.Copy(u.w.Header(), u.header)
	return u.w.Write(b)
}

// Hijack hijacks the tunneling connection and writes the 101 response
// with the kept headers to it. The tunneling handler's Hijack returns no
// bufio.ReadWriter; one around the connection is returned instead.
func (u *upgradeAfterHijack) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := u.w.(http.Hijacker)
	if !ok || u.status != http.StatusSwitchingProtocols {
		return nil, nil, errors.New("port-forward tunnel: hijack without a 101 response")
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %d %s\r\n", u.status, http.StatusText(u.status))
	if err := u.header.Write(&head); err != nil {
		conn.Close()
		return nil, nil, err
	}
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		conn.Close()
		return nil, nil, err
	}
	if rw == nil {
		// The tunneling handler returns none; the SPDY server reads
		// through one.
		rw = bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))
	}
	return conn, rw, nil
}
