// Package nodeaddr names a node client for errors, hooks and status lines:
// redlock, election and qlock print nodes the same way.
package nodeaddr

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Of returns the address of a node client: host:port for a single-node
// client, "cluster(addr,...)" for a Cluster client, and the client's type
// for any other kind.
func Of(n redis.UniversalClient) string {
	switch c := n.(type) {
	case *redis.ClusterClient:
		return "cluster(" + strings.Join(c.Options().Addrs, ",") + ")"
	case interface{ Options() *redis.Options }:
		return c.Options().Addr
	}
	return fmt.Sprintf("%T", n)
}
