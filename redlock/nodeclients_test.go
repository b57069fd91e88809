package redlock

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestNodeClients(t *testing.T) {
	t.Parallel()
	nodes, err := NodeClients([]string{"redis://127.0.0.1:1", "redis+cluster://127.0.0.1:2"})
	if err != nil {
		t.Fatalf("NodeClients: %v", err)
	}
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	if _, ok := nodes[0].(*redis.Client); !ok {
		t.Errorf("nodes[0] is %T; want *redis.Client", nodes[0])
	}
	if _, ok := nodes[1].(*redis.ClusterClient); !ok {
		t.Errorf("nodes[1] is %T; want *redis.ClusterClient", nodes[1])
	}
	if o := nodes[0].(*redis.Client).Options(); !o.ContextTimeoutEnabled {
		t.Error("ContextTimeoutEnabled is off")
	}
	_, err = NodeClients([]string{"redis://127.0.0.1:1", "ftp://u:secret@x"})
	if !errors.Is(err, ErrInvalidArgument) || strings.Contains(err.Error(), "secret") {
		t.Errorf("NodeClients(bad URL) = %v; want ErrInvalidArgument without the password", err)
	}
	if _, err := NodeClients(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NodeClients(nil) = %v; want ErrInvalidArgument", err)
	}
}
