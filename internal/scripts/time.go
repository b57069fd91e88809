package scripts

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed time.lua
var timeSrc string

var timeScript = newScript(timeSrc)

// Time reads the clock of the server that serves key's slot, with one
// script (two round trips when the node answers NOSCRIPT first). A Redis
// Cluster client routes it to the key's master; sent to a master's own
// client, it fails with MOVED or ASK there unless that master serves the
// key's slot.
func Time(ctx context.Context, c redis.Scripter, key string) (time.Time, error) {
	v, err := timeScript.Run(ctx, c, []string{key}).Slice()
	if err != nil {
		return time.Time{}, err
	}
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("time.lua: unexpected reply %v", v)
	}
	var n [2]int64
	for j, x := range v {
		switch x := x.(type) {
		case int64:
			n[j] = x
		case string:
			if n[j], err = strconv.ParseInt(x, 10, 64); err != nil {
				return time.Time{}, fmt.Errorf("time.lua: unexpected reply %v", v)
			}
		default:
			return time.Time{}, fmt.Errorf("time.lua: unexpected reply %v", v)
		}
	}
	return time.Unix(n[0], n[1]*1000), nil
}
