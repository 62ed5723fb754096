package loader

import (
	"context"
	"encoding/binary"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	"github.com/xpuhub/xpu/abi"
)

// The isolated transport: one unary gRPC method, /xpu.Backend/Call, that carries one
// function-table call. protoc is not available to this build, so the two messages are encoded
// by a small binary codec registered with grpc under its own content subtype ("xpurpc"); the
// protobuf codec that go-plugin's own services use is left alone. Tensor bytes never travel in
// these messages: buffers are memfd shared memory mapped by both processes (shm.go).

// rpc operations, one per function-table entry the isolated backend forwards. The numbers are
// wire format shared with a plugin host that may be another xpu build (XPU_PLUGIN_HOST), so each
// is written out (never iota: inserting an op must not renumber the others). Never renumber or
// reuse one; a new op takes the next free number, and any change a host of the previous
// revision would misread bumps wireRevision (which the handshake checks).
const (
	opInfo              uint32 = 1
	opOpSupport         uint32 = 2
	opContextCreate     uint32 = 3
	opContextRelease    uint32 = 4
	opBufferAlloc       uint32 = 5
	opBufferImportFD    uint32 = 6
	opBufferRelease     uint32 = 7
	opAnalyze           uint32 = 8
	opPrepare           uint32 = 9
	opSerialize         uint32 = 10
	opExecutableRelease uint32 = 11
	opExecutionCreate   uint32 = 12
	opExecutionBind     uint32 = 13
	opExecutionSubmit   uint32 = 14
	opExecutionRun      uint32 = 15
	opExecutionRelease  uint32 = 16
	opFenceCreate       uint32 = 17
	opFenceWait         uint32 = 18
	opFenceValue        uint32 = 19
	opFenceSignal       uint32 = 20
	opFenceRelease      uint32 = 21
	opShutdown          uint32 = 22
	opRingAttach        uint32 = 23 // U[0]: the fd id of the run ring's memfd (ring.go)
)

// wireRevision counts incompatible revisions of this transport: op numbers and meanings, the
// codec below, the fd socket's messages and the shared run ring's layout. Bump it with any such
// change.
const wireRevision = 2

// protocolVersion is what the go-plugin handshake compares: the ABI major and the wire revision
// together, so that a host and a plugin host that differ in either refuse each other at start
// instead of misreading calls.
const protocolVersion = abi.ABIMajor*1000 + wireRevision

// rpcReq is one call. U holds the integer arguments in the entry's order (handles, sizes,
// offsets, values); S a string (options); B and C byte blobs (IR, cache); F fence points.
type rpcReq struct {
	Op uint32
	U  [6]uint64
	S  string
	B  []byte
	C  []byte
	F  []abi.FencePoint
}

// rpcResp is a call's answer. On failure S holds the plugin's last_error text.
type rpcResp struct {
	Status int32
	U      [2]uint64
	S      string
	B      []byte
}

const codecName = "xpurpc"

// maxBlob bounds every length field so that a corrupt message cannot make the decoder allocate
// without limit.
const maxBlob = 1 << 30

type rpcCodec struct{}

func (rpcCodec) Name() string { return codecName }

func (rpcCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *rpcReq:
		b := make([]byte, 0, 4+48+16+len(m.S)+len(m.B)+len(m.C)+16*len(m.F))
		b = binary.LittleEndian.AppendUint32(b, m.Op)
		for _, u := range m.U {
			b = binary.LittleEndian.AppendUint64(b, u)
		}
		b = appendBlob(b, []byte(m.S))
		b = appendBlob(b, m.B)
		b = appendBlob(b, m.C)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.F)))
		for _, f := range m.F {
			b = binary.LittleEndian.AppendUint64(b, f.Fence)
			b = binary.LittleEndian.AppendUint64(b, f.Value)
		}
		return b, nil
	case *rpcResp:
		b := make([]byte, 0, 4+16+8+len(m.S)+len(m.B))
		b = binary.LittleEndian.AppendUint32(b, uint32(m.Status))
		for _, u := range m.U {
			b = binary.LittleEndian.AppendUint64(b, u)
		}
		b = appendBlob(b, []byte(m.S))
		b = appendBlob(b, m.B)
		return b, nil
	}
	return nil, fmt.Errorf("xpurpc: cannot marshal %T", v)
}

func appendBlob(b, blob []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(blob)))
	return append(b, blob...)
}

// reader decodes with bounds checks: every read past the end sets err instead of panicking.
type reader struct {
	b   []byte
	err error
}

// take consumes the next n bytes; nil (and err set) when fewer are left or an earlier read failed.
func (r *reader) take(n uint64) []byte {
	if r.err != nil || n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) blob() []byte {
	n := r.u32()
	if n > maxBlob {
		r.fail()
		return nil
	}
	if b := r.take(uint64(n)); b != nil {
		return append([]byte(nil), b...)
	}
	return nil
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("xpurpc: truncated or corrupt message")
	}
}

func (rpcCodec) Unmarshal(data []byte, v any) error {
	r := &reader{b: data}
	switch m := v.(type) {
	case *rpcReq:
		m.Op = r.u32()
		for i := range m.U {
			m.U[i] = r.u64()
		}
		m.S = string(r.blob())
		m.B = r.blob()
		m.C = r.blob()
		n := r.u32()
		if uint64(n) > uint64(len(r.b))/16 {
			r.fail()
		}
		if r.err == nil {
			m.F = make([]abi.FencePoint, n)
			for i := range m.F {
				m.F[i] = abi.FencePoint{Fence: r.u64(), Value: r.u64()}
			}
		}
	case *rpcResp:
		m.Status = int32(r.u32())
		for i := range m.U {
			m.U[i] = r.u64()
		}
		m.S = string(r.blob())
		m.B = r.blob()
	default:
		return fmt.Errorf("xpurpc: cannot unmarshal into %T", v)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("xpurpc: %d trailing bytes", len(r.b))
	}
	return r.err
}

func init() { encoding.RegisterCodec(rpcCodec{}) }

const callMethod = "/xpu.Backend/Call"

// callHandler is the server half of callMethod.
type callHandler interface {
	handle(ctx context.Context, req *rpcReq) *rpcResp
}

var backendService = grpc.ServiceDesc{
	ServiceName: "xpu.Backend",
	HandlerType: (*callHandler)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			req := new(rpcReq)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := srv.(callHandler)
			if icpt == nil {
				return h.handle(ctx, req), nil
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: callMethod}
			return icpt(ctx, req, info, func(ctx context.Context, r any) (any, error) {
				return h.handle(ctx, r.(*rpcReq)), nil
			})
		},
	}},
	Metadata: "loader/isolated_proto.go",
}
