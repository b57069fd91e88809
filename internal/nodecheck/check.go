// Package nodecheck holds the checks of a redlock Client's node list that
// need no I/O, or only Dial's: one server counted twice, or a replica
// counted as a master, would make a "majority" that is not one. A redlock
// Client's New checks what it can know without I/O (the same client, the
// same address); its Dial also asks each node what it is (ROLE, INFO
// run_id). It also says what a node's error means where Dial and the node
// layer both ask (AuthRefused, IsTimeout). The node layer's own check that
// no two nodes reach one server, before the first lock request, is package
// node's (identity.go).
package nodecheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// FailoverAddr is the placeholder go-redis puts in the Options().Addr of a
// Sentinel failover client: not an address.
const FailoverAddr = "FailoverClient"

// DuplicateNode reports whether nodes[i] is a client that appears earlier
// in nodes, or reaches an address that an earlier one reaches: it returns
// the earlier index and why, or -1. It does no I/O. Addresses are compared
// as the clients hold them (network and host:port, or a Cluster client's
// seeds, any one of which is enough), so "localhost" and "127.0.0.1" differ
// here; Dial's run_id check catches those. A failover client's master is
// not known without asking the Sentinels, so it is compared by value only.
// Every node must be non-nil.
func DuplicateNode(nodes []redis.UniversalClient, i int) (int, string) {
	mine := serverAddrs(nodes[i])
	for j, prev := range nodes[:i] {
		if sameClient(prev, nodes[i]) {
			return j, "are the same client"
		}
		for _, a := range serverAddrs(prev) {
			if slices.Contains(mine, a) {
				return j, "both reach " + strings.TrimPrefix(a, "tcp ")
			}
		}
	}
	return -1, ""
}

// DroppedCommands returns why go-redis would drop commands sent through n
// and report success, or "". go-redis runs a pipeline (on a Cluster client,
// every command) in a loop of MaxRetries+1 (MaxRedirects+1) attempts, once
// -1 has become 0: a value below -1 makes that loop run no attempt, and the
// call returns nil without a reply. An Unlock would then report success and
// leave the key on the node (found by FuzzDial: max_retries=-5).
func DroppedCommands(n redis.UniversalClient) string {
	const hint = "go-redis would send no pipelined command and report success; use -1 for no retries"
	switch c := n.(type) {
	case *redis.ClusterClient:
		switch o := c.Options(); {
		case o.MaxRedirects < 0:
			return fmt.Sprintf("MaxRedirects (max_redirects) %d is below -1: %s", o.MaxRedirects, hint)
		case o.MaxRetries < -1:
			return fmt.Sprintf("MaxRetries (max_retries) %d is below -1: %s", o.MaxRetries, hint)
		}
	case interface{ Options() *redis.Options }:
		// Options() holds the values after go-redis's defaults: -1 is 0.
		if o := c.Options(); o != nil && o.MaxRetries < 0 {
			return fmt.Sprintf("MaxRetries (max_retries) %d is below -1: %s", o.MaxRetries, hint)
		}
	}
	return ""
}

// sameClient reports whether a and b are the same pointer. Other kinds of
// values are not compared: == on an interface panics when the dynamic type
// is not comparable.
func sameClient(a, b redis.UniversalClient) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Type() == vb.Type() && va.Kind() == reflect.Pointer && va.Pointer() == vb.Pointer()
}

// serverAddrs returns the addresses through which n reaches its server,
// each as "network host:port": a client's own, a Cluster client's seeds;
// none for a failover client or a client that does not say.
func serverAddrs(n redis.UniversalClient) []string {
	switch c := n.(type) {
	case *redis.ClusterClient:
		var out []string
		for _, a := range c.Options().Addrs {
			out = append(out, "tcp "+a)
		}
		return out
	case interface{ Options() *redis.Options }:
		o := c.Options()
		if o == nil || o.Addr == FailoverAddr {
			return nil
		}
		network := o.Network
		if network == "" {
			network = "tcp"
		}
		return []string{network + " " + o.Addr}
	}
	return nil
}

// ErrUnverified wraps the replies that kept a Client's Dial from checking a node: an
// ACL without +role or +info (NOPERM), or a server that lacks the command
// (miniredis, a renamed command).
var ErrUnverified = errors.New("redlock: dial: cannot verify that the node is a master distinct from the others (Dial goes on; an ACL user needs +role and +info for this check)")

// ServerInfo is what one node said of itself (ProbeNode).
type ServerInfo struct {
	Err        error  // the node failed: PING's error, or a transport error
	Role       string // ROLE's first field ("master", "slave", "sentinel"); "" if unknown
	RunID      string // INFO server's run_id; "" if unknown
	Unverified error  // why role or runID is unknown (wraps ErrUnverified), or nil
}

// ProbeNode sends PING, then ROLE and INFO server, to n, all within ctx.
// They go one after the other on PING's connection: a pipeline would take
// another connection from go-redis's pipeline pool (another handshake), and
// go-redis retries a pipeline on errors it does not retry a PING on (such
// as a certificate that does not verify), until ctx ends. A Cluster client
// gets PING only: it routes every key to the master of its slot, and INFO
// would go to any one of its nodes.
func ProbeNode(ctx context.Context, n redis.UniversalClient) ServerInfo {
	if err := n.Ping(ctx).Err(); err != nil {
		return ServerInfo{Err: err}
	}
	if _, ok := n.(*redis.ClusterClient); ok {
		return ServerInfo{}
	}
	// A reply (NOPERM, unknown command) means "cannot verify"; any other
	// error (a timeout, a reset) means the node failed this round, as it
	// would have failed a lock.
	failed := func(err error) bool {
		re := redis.Error(nil)
		return err != nil && !errors.As(err, &re)
	}
	var pr ServerInfo
	var why []error
	v, err := n.Do(ctx, "ROLE").Result()
	if failed(err) {
		return ServerInfo{Err: err}
	}
	if role, ok := v.([]any); ok && len(role) > 0 {
		pr.Role, _ = role[0].(string)
	}
	if err == nil && pr.Role == "" {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		why = append(why, fmt.Errorf("ROLE: %w", err))
	}
	info, err := n.Info(ctx, "server").Result()
	if failed(err) {
		return ServerInfo{Err: err}
	}
	if pr.RunID = infoField(info, "run_id"); err == nil && pr.RunID == "" {
		err = errors.New("no run_id in the reply")
	}
	if err != nil {
		why = append(why, fmt.Errorf("INFO server: %w", err))
	}
	if len(why) > 0 {
		pr.Unverified = fmt.Errorf("%w: %w", ErrUnverified, errors.Join(why...))
	}
	return pr
}

// infoField returns field's value in an INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// UnsafeNodes returns an error made by invalid (the Client's
// ErrInvalidArgument) for every node
// that said it is not a master and for every pair that reached one server
// (same run_id), naming each by its index and name(i); nil if none.
func UnsafeNodes(probes []ServerInfo, name func(int) string, invalid func(format string, args ...any) error) error {
	var errs []error
	first := make(map[string]int) // run_id → first node with it
	for i, p := range probes {
		if p.Err != nil {
			continue
		}
		if p.Role != "" && p.Role != "master" {
			errs = append(errs, invalid("urls[%d] (%s) is not a master (ROLE says %q): locks are written to masters only", i, name(i), p.Role))
		}
		if p.RunID == "" {
			continue
		}
		if j, ok := first[p.RunID]; ok {
			errs = append(errs, invalid("urls[%d] (%s) and urls[%d] (%s) reach one server (run_id %s): one server counted twice is not a majority", j, name(j), i, name(i), p.RunID))
			continue
		}
		first[p.RunID] = i
	}
	return errors.Join(errs...)
}

// AuthRefused reports whether err is the node's refusal of the client's
// credentials: WRONGPASS (a wrong password or user) or NOAUTH (none sent
// where one is required).
func AuthRefused(err error) bool {
	return redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "NOAUTH")
}

// IsTimeout reports whether err is a deadline or a network timeout.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
