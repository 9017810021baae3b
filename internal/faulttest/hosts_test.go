//go:build faults

package faulttest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Simulated hosts: one network namespace per host, reaching the server's
// machine over its own veth pair (host side 10.X.N.1/30, namespace side
// 10.X.N.2/30). Names carry the test binary's pid, so that a later run
// removes what an aborted one left (its pid is gone).
const (
	nsPrefix   = "bfft" // namespaces: bfft<pid>n<N>
	vethPrefix = "bf"   // veths: bf<pid>h<N> (host side), bf<pid>p<N> (peer)
)

// host is a simulated host: the workers on it run in its namespace and
// reach PostgreSQL (and PgBouncer) at serverAddr.
type host struct {
	n          int
	ns         string // "" in loopback mode
	veth       string // host side of the pair; "" in loopback mode
	serverAddr string // where the server's machine is, seen from the host
}

// network is the set of simulated hosts.
type network struct {
	mode     string // "netns" or "loopback"
	hosts    []*host
	subnet   string // CIDR of the hosts' addresses, "" in loopback mode
	addrs    []string
	teardown []func()
}

// command runs name with args on h.
func (h *host) command(name string, args ...string) *exec.Cmd {
	if h.ns == "" {
		return exec.Command(name, args...)
	}
	// ip netns exec execs the command: its pid is the worker's.
	return exec.Command("ip", append([]string{"netns", "exec", h.ns, name}, args...)...)
}

// setLink sets the host side of h's veth up or down: down cuts the host
// off the network (its open connections stall, new ones time out).
func (h *host) setLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ipRun("link", "set", h.veth, state)
}

func ipRun(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetwork makes n simulated hosts: network namespaces when it can (root
// and ip netns work), else n loopback "hosts" (processes on 127.0.0.1,
// which cannot be cut off). It logs the mode, and removes the namespaces
// and veths at the end of t.
func newNetwork(t *testing.T, n int) *network {
	t.Helper()
	removeStaleNamespaces(t)
	var nw *network
	err := fmt.Errorf("%s=1", envLoopback)
	if os.Getenv(envLoopback) != "1" {
		nw, err = makeNamespaces(n)
	}
	if err == nil {
		t.Cleanup(nw.close)
		t.Logf("hosts: %d network namespaces (%s), each on its own veth pair", n, nw.subnet)
		return nw
	}
	t.Logf("hosts: network namespaces unavailable (%v): falling back to %d loopback hosts; network cuts are off", err, n)
	nw = &network{mode: "loopback"}
	for i := 1; i <= n; i++ {
		nw.hosts = append(nw.hosts, &host{n: i, serverAddr: "127.0.0.1"})
	}
	return nw
}

func (nw *network) close() {
	for i := len(nw.teardown) - 1; i >= 0; i-- {
		nw.teardown[i]()
	}
	nw.teardown = nil
}

func makeNamespaces(n int) (nw *network, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("not root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, err
	}
	x, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	nw = &network{mode: "netns", subnet: fmt.Sprintf("10.%d.0.0/16", x)}
	defer func() {
		if err != nil {
			nw.close()
		}
	}()
	pid := os.Getpid()
	for i := 1; i <= n; i++ {
		h := &host{
			n:          i,
			ns:         fmt.Sprintf("%s%dn%d", nsPrefix, pid, i),
			veth:       fmt.Sprintf("%s%dh%d", vethPrefix, pid, i),
			serverAddr: fmt.Sprintf("10.%d.%d.1", x, i),
		}
		peer := fmt.Sprintf("%s%dp%d", vethPrefix, pid, i)
		nsAddr := fmt.Sprintf("10.%d.%d.2/30", x, i)
		if err := ipRun("netns", "add", h.ns); err != nil {
			return nil, err
		}
		nw.teardown = append(nw.teardown, func() { _ = ipRun("netns", "del", h.ns) })
		if err := ipRun("link", "add", h.veth, "type", "veth", "peer", "name", peer); err != nil {
			return nil, err
		}
		// Deleting the namespace deletes the peer, and with it the pair;
		// this also covers a pair whose peer never moved.
		nw.teardown = append(nw.teardown, func() { _ = exec.Command("ip", "link", "del", h.veth).Run() })
		for _, args := range [][]string{
			{"link", "set", peer, "netns", h.ns},
			{"addr", "add", h.serverAddr + "/30", "dev", h.veth},
			{"link", "set", h.veth, "up"},
			{"netns", "exec", h.ns, "ip", "addr", "add", nsAddr, "dev", peer},
			{"netns", "exec", h.ns, "ip", "link", "set", peer, "up"},
			{"netns", "exec", h.ns, "ip", "link", "set", "lo", "up"},
		} {
			if err := ipRun(args...); err != nil {
				return nil, err
			}
		}
		nw.hosts = append(nw.hosts, h)
		nw.addrs = append(nw.addrs, h.serverAddr)
	}
	return nw, nil
}

// freeSubnet returns an X such that no address of the machine is in
// 10.X.0.0/16, starting from one derived from the pid so that two suites
// running at once do not pick the same.
func freeSubnet() (int, error) {
	out, err := exec.Command("ip", "-o", "-4", "addr").Output()
	if err != nil {
		return 0, fmt.Errorf("ip addr: %w", err)
	}
	start := os.Getpid() % 100
	for i := range 100 {
		x := 100 + (start+i)%100
		if !strings.Contains(string(out), fmt.Sprintf("inet 10.%d.", x)) {
			return x, nil
		}
	}
	return 0, fmt.Errorf("no free 10.X.0.0/16 for X in 100..199")
}

// removeStaleNamespaces removes the namespaces and veths of earlier runs
// whose test binary is gone.
func removeStaleNamespaces(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if pid, ok := ownerPid(name, nsPrefix, 'n'); ok && !alive(pid) {
				t.Logf("hosts: removing namespace %s of an earlier aborted run", name)
				_ = ipRun("netns", "del", name)
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if pid, ok := ownerPid(name, vethPrefix, 'h'); ok && !alive(pid) {
				t.Logf("hosts: removing veth %s of an earlier aborted run", name)
				_ = ipRun("link", "del", name)
			}
		}
	}
}

// ownerPid parses <prefix><pid><sep><n>.
func ownerPid(name, prefix string, sep byte) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	i := strings.IndexByte(rest, sep)
	if i <= 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(rest[:i])
	if err != nil {
		return 0, false
	}
	if _, err := strconv.Atoi(rest[i+1:]); err != nil {
		return 0, false
	}
	return pid, true
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
