package sim

import (
	"bytes"
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// TestNet_largeWriteAccepted is seed 2702's regression (docs/simulation.md,
// "Noticed and left alone"): a request larger than one chunk of the old
// up-forwarder (4 KB; the rw scripts' EVAL is 7.6 KB) was accepted a chunk
// per one-way delay, so a client whose node timeout ended mid-write lost
// the rest, and the node got a truncated command, where TCP would have
// taken the whole request into the socket buffer and delivered it late.
// A write of up to upChunk bytes is accepted at once, and once the client
// gives up and closes, the node still receives every byte of it.
func TestNet_largeWriteAccepted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		got := make(chan []byte, 1)
		serve := func(int) (net.Conn, error) {
			srv, peer := net.Pipe()
			go func() {
				b, _ := io.ReadAll(peer)
				got <- b
			}()
			return srv, nil
		}
		n := newNetwork(1, 1, 1, serve)
		defer n.close()
		n.setDelay(0, 0, 40*time.Millisecond) // seed 2702's quiet lag, one way
		cli, err := n.dial(t.Context(), 0, 0)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		req := bytes.Repeat([]byte("x"), 8000)
		// The node timeout (100 ms) is far shorter than a lag per 4 KB
		// chunk would make the write, were it accepted chunk by chunk.
		if err := cli.SetWriteDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Write(req); err != nil {
			t.Fatalf("a write of %d bytes was not accepted at once, as into a socket buffer: %v", len(req), err)
		}
		_ = cli.Close() // the client gives up before the request lands
		select {
		case b := <-got:
			if !bytes.Equal(b, req) {
				t.Fatalf("the node received %d of the %d bytes written before the client closed", len(b), len(req))
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the node never saw the connection end")
		}
	})
}
