package qnn_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// The emulator's own QNN entry points, called directly (through its provider table) so its
// context-binary parser can be fuzzed past the plugin's envelope checksum.
type emuTable struct {
	backendFree, contextCreateFromBinary, contextFree uintptr
	backend                                           uintptr
}

// slot indexes of the QNN 2.18 function table (src/qnn_api.h) and its offset in QnnInterface_t
const (
	tableOffset                 = 40
	slotBackendCreate           = 1
	slotBackendFree             = 8
	slotContextCreateFromBinary = 13
	slotContextFree             = 14
)

func openEmulator(tb testing.TB) *emuTable {
	lib, err := purego.Dlopen(filepath.Join(buildDir(), "qnn", "libQnnXpuEmu.so"), purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(tb, err)
	get, err := purego.Dlsym(lib, "QnnInterface_getProviders")
	require.NoError(tb, err)
	var list *unsafe.Pointer
	var n uint32
	r, _, _ := purego.SyscallN(get, uintptr(unsafe.Pointer(&list)), uintptr(unsafe.Pointer(&n)))
	require.Zero(tb, r)
	require.Equal(tb, uint32(1), n)
	prov := *list
	slot := func(i int) uintptr { return *(*uintptr)(unsafe.Add(prov, tableOffset+8*i)) }
	t := &emuTable{backendFree: slot(slotBackendFree), contextCreateFromBinary: slot(slotContextCreateFromBinary),
		contextFree: slot(slotContextFree)}
	r, _, _ = purego.SyscallN(slot(slotBackendCreate), 0, 0, uintptr(unsafe.Pointer(&t.backend)))
	require.Zero(tb, r)
	tb.Cleanup(func() { purego.SyscallN(t.backendFree, t.backend) })
	return t
}

// load runs contextCreateFromBinary on data; it frees the context when one was made.
func (t *emuTable) load(data []byte) bool {
	var ctx uintptr
	var p uintptr
	if len(data) > 0 {
		p = uintptr(unsafe.Pointer(&data[0]))
	}
	r, _, _ := purego.SyscallN(t.contextCreateFromBinary, t.backend, 0, 0, p, uintptr(len(data)),
		uintptr(unsafe.Pointer(&ctx)), 0)
	if r != 0 {
		return false
	}
	purego.SyscallN(t.contextFree, ctx, 0)
	return true
}

// qnnBinaryOf cuts the provider's context binary out of a plugin cache blob: it sits just
// before the blob's 8-byte checksum, and its size is the header's last field (offset 352).
func qnnBinaryOf(tb testing.TB, blob []byte) []byte {
	require.Greater(tb, len(blob), 360)
	size := int(binary.LittleEndian.Uint64(blob[352:]))
	require.LessOrEqual(tb, size+8, len(blob))
	return blob[len(blob)-8-size : len(blob)-8]
}

// fixChecksum rewrites the emulator binary's trailing FNV-1a so a mutation reaches the parser.
func fixChecksum(b []byte) {
	if len(b) < 20 {
		return
	}
	h := uint64(1469598103934665603)
	for _, c := range b[:len(b)-8] {
		h = (h ^ uint64(c)) * 1099511628211
	}
	binary.LittleEndian.PutUint64(b[len(b)-8:], h)
}

// FuzzEmulatorContextBinary: any bytes given to the emulator's contextCreateFromBinary, even
// with a valid checksum, are refused or loaded; none crash it (the graph of a block with every
// op kind the plugin emits is the seed).
func FuzzEmulatorContextBinary(f *testing.F) {
	b := openBackend(f)
	emulated(f, b)
	t := openEmulator(f)
	ctx := context.Background()
	cc := newContext(f, b)
	g, _ := blockGraph(core.F32)
	exe, err := cc.Prepare(ctx, g)
	require.NoError(f, err)
	blob, err := exe.Serialize()
	require.NoError(f, err)
	require.NoError(f, exe.Close())
	seed := qnnBinaryOf(f, blob)
	require.True(f, t.load(seed), "the genuine binary loads")
	f.Add(seed)
	r := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 8; i++ { /* a few fixed single-byte corruptions with repaired checksums */
		m := append([]byte(nil), seed...)
		m[r.IntN(len(m)-8)] ^= byte(1 + r.IntN(255))
		fixChecksum(m)
		f.Add(m)
	}
	f.Fuzz(func(_ *testing.T, data []byte) {
		m := append([]byte(nil), data...)
		fixChecksum(m)
		t.load(m)
	})
}

// FuzzLoweringWithinHTPRules: whatever single-op graph (op, dtypes, shapes, attributes from the
// fuzz input) the plugin's graph_analyze accepts, prepare builds on the emulator's strict
// profile (HTP by default): every QNN node the lowering emits passes the backend's published
// op-support table, so the plugin never claims what a phone would refuse.
func FuzzLoweringWithinHTPRules(f *testing.F) {
	b := openBackend(f)
	emulated(f, b)
	ctx := context.Background()
	cc := newContext(f, b)
	for op := byte(0); op < 14; op++ {
		f.Add(op, byte(0), byte(3), byte(4), byte(8), byte(1))
		f.Add(op, byte(1), byte(5), byte(2), byte(16), byte(0))
	}
	f.Fuzz(func(t *testing.T, op, dsel, a, bb, c, flag byte) {
		dt := []core.DType{core.F32, core.F16}[dsel%2]
		T, H, D := int64(a%6)+1, int64(bb%4)+1, 2*(int64(c%8)+1)
		g := core.NewGraph()
		x := g.Input("x", dt, T, H, D)
		var out *core.Tensor
		switch op % 14 {
		case 0:
			out = g.Add(x, g.Input("y", dt, 1, H, D))
		case 1:
			out = g.GELU(g.Mul(x, x))
		case 2:
			out = g.Softmax(x, float32(flag%4)+0.5)
		case 3:
			out = g.RMSNorm(g.SiLU(x), 1e-5)
		case 4:
			w := g.Const("w", dt, core.Shape{H * 3, D}, make([]byte, dt.Bytes(H*3*D)))
			out = g.MatMul(g.Reshape(x, T*H, D), w)
		case 5:
			w := g.Const("w", core.I8, core.Shape{5, D}, make([]byte, int(5*D)))
			out = g.MatMulI8(x, w, 0.01)
		case 6:
			out = g.RoPE(x, g.Input("pos", core.I32, T), core.RoPEOptions{Mode: int64(flag%2) * core.RoPENeoX, Dims: D})
		case 7:
			o := core.AttentionOptions{Causal: flag%2 == 0, QOffset: int64(flag % 3)}
			if flag%4 == 3 {
				o = core.AttentionOptions{Causal: true, QOffsetInput: g.Input("qo", core.I32, 1)}
			}
			k := g.Input("k", dt, T+2, 1, D)
			out = g.Attention(x, k, g.Input("v", dt, T+2, 1, D), o)
		case 8:
			out = g.Scale(g.GetRows(g.Const("t", dt, core.Shape{7, D}, make([]byte, dt.Bytes(7*D))), g.Input("ids", core.I32, T)), 2, 0)
		case 9:
			out = g.Cast(g.Scale(x, 1, 1), []core.DType{core.F32, core.F16}[flag%2])
		case 10:
			out = g.Dequantize(g.Quantize(g.Scale(x, 1, 0), core.I8, 0.05), 0.05)
		case 11:
			out = g.Scale(g.Permute(g.Scale(x, 2, 0), 1, 0, 2), 1, 1)
		case 12:
			y := g.Scale(x, 2, 0)
			out = g.Scale(g.Concat(2, g.Slice(y, 2, 0, D/2), y), 1, 1)
		case 13:
			out = g.Add(g.CausalSoftmax(g.Reshape(x, T*H, D), 0, int64(flag%5)-2), g.Softmax(g.Reshape(x, T*H, D), 1))
		}
		if out == nil || g.Err() != nil {
			return
		}
		g.Output(out)
		if g.Err() != nil {
			return
		}
		verdicts, err := cc.Analyze(ctx, g)
		require.NoError(t, err)
		for _, v := range verdicts {
			if !v.Supported {
				return
			}
		}
		exe, err := cc.Prepare(ctx, g)
		require.NoError(t, err, "graph_analyze accepted the graph, the emulator's strict profile refused it")
		require.NoError(t, exe.Close())
	})
}
