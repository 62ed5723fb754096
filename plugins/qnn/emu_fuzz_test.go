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
	cc, err := b.Devices()[0].NewContext(ctx, nil)
	require.NoError(f, err)
	f.Cleanup(func() { _ = cc.Close() })
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
