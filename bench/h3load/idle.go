package main

// -idle DURATION: idle HTTP/3 connections, for the benchmark's h3-idle-rss row (the server's
// memory per idle connection). The -c connections are made at most idleInflight at a time
// (dialling, handshaking or waiting for the answer), as the bench's TCP idle client keeps at
// most 200 in flight so that no queue overflows; each makes one request to the first URL,
// reads the whole answer and then sends nothing: no keep-alive PINGs, and the client's idle
// timeout is set past the hold, so the server's own idle timeout is the one that counts.
// Every handshake is a full one (no session cache), as in the TCP idle rows.
//
// Output, two lines of JSON on stdout:
//
//	{"idle":N,"failed":N,"seconds":S,"tls":{...}}   once every connection is idle (or failed)
//	{"idle":N,"dropped":N,"held_seconds":S}         at the end
//
// The first line comes as soon as the connections are open: a caller reads the server's memory
// then. The hold ends after DURATION, or at once on SIGTERM or SIGINT (-idle 0: no hold). At
// the end every connection makes one more request (idleInflight at a time, -timeout each); one
// that fails counts as dropped: the server closed it meanwhile (or forgot it: a QUIC idle
// timeout is silent, and the next packet then gets a stateless reset or nothing). Then all are
// closed (CONNECTION_CLOSE). Exit status 1 when no connection could be made idle.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

const idleInflight = 200

// once makes one request on c's connection within cfg.timeout; nil when it was answered 2xx
// and whole.
func (c *conn) once(req *request) error {
	qc, _, _ := c.get()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.timeout)
	defer cancel()
	s, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	s.SetDeadline(time.Now().Add(c.cfg.timeout))
	fr := &frameReader{buf: make([]byte, 64<<10), dec: qpack.NewDecoder()}
	status, _, err := fr.exchange(s, req)
	if err != nil {
		s.CancelRead(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
		s.CancelWrite(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
		return err
	}
	if status < 200 || status > 299 {
		return fmt.Errorf("status %d", status)
	}
	return nil
}

// eachBounded runs f(i) for i in [0, n), at most idleInflight at a time.
func eachBounded(n int, f func(i int)) {
	next := atomic.Int64{}
	var wg sync.WaitGroup
	workers := min(n, idleInflight)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

func runIdle(cfg *config, n int, req *request, hold time.Duration) int {
	cs := make([]*conn, n)
	open := make([]bool, n)
	var failed atomic.Int64
	start := time.Now()
	eachBounded(n, func(i int) {
		c := &conn{cfg: cfg}
		cs[i] = c
		if err := c.dial(); err != nil {
			failed.Add(1)
			cfg.logErr("connecting: %v", err)
			return
		}
		if err := c.once(req); err != nil {
			failed.Add(1)
			cfg.logErr("%s: %v", req.url, err)
			c.close()
			return
		}
		open[i] = true
	})
	idle := n - int(failed.Load())
	ready := map[string]any{"idle": idle, "failed": failed.Load(), "seconds": round3(time.Since(start).Seconds())}
	for i, c := range cs {
		if open[i] {
			ready["tls"] = tlsInfo(c.qc)
			break
		}
	}
	line, _ := json.Marshal(ready)
	fmt.Println(string(line))

	held := time.Now()
	if hold > 0 {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		timer := time.NewTimer(hold)
		select {
		case <-timer.C:
		case <-sig:
		}
		signal.Stop(sig)
	}
	heldFor := time.Since(held)

	var dropped atomic.Int64
	eachBounded(n, func(i int) {
		if !open[i] {
			return
		}
		if err := cs[i].once(req); err != nil {
			dropped.Add(1)
			cfg.logErr("after the hold: %v", err)
		}
	})
	cfg.stopped.Store(true)
	cfg.stop()
	eachBounded(n, func(i int) {
		if open[i] {
			cs[i].close()
		}
	})
	line, _ = json.Marshal(map[string]any{"idle": idle, "dropped": dropped.Load(),
		"held_seconds": round3(heldFor.Seconds())})
	fmt.Println(string(line))
	if idle == 0 {
		return 1
	}
	return 0
}

// tlsInfo is what a connection negotiated, for the output: the bench checks that every server
// negotiates the same with the same client.
func tlsInfo(qc *quic.Conn) map[string]any {
	st := qc.ConnectionState().TLS
	return map[string]any{
		"version": tls.VersionName(st.Version),
		"cipher":  tls.CipherSuiteName(st.CipherSuite),
		"group":   st.CurveID.String(),
		"alpn":    st.NegotiatedProtocol,
		"resumed": st.DidResume,
	}
}
