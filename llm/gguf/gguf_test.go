package gguf

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// sampleFile writes a file with every metadata type and every mapped tensor type.
func sampleFile(t testing.TB) []byte {
	t.Helper()
	kvs := []KeyValue{
		{"general.architecture", MustValue("llama")},
		{"general.alignment", MustValue(uint32(64))},
		{"u8", MustValue(uint8(200))}, {"i8", MustValue(int8(-5))},
		{"u16", MustValue(uint16(60000))}, {"i16", MustValue(int16(-300))},
		{"u32", MustValue(uint32(4e9))}, {"i32", MustValue(int32(-7))},
		{"f32", MustValue(float32(1.5))}, {"bool", MustValue(true)},
		{"u64", MustValue(uint64(1 << 40))}, {"i64", MustValue(int64(-1 << 40))},
		{"f64", MustValue(2.25)}, {"str", MustValue("héllo")},
		{"strs", MustValue([]string{"a", "", "▁b"})},
		{"f32s", MustValue([]float32{1, -2})}, {"i32s", MustValue([]int32{3, -4})},
		{"u8s", MustValue([]uint8{1, 2})}, {"bools", MustValue([]bool{true, false})},
		{"nested", MustValue([]Value{MustValue([]int64{1, 2}), MustValue([]string{"x"})})},
	}
	q8 := make([]byte, core.Q8_0.Bytes(64))
	q4 := make([]byte, core.Q4_0.Bytes(32))
	for i := range q8 {
		q8[i] = byte(i)
	}
	tensors := []WriteTensor{
		{Name: "w.f32", DType: core.F32, Shape: core.Shape{2, 3}, Data: core.EncodeF32([]float32{1, 2, 3, 4, 5, 6})},
		{Name: "w.f16", DType: core.F16, Shape: core.Shape{3}, Data: make([]byte, 6)},
		{Name: "w.bf16", DType: core.BF16, Shape: core.Shape{1, 1, 2}, Data: make([]byte, 4)},
		{Name: "w.q8", DType: core.Q8_0, Shape: core.Shape{2, 32}, Gen: func() ([]byte, error) { return q8, nil }},
		{Name: "w.q4", DType: core.Q4_0, Shape: core.Shape{32}, Data: q4},
		{Name: "w.q4k", DType: core.Q4_K, Shape: core.Shape{3, 512}, Data: make([]byte, core.Q4_K.Bytes(3*512))},
		{Name: "w.q6k", DType: core.Q6_K, Shape: core.Shape{256}, Data: make([]byte, core.Q6_K.Bytes(256))},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, kvs, tensors))
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	data := sampleFile(t)
	f, err := Parse(data)
	require.NoError(t, err)
	assert.Equal(t, uint32(3), f.Version)
	assert.False(t, f.BigEndian)
	assert.Equal(t, int64(64), f.Alignment)
	assert.Zero(t, f.DataOffset%64)

	cases := []struct {
		key  string
		want any
	}{
		{"u8", uint8(200)}, {"i8", int8(-5)}, {"u16", uint16(60000)}, {"i16", int16(-300)},
		{"u32", uint32(4e9)}, {"i32", int32(-7)}, {"f32", float32(1.5)}, {"bool", true},
		{"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", 2.25}, {"str", "héllo"},
		{"strs", []string{"a", "", "▁b"}}, {"f32s", []float32{1, -2}}, {"i32s", []int32{3, -4}},
		{"u8s", []uint8{1, 2}}, {"bools", []bool{true, false}},
	}
	for _, c := range cases {
		t.Run(c.key, func(t *testing.T) {
			v, ok := f.Get(c.key)
			require.True(t, ok)
			assert.Equal(t, c.want, v.Any())
		})
	}
	nested, _ := f.Get("nested")
	require.Equal(t, 2, nested.Len())
	inner := nested.Any().([]Value)
	ints, ok := inner[0].Ints()
	require.True(t, ok)
	assert.Equal(t, []int64{1, 2}, ints)

	n, ok := mustGet(t, f, "u32").Int()
	assert.True(t, ok)
	assert.Equal(t, int64(4e9), n)

	w, ok := f.Tensor("w.f32")
	require.True(t, ok)
	assert.Equal(t, core.Shape{2, 3}, w.Shape)
	assert.Equal(t, []uint64{3, 2}, w.Dims)
	assert.Equal(t, []float32{1, 2, 3, 4, 5, 6}, core.DecodeF32(f.TensorData(w)))
	for _, ti := range f.Tensors {
		assert.Zero(t, ti.Offset%64, ti.Name)
	}
	q8, _ := f.Tensor("w.q8")
	assert.Equal(t, core.Q8_0, q8.DType)
	assert.Equal(t, int64(68), q8.Size)
	assert.Equal(t, byte(67), f.TensorData(q8)[67])
	for _, c := range []struct {
		name string
		typ  GGMLType
		dims []uint64
		size int64
	}{{"w.q4k", GGMLTypeQ4_K, []uint64{512, 3}, 3 * 2 * 144}, {"w.q6k", GGMLTypeQ6_K, []uint64{256}, 210}} {
		ti, ok := f.Tensor(c.name)
		require.True(t, ok, c.name)
		assert.Equal(t, c.typ, ti.Type, c.name) // ggml's ids: Q4_K 12, Q6_K 14
		assert.Equal(t, c.dims, ti.Dims, c.name)
		assert.Equal(t, c.size, ti.Size, c.name)
	}
	// Mapped, not copied.
	assert.Same(t, &data[f.DataOffset+q8.Offset], &f.TensorData(q8)[0])
}

func mustGet(t *testing.T, f *File, key string) Value {
	v, ok := f.Get(key)
	require.True(t, ok, key)
	return v
}

func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	require.NoError(t, os.WriteFile(path, sampleFile(t), 0o600))
	f, err := Open(path)
	require.NoError(t, err)
	w, _ := f.Tensor("w.f32")
	assert.Equal(t, float32(6), core.DecodeF32(f.TensorData(w))[5])
	require.NoError(t, f.Close())
	require.NoError(t, f.Close())

	_, err = Open(filepath.Join(t.TempDir(), "absent.gguf"))
	assert.Error(t, err)
}

// bigEndianFile builds a byte-swapped v3 file by hand (the writer only writes little-endian).
func bigEndianFile() []byte {
	var b bytes.Buffer
	be := binary.BigEndian
	put := func(v any) { _ = binary.Write(&b, be, v) }
	str := func(s string) { put(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	put(uint32(3))
	put(uint64(1)) // tensors
	put(uint64(2)) // kvs
	str("general.architecture")
	put(uint32(TypeString))
	str("llama")
	str("answer")
	put(uint32(TypeUint32))
	put(uint32(42))
	str("t")
	put(uint32(1))
	put(uint64(2))
	put(uint32(GGMLTypeF32))
	put(uint64(0))
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	put(float32(1))
	put(float32(2))
	return b.Bytes()
}

func TestBigEndian(t *testing.T) {
	f, err := Parse(bigEndianFile())
	require.NoError(t, err)
	assert.True(t, f.BigEndian)
	assert.Equal(t, uint32(3), f.Version)
	assert.Equal(t, uint32(42), mustGet(t, f, "answer").Any())
	ti, _ := f.Tensor("t")
	assert.Equal(t, core.Shape{2}, ti.Shape)
}

func TestMalformed(t *testing.T) {
	good := sampleFile(t)
	le := binary.LittleEndian
	patch := func(off int, v uint32) []byte {
		b := append([]byte(nil), good...)
		le.PutUint32(b[off:], v)
		return b
	}
	unknownType := func() []byte {
		var buf bytes.Buffer
		require.NoError(t, Write(&buf, nil, []WriteTensor{{Name: "q4k", DType: core.F32, Shape: core.Shape{256}, Data: make([]byte, 1024)}}))
		b := buf.Bytes()
		// The type id follows name (8+3), n_dims (4) and one dim (8) after the 24-byte header.
		le.PutUint32(b[24+8+3+4+8:], uint32(15)) // Q8_K: ggml's dot-product intermediate, never a weight
		return b
	}()
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "magic"},
		{"magic", []byte("GGML\x03\x00\x00\x00"), "bad magic"},
		{"version1", patch(4, 1), "version 1"},
		{"huge tensor count", append(append([]byte("GGUF\x03\x00\x00\x00"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), make([]byte, 8)...), "tensor count"},
		{"truncated", good[:len(good)-50], "runs past"},
		{"truncated header", good[:100], "malformed"},
		{"truncated kv", good[:300], "left"},
		{"unknown tensor type", unknownType, "Q8_K"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func FuzzRead(f *testing.F) {
	f.Add(sampleFile(f))
	f.Add(bigEndianFile())
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			return
		}
		for i := range g.Tensors {
			ti := &g.Tensors[i]
			d := g.TensorData(ti)
			if int64(len(d)) != ti.Size {
				t.Fatalf("tensor %s: %d bytes, want %d", ti.Name, len(d), ti.Size)
			}
		}
		for _, kv := range g.KV {
			_ = kv.Value.String()
		}
	})
}

func TestTensorDataRejectsForeignInfo(t *testing.T) {
	f, err := Parse(sampleFile(t))
	require.NoError(t, err)
	bad := TensorInfo{Name: "x", Offset: 1 << 40, Size: 8}
	assert.Nil(t, f.TensorData(&bad))
	bad = TensorInfo{Name: "x", Offset: 0, Size: 1 << 40}
	assert.Nil(t, f.TensorData(&bad))
}
