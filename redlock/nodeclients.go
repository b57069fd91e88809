package redlock

import (
	"github.com/redis/go-redis/v9"
)

// NodeClients builds one go-redis client per URL, exactly as Dial does (the
// same URL forms, WithTLSConfig, ContextTimeoutEnabled), without any I/O and
// without a Client. It is for code that needs its own plain connections to
// the nodes of a Client made with Dial: the election package's identity
// keys, or a status command reading keys node by node. The caller closes
// the clients. Options other than WithTLSConfig are ignored.
//
// It returns an error matching ErrInvalidArgument, naming the URL by its
// index with its password redacted, when there are no URLs or one does not
// parse; it then closes what it built.
func NodeClients(urls []string, opts ...Option) ([]redis.UniversalClient, error) {
	if len(urls) == 0 {
		return nil, invalid("urls: at least one URL is needed")
	}
	tlsCfg := tlsConfig(opts)
	nodes := make([]redis.UniversalClient, 0, len(urls))
	for i, raw := range urls {
		n, _, err := dialURL(raw, tlsCfg)
		if err != nil {
			for _, n := range nodes {
				n.Close()
			}
			return nil, invalid("urls[%d] (%s): %v", i, redact(raw), err)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}
