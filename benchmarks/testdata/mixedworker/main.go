// Command mixedworker is one process of TestMixedVersions (versions_test.go):
// it locks one resource again and again through one redlock.Client, and
// holds it by creating a directory that no other holder may have (mkdir
// fails if it exists: an overlap). The test builds it twice, against the
// library of this tree and against an older one, and runs both on the
// same keys. It prints "acquired N overlaps M errors E" and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
	"github.com/redis/go-redis/v9"
)

func main() {
	nodes := flag.String("nodes", "", "comma-separated host:port")
	resource := flag.String("resource", "mixed", "")
	dir := flag.String("dir", "", "the directory whose held/ marks the holder")
	d := flag.Duration("duration", 3*time.Second, "")
	hold := flag.Duration("hold", time.Millisecond, "")
	flag.Parse()
	var clients []redis.UniversalClient
	for _, a := range strings.Split(*nodes, ",") {
		clients = append(clients, redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true}))
	}
	c, err := redlock.New(clients, redlock.WithTTL(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	held := filepath.Join(*dir, "held")
	var acquired, overlaps, errs int
	end := time.Now().Add(*d)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := c.Lock(ctx, *resource)
		cancel()
		if err != nil {
			errs++
			fmt.Fprintln(os.Stderr, "lock:", err)
			continue
		}
		acquired++
		if err := os.Mkdir(held, 0o700); err != nil {
			overlaps++
		} else {
			time.Sleep(*hold)
			_ = os.Remove(held)
		}
		if err := l.Unlock(context.Background()); err != nil {
			errs++
			fmt.Fprintln(os.Stderr, "unlock:", err)
		}
	}
	_ = c.Close()
	for _, cl := range clients {
		_ = cl.Close()
	}
	fmt.Printf("acquired %d overlaps %d errors %d\n", acquired, overlaps, errs)
}
