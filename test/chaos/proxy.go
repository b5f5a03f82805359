package main

import (
	"io"
	"net"
	"sync"
)

// proxy forwards TCP connections from the address the agents'
// EndpointSlice lists to the agent's own listener, so the harness can cut
// an agent off the network without touching the agent: while partitioned,
// every connection through it is closed and new ones are closed at once,
// as a node whose network dropped out refuses or resets them.
type proxy struct {
	lis    net.Listener
	target string

	mu          sync.Mutex
	partitioned bool
	conns       map[net.Conn]struct{}
}

func newProxy(listen, target string) (*proxy, error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.partitioned {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *proxy) handle(c net.Conn) {
	if !p.track(c) {
		_ = c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(c)
		_ = c.Close()
		return
	}
	if !p.track(up) {
		p.untrack(c)
		_ = c.Close()
		_ = up.Close()
		return
	}
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Add(2)
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
	p.untrack(c, up)
}

// partition closes every connection and refuses new ones until heal.
func (p *proxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// heal lets connections through again.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = false
}

// Close stops the proxy: every connection is closed, and so is the
// listener. The launcher calls it (AgentFront) when the cluster stops.
func (p *proxy) Close() error {
	p.partition()
	return p.lis.Close()
}
