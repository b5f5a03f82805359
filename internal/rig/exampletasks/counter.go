package exampletasks

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
)

// RunCounter is evidence, independent of the controller and the agents,
// of how many times each task's command ran: a TCP listener that counts
// the lines commands send it, one per execution, keyed by the text of the
// line (the task's UID). Commands reach it through bash's /dev/tcp, so it
// works at every isolation level: a task at the tenant level can write no
// shared file, but its network (Node) reaches the listener's address.
type RunCounter struct {
	ln   net.Listener
	addr *net.TCPAddr

	mu   sync.Mutex
	runs map[string]int
	wg   sync.WaitGroup
}

// NewRunCounter listens on host (an IP address the tasks' network reaches;
// a free port is chosen) and counts until Close. It returns the listener's
// error.
func NewRunCounter(host string) (*RunCounter, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	c := &RunCounter{ln: ln, addr: ln.Addr().(*net.TCPAddr), runs: map[string]int{}}
	c.wg.Add(1)
	go c.serve()
	return c, nil
}

func (c *RunCounter) serve() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return // closed
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			for s := bufio.NewScanner(conn); s.Scan(); {
				if key := strings.TrimSpace(s.Text()); key != "" {
					c.mu.Lock()
					c.runs[key]++
					c.mu.Unlock()
					if _, err := conn.Write([]byte("counted\n")); err != nil {
						return
					}
				}
			}
		}()
	}
}

// Command returns a bash command that reports one execution of its task
// (by $BASHTASK_UID) to the counter and waits until it was counted, then
// runs rest. A report that is not acknowledged makes the command exit 97,
// so no run goes uncounted silently.
func (c *RunCounter) Command(rest string) string {
	return fmt.Sprintf(`{ exec 9<>/dev/tcp/%s/%s && echo "$BASHTASK_UID" >&9 && read -r -t 30 ack <&9 && [[ $ack == counted ]] && exec 9<&-; } || exit 97; %s`,
		c.addr.IP, strconv.Itoa(c.addr.Port), rest)
}

// Runs returns how many executions each task UID reported so far.
func (c *RunCounter) Runs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.runs)
}

// Close stops listening and waits for the open connections to end.
func (c *RunCounter) Close() error {
	err := c.ln.Close()
	c.wg.Wait()
	return err
}
