// h3load: an HTTP/3 load generator for tern's benchmark (rows h3-small and h3-large, and the
// idle connections of h3-idle-rss), in the manner of h2load, on quic-go (transport and http3
// connection) pinned by go.mod.
//
//	h3load [-c connections] [-m streams] [-d duration | -n requests | -idle duration]
//	       [-k | -ca FILE] [-sni NAME] [-groups LIST] [-H 'name: value']... [-timeout D]
//	       [-h3pkg] [-cpuprofile F] URL [URL...]
//
// Each connection has a UDP socket of its own (so a server that spreads flows over
// SO_REUSEPORT sockets by 4-tuple sees -c flows, as with h2load's TCP connections) and -m
// workers, each keeping one GET in flight on it: -m concurrent streams per connection.
// Requests go to the URLs (one host and port) in turn. The handshakes are made before the
// clock starts. With -d the run stops at the deadline: requests still in flight then are not
// counted, and the connections are closed. With -n the run stops when that many requests are
// done (or -timeout after the start: what is unfinished then counts as errors). A connection
// that dies (idle timeout, CONNECTION_CLOSE, stateless reset) is dialled again.
//
// Output, one line of JSON on stdout:
//
//	{"requests":N,"ok":N,"errors":N,"bytes":N,"seconds":S,"rps":R,"p50_us":..,"p99_us":..,
//	 "cpu_seconds":C,"tls":{"version":..,"cipher":..,"group":..,"alpn":..,"resumed":..}}
//
// requests: requests finished (answered or failed) within the run; ok: those answered with a
// 2xx status and their whole body; errors: the others (failed streams or connections,
// other statuses); bytes: response body bytes read (all of them, also those of requests cut
// at the deadline); rps: ok / seconds; p50_us, p99_us: request times of the ok requests (from
// opening the stream to the body's end), within about 1.6 %; cpu_seconds: the CPU time h3load
// itself used during the run (user + system), to tell when the client, not the server, was
// the limit (near 1.0 per second of run on one core); tls: what the first connection
// negotiated (the key exchange is -groups', x25519 alone by default, as h2load's and
// tlsload's OpenSSL 3.0 offer first). The first errors are described on
// stderr; the exit status is 1 when no request succeeded, 2 on bad arguments or when a
// connection cannot be made (stdout then has one line {"error": "..."}).
//
// Requests are framed by h3load itself (raw.go) on streams of the http3.ClientConn's QUIC
// connection; -h3pkg sends them with quic-go's http3 request code instead (slower, for
// comparison). It pins no CPU and starts no threads of its own: run it under taskset to pin
// it. Flow control never holds a server back (windows of 64 MiB per stream, 1 GiB per
// connection, like h2load's -w30 -W30), and no Accept-Encoding is sent.
//
// -idle DURATION holds idle connections instead of loading the server (idle.go): it prints a
// line once they are open and another when the hold ends.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// A log-linear histogram of microseconds: values under 128 exactly, above that 64 buckets per
// power of two. 128 + 64*57 buckets reach past 2^63.
const histBuckets = 128 + 64*57

func bucketOf(v uint64) int {
	if v < 128 {
		return int(v)
	}
	shift := bits.Len64(v) - 7
	return 128 + (shift-1)*64 + int(v>>uint(shift)) - 64
}

func valueOf(i int) uint64 {
	if i < 128 {
		return uint64(i)
	}
	k := i - 128
	shift := uint(k/64 + 1)
	return (uint64(k%64+64) << shift) + (uint64(1)<<shift)/2
}

// The counters of one connection's workers (atomics: several workers share them).
type stats struct {
	requests, ok, errors, bytes atomic.Uint64
	hist                        [histBuckets]atomic.Uint64
}

type config struct {
	addr     *net.UDPAddr
	tls      *tls.Config
	quic     *quic.Config
	h3       *http3.Transport
	timeout  time.Duration
	deadline time.Time // -d: requests that end after it are not counted
	h3pkg    bool      // requests by quic-go's http3 request code
	stopped  atomic.Bool
	ctx      context.Context // cancelled when the run stops: ends redials
	stop     context.CancelFunc
	limited  bool         // -n
	left     atomic.Int64 // -n: requests not yet claimed by a worker
	errLog   atomic.Int64 // error lines still to print
	reconns  atomic.Uint64
}

func (cfg *config) logErr(format string, a ...any) {
	if cfg.errLog.Add(-1) >= 0 {
		fmt.Fprintf(os.Stderr, "h3load: "+format+"\n", a...)
	}
}

// One connection: its own UDP socket and quic.Transport, redialled when it dies.
type conn struct {
	cfg   *config
	mu    sync.Mutex
	gen   uint64
	tr    *quic.Transport
	qc    *quic.Conn
	cc    *http3.ClientConn
	stats stats
}

func (c *conn) dial() error {
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return err
	}
	tr := &quic.Transport{Conn: udp}
	ctx, cancel := context.WithTimeout(c.cfg.ctx, c.cfg.timeout)
	defer cancel()
	qc, err := tr.Dial(ctx, c.cfg.addr, c.cfg.tls, c.cfg.quic)
	if err != nil {
		tr.Close()
		udp.Close()
		return err
	}
	if c.tr != nil {
		c.qc.CloseWithError(0, "")
		old := c.tr
		go func() { old.Close(); old.Conn.Close() }()
	}
	c.tr, c.qc, c.cc = tr, qc, c.cfg.h3.NewClientConn(qc)
	c.gen++
	return nil
}

func (c *conn) get() (*quic.Conn, *http3.ClientConn, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.qc, c.cc, c.gen
}

// redial replaces connection number gen if no other worker did it already.
func (c *conn) redial(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen || c.cfg.stopped.Load() {
		return
	}
	c.cfg.reconns.Add(1)
	if err := c.dial(); err != nil {
		c.cfg.logErr("reconnecting: %v", err)
		time.Sleep(10 * time.Millisecond) // a refusing server is not spun on
	}
}

func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.qc != nil {
		c.qc.CloseWithError(0, "")
		c.tr.Close()
		c.tr.Conn.Close()
	}
}

// worker keeps one request at a time in flight on c until the run ends.
func (c *conn) worker(reqs []*request, first int, wg *sync.WaitGroup) {
	defer wg.Done()
	cfg := c.cfg
	st := &c.stats
	fr := &frameReader{buf: make([]byte, 64<<10), dec: qpack.NewDecoder()}
	for i := first; ; i++ {
		if cfg.stopped.Load() {
			return
		}
		if cfg.limited && cfg.left.Add(-1) < 0 {
			return
		}
		req := reqs[i%len(reqs)]
		qc, cc, gen := c.get()
		t0 := time.Now()
		var status int
		var n uint64
		var err error
		var cancel func()
		if cfg.h3pkg {
			status, n, err, cancel = c.exchangeH3(cc, req, fr.buf)
		} else {
			var s *quic.Stream
			if s, err = qc.OpenStreamSync(context.Background()); err == nil {
				status, n, err = fr.exchange(s, req)
				cancel = func() {
					s.CancelRead(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
					s.CancelWrite(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
				}
			}
		}
		st.bytes.Add(n)
		if err != nil {
			if cancel != nil {
				cancel()
			}
			if c.count(false, t0) {
				cfg.logErr("%s: %v", req.url, err)
			}
			if cancel == nil || qc.Context().Err() != nil {
				// Closed (or, -h3pkg, after a GOAWAY): no new stream can be opened on it.
				c.redial(gen)
			}
			continue
		}
		ok := status >= 200 && status < 300
		if !c.count(ok, t0) || ok {
			continue
		}
		cfg.logErr("%s: status %d", req.url, status)
	}
}

// exchangeH3 is a request by quic-go's http3 request code (-h3pkg), for comparison. cancel
// is nil when no stream could be opened.
func (c *conn) exchangeH3(cc *http3.ClientConn, req *request, buf []byte) (status int, n uint64, err error, cancel func()) {
	str, err := cc.OpenRequestStream(context.Background())
	if err != nil {
		return 0, 0, err, nil
	}
	cancel = func() {
		str.CancelRead(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
		str.CancelWrite(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
	}
	if err = str.SendRequestHeader(req.http); err != nil {
		return 0, 0, err, cancel
	}
	str.Close()
	rsp, err := str.ReadResponse()
	if err != nil {
		return 0, 0, err, cancel
	}
	for {
		k, err := str.Read(buf)
		n += uint64(k)
		if err == io.EOF {
			return rsp.StatusCode, n, nil, cancel
		}
		if err != nil {
			return rsp.StatusCode, n, err, cancel
		}
	}
}

// count records a finished request; false when it ended after the run (not counted).
func (c *conn) count(ok bool, t0 time.Time) bool {
	now := time.Now()
	cfg := c.cfg
	if cfg.stopped.Load() || (!cfg.deadline.IsZero() && now.After(cfg.deadline)) {
		return false
	}
	st := &c.stats
	st.requests.Add(1)
	if !ok {
		st.errors.Add(1)
		return true
	}
	st.ok.Add(1)
	us := uint64(now.Sub(t0) / time.Microsecond)
	st.hist[bucketOf(us)].Add(1)
	return true
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "h3load: "+format+"\n", a...)
	os.Exit(2)
}

func main() { os.Exit(run()) }

func run() int {
	conns := flag.Int("c", 1, "connections (each with its own UDP socket)")
	streams := flag.Int("m", 1, "concurrent streams (requests in flight) per connection")
	duration := flag.Duration("d", 0, "run for this long (e.g. 2s), or")
	requests := flag.Int64("n", 0, "send this many requests in all (default 1 without -d)")
	insecure := flag.Bool("k", false, "accept any server certificate")
	caFile := flag.String("ca", "", "trust the CA certificates in this PEM file (instead of the system's)")
	sni := flag.String("sni", "", "TLS server name (default: the URL's host)")
	timeout := flag.Duration("timeout", 30*time.Second, "handshake timeout; with -n, the whole run's")
	h3pkg := flag.Bool("h3pkg", false, "send requests with quic-go's http3 request code (slower; for comparison)")
	cpuProfile := flag.String("cpuprofile", "", "write a Go CPU profile of the run to this file")
	idle := flag.Duration("idle", 0, "open the -c connections, one request each, then hold them idle this long (see idle.go)")
	groups := flag.String("groups", "x25519", "TLS key exchange groups offered, in order: x25519, p256, p384, x25519mlkem768")
	var headers headerFlags
	flag.Var(&headers, "H", "add a request header 'name: value' (repeatable)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: h3load [-c N] [-m N] [-d DURATION | -n N | -idle DURATION] [-k | -ca FILE] [-sni NAME] [-groups LIST] [-H 'name: value']... [-timeout D] [-h3pkg] [-cpuprofile F] URL [URL...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 || *conns < 1 || *streams < 1 || *duration < 0 || *requests < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *duration > 0 && *requests > 0 {
		fail("-d and -n exclude each other")
	}
	idleMode := false
	flag.Visit(func(f *flag.Flag) { idleMode = idleMode || f.Name == "idle" })
	if idleMode && (*duration > 0 || *requests > 0 || *h3pkg || *idle < 0) {
		fail("-idle excludes -d, -n and -h3pkg, and takes a duration ≥ 0")
	}
	curves, err := parseGroups(*groups)
	if err != nil {
		fail("-groups: %v", err)
	}
	if *duration == 0 && *requests == 0 {
		*requests = 1
	}

	var host string
	var urls []*url.URL
	for _, a := range flag.Args() {
		u, err := url.Parse(a)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			fail("%q: not an https:// URL", a)
		}
		if host != "" && u.Host != host {
			fail("all URLs must name the same host and port (%s, %s)", host, u.Host)
		}
		host = u.Host
		urls = append(urls, u)
	}
	hostname, port := urls[0].Hostname(), urls[0].Port()
	if port == "" {
		port = "443"
	}
	addr, err := net.ResolveUDPAddr("udp", net.JoinHostPort(hostname, port))
	if err != nil {
		fail("%v", err)
	}

	tlsConf := &tls.Config{
		ServerName:         hostname,
		NextProtos:         []string{http3.NextProtoH3},
		InsecureSkipVerify: *insecure,
		// One session cache: a reconnect resumes. The first handshakes are full ones.
		ClientSessionCache: tls.NewLRUClientSessionCache(*conns),
		// x25519 alone by default, as h2load's and tlsload's OpenSSL 3.0 get: every server
		// negotiates the same key exchange (Go's default would offer X25519MLKEM768 first).
		CurvePreferences: curves,
	}
	if idleMode {
		tlsConf.ClientSessionCache = nil // full handshakes only, as the TCP idle rows make
	}
	if *sni != "" {
		tlsConf.ServerName = *sni
	}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fail("%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("%s: no PEM certificate", *caFile)
		}
		tlsConf.RootCAs = pool
	}
	cfg := &config{
		addr: addr,
		tls:  tlsConf,
		quic: &quic.Config{
			HandshakeIdleTimeout:           *timeout,
			MaxIdleTimeout:                 *timeout,
			InitialStreamReceiveWindow:     64 << 20,
			MaxStreamReceiveWindow:         64 << 20,
			InitialConnectionReceiveWindow: 1 << 30,
			MaxConnectionReceiveWindow:     1 << 30,
		},
		h3:      &http3.Transport{DisableCompression: true},
		timeout: *timeout,
	}
	if idleMode {
		// Past the hold: the server's idle timeout decides whether a connection lives.
		cfg.quic.MaxIdleTimeout = *idle + 2**timeout
	}
	cfg.errLog.Store(10)
	cfg.ctx, cfg.stop = context.WithCancel(context.Background())

	var hdr http.Header = make(http.Header)
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			fail("-H %q: not 'name: value'", h)
		}
		hdr.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	requestList := make([]*request, len(urls))
	for i, u := range urls {
		requestList[i] = newRequest(u, hdr)
	}
	cfg.h3pkg = *h3pkg

	// Fewer collections: the garbage of a run is small and short-lived.
	debug.SetGCPercent(400)

	if idleMode {
		return runIdle(cfg, *conns, requestList[0], *idle)
	}

	// The handshakes, all at once, before the clock starts.
	cs := make([]*conn, *conns)
	var dialWg sync.WaitGroup
	dialErrs := make([]error, *conns)
	for i := range cs {
		cs[i] = &conn{cfg: cfg}
		dialWg.Add(1)
		go func(i int) {
			defer dialWg.Done()
			dialErrs[i] = cs[i].dial()
		}(i)
	}
	dialWg.Wait()
	for _, err := range dialErrs {
		if err != nil {
			for _, c := range cs {
				c.close()
			}
			out, _ := json.Marshal(map[string]any{"error": "connecting: " + err.Error()})
			fmt.Println(string(out))
			os.Exit(2)
		}
	}

	negotiated := tlsInfo(cs[0].qc) // (before the run: a redial may replace it)
	cfg.limited = *requests > 0
	cfg.left.Store(*requests)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail("%v", err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	start := time.Now()
	if *duration > 0 {
		cfg.deadline = start.Add(*duration)
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		for j := 0; j < *streams; j++ {
			wg.Add(1)
			go c.worker(requestList, j, &wg)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	limit := *timeout
	if *duration > 0 {
		limit = *duration
	}
	timer := time.NewTimer(limit)
	var end time.Time
	select {
	case <-done:
		end = time.Now()
	case <-timer.C:
		end = time.Now()
		if *duration > 0 {
			end = cfg.deadline
		}
	}
	cpu := cpuTime() - cpu0
	cfg.stopped.Store(true)
	cfg.stop()
	for _, c := range cs {
		c.close()
	}
	<-done

	var total stats
	var hist [histBuckets]uint64
	for _, c := range cs {
		total.requests.Add(c.stats.requests.Load())
		total.ok.Add(c.stats.ok.Load())
		total.errors.Add(c.stats.errors.Load())
		total.bytes.Add(c.stats.bytes.Load())
		for i := range hist {
			hist[i] += c.stats.hist[i].Load()
		}
	}
	reqs, ok := total.requests.Load(), total.ok.Load()
	errs := total.errors.Load()
	if *requests > 0 && reqs < uint64(*requests) {
		// Cut by -timeout: the requests never finished are failures too.
		fmt.Fprintf(os.Stderr, "h3load: %d requests unfinished after %s\n", uint64(*requests)-reqs, *timeout)
		errs += uint64(*requests) - reqs
		reqs = uint64(*requests)
	}
	if n := cfg.reconns.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "h3load: %d reconnections\n", n)
	}
	pct := func(p float64) uint64 {
		if ok == 0 {
			return 0
		}
		rank := uint64(p*float64(ok)/100 + 0.5)
		if rank < 1 {
			rank = 1
		}
		var seen uint64
		for i, n := range hist {
			seen += n
			if seen >= rank {
				return valueOf(i)
			}
		}
		return 0
	}
	secs := end.Sub(start).Seconds()
	out := struct {
		Requests uint64  `json:"requests"`
		OK       uint64  `json:"ok"`
		Errors   uint64  `json:"errors"`
		Bytes    uint64  `json:"bytes"`
		Seconds  float64 `json:"seconds"`
		RPS      float64 `json:"rps"`
		P50      uint64  `json:"p50_us"`
		P99      uint64  `json:"p99_us"`
		CPU      float64 `json:"cpu_seconds"`
		TLS      any     `json:"tls"`
	}{reqs, ok, errs, total.bytes.Load(), round3(secs), round3(float64(ok) / secs), pct(50), pct(99), round3(cpu),
		negotiated}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	if errs > 0 && ok == 0 {
		return 1
	}
	return 0
}

// cpuTime is the CPU time (user and system) this process has used so far, in seconds.
func cpuTime() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// parseGroups reads -groups: key exchange groups by name, in the order given.
func parseGroups(list string) ([]tls.CurveID, error) {
	names := map[string]tls.CurveID{
		"x25519": tls.X25519, "p256": tls.CurveP256, "p384": tls.CurveP384,
		"x25519mlkem768": tls.X25519MLKEM768,
	}
	var out []tls.CurveID
	for _, n := range strings.Split(list, ",") {
		id, ok := names[strings.ToLower(strings.TrimSpace(n))]
		if !ok {
			return nil, fmt.Errorf("unknown group %q", n)
		}
		out = append(out, id)
	}
	return out, nil
}
