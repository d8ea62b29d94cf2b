package main

// The request path of the run (without -h3pkg): each request on a QUIC stream of its own, framed
// here rather than by quic-go's http3 request code. Its HEADERS frame is encoded once per URL
// (QPACK static table and literals, as quic-go's encoder does anyway) and written as is; the
// answer's frames are parsed from the worker's reused buffer, with only :status decoded and the
// DATA payload read and dropped. That leaves out, per request, what the http3 package adds for
// a general client (a cancel context and a goroutine watching it, request validation and
// encoding, an http.Response and its header map) and keeps quic-go's transport, whose cost is
// the one worth loading the server with. The connection itself is still an http3.ClientConn:
// it sends the SETTINGS and reads the server's control stream. One difference: the
// ClientConn does not know these streams, so on a GOAWAY it closes the connection at once
// (it sees no request in flight); those in flight then count as errors and the connection is
// dialled again. A benchmark run sees no GOAWAY; -h3pkg handles it as a client should.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/quic-go/quic-go/quicvarint"
)

const (
	frameData    = 0x0
	frameHeaders = 0x1
)

type request struct {
	url   *url.URL
	http  *http.Request // for -h3pkg
	frame []byte        // the HEADERS frame, for the raw path
}

func newRequest(u *url.URL, hdr http.Header) *request {
	var block bytes.Buffer
	enc := qpack.NewEncoder(&block)
	fields := []qpack.HeaderField{
		{Name: ":method", Value: http.MethodGet},
		{Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: u.Host},
		{Name: ":path", Value: u.RequestURI()},
	}
	if hdr.Get("User-Agent") == "" {
		fields = append(fields, qpack.HeaderField{Name: "user-agent", Value: "h3load"})
	}
	for name, values := range hdr {
		for _, v := range values {
			fields = append(fields, qpack.HeaderField{Name: strings.ToLower(name), Value: v})
		}
	}
	for _, f := range fields {
		if err := enc.WriteField(f); err != nil {
			panic(err) // a bytes.Buffer does not fail
		}
	}
	frame := quicvarint.Append(nil, frameHeaders)
	frame = quicvarint.Append(frame, uint64(block.Len()))
	return &request{
		url:   u,
		http:  &http.Request{Method: http.MethodGet, URL: u, Host: u.Host, Header: hdr, Proto: "HTTP/3", ProtoMajor: 3},
		frame: append(frame, block.Bytes()...),
	}
}

// frameReader reads an answer's HTTP/3 frames from a stream through a worker's buffer.
type frameReader struct {
	s    *quic.Stream
	buf  []byte
	r, w int
	dec  *qpack.Decoder
}

var errStatus = errors.New("no valid :status in the answer's HEADERS")

// more reads at least one byte more into the buffer (io.EOF at the stream's end).
func (f *frameReader) more() error {
	if f.r == f.w {
		f.r, f.w = 0, 0
	} else if f.w == len(f.buf) {
		f.w = copy(f.buf, f.buf[f.r:f.w])
		f.r = 0
	}
	n, err := f.s.Read(f.buf[f.w:])
	f.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// need buffers n bytes.
func (f *frameReader) need(n int) error {
	if n > len(f.buf) {
		return fmt.Errorf("a frame of %d bytes is larger than the buffer", n)
	}
	for f.w-f.r < n {
		if f.r+n > len(f.buf) {
			f.w = copy(f.buf, f.buf[f.r:f.w])
			f.r = 0
		}
		if err := f.more(); err != nil {
			if err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

func (f *frameReader) varint() (uint64, error) {
	if err := f.need(1); err != nil {
		return 0, err
	}
	if err := f.need(1 << (f.buf[f.r] >> 6)); err != nil {
		return 0, err
	}
	v, n, err := quicvarint.Parse(f.buf[f.r:f.w])
	f.r += n
	return v, err
}

// skip reads n bytes and drops them; it returns how many it read.
func (f *frameReader) skip(n uint64) (uint64, error) {
	var done uint64
	for done < n {
		if f.r == f.w {
			if err := f.more(); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return done, err
			}
		}
		k := uint64(f.w - f.r)
		if k > n-done {
			k = n - done
		}
		f.r += int(k)
		done += k
	}
	return done, nil
}

// exchange sends req on the stream s and reads its answer: the final status, the body bytes
// read, and an error if the answer was not read whole.
func (f *frameReader) exchange(s *quic.Stream, req *request) (status int, body uint64, err error) {
	f.s, f.r, f.w = s, 0, 0
	if _, err := s.Write(req.frame); err != nil {
		return 0, 0, err
	}
	if err := s.Close(); err != nil && !stoppedNoError(s) {
		return 0, 0, err
	}
	for {
		if f.r == f.w {
			if err := f.more(); err != nil {
				if err == io.EOF && status != 0 {
					return status, body, nil
				}
				if err == io.EOF {
					err = errors.New("the stream ended before the answer's HEADERS")
				}
				return status, body, err
			}
		}
		typ, err := f.varint()
		if err != nil {
			return status, body, err
		}
		length, err := f.varint()
		if err != nil {
			return status, body, err
		}
		switch {
		case typ == frameData:
			if status == 0 {
				return 0, body, errors.New("DATA before the answer's HEADERS")
			}
			n, err := f.skip(length)
			body += n
			if err != nil {
				return status, body, err
			}
		case typ == frameHeaders && status == 0:
			if err := f.need(int(length)); err != nil {
				return 0, body, err
			}
			code, err := f.status(f.buf[f.r : f.r+int(length)])
			f.r += int(length)
			if err != nil {
				return 0, body, err
			}
			if code >= 200 {
				status = code
			} // else an interim 1xx answer: the final HEADERS follow
		default: // trailers, unknown and reserved frame types
			if _, err := f.skip(length); err != nil {
				return status, body, err
			}
		}
	}
}

func (f *frameReader) status(block []byte) (int, error) {
	decode := f.dec.Decode(block)
	for {
		hf, err := decode()
		if err == io.EOF {
			return 0, errStatus
		}
		if err != nil {
			return 0, err
		}
		if hf.Name == ":status" {
			code, err := strconv.Atoi(hf.Value)
			if err != nil || code < 100 || code > 999 {
				return 0, errStatus
			}
			return code, nil
		}
	}
}

// stoppedNoError: the server sent STOP_SENDING with H3_NO_ERROR on the request stream, which
// it may once it has the whole request (RFC 9114 §4.1.1; older quic-go http3 servers, such as
// Caddy 2.6's, may do it before h3load's Close). The answer still comes whole; only that Close
// fails.
func stoppedNoError(s *quic.Stream) bool {
	var se *quic.StreamError
	return errors.As(context.Cause(s.Context()), &se) && se.Remote &&
		se.ErrorCode == quic.StreamErrorCode(http3.ErrCodeNoError)
}
