package llm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// KV cache dtypes. The cache holds every layer's K and V rows; its dtype trades memory and the
// bytes attention reads per token against precision. F16 is the default, as llama.cpp's: half
// of F32's memory for a rounding the logits barely see. Q8_0 and Q4_0 store GGUF blocks of 32
// values along the head dimension (about 0.53 and 0.28 bytes per value), written through
// QUANTIZE when a stage appends its rows and read natively by ATTENTION. K and V may differ,
// as llama.cpp's -ctk and -ctv allow (K is the more sensitive of the two: its rounding moves
// every score).

// DefaultKVCacheType is the K and V cache dtype of a runner without WithKVCacheType.
const DefaultKVCacheType = core.F16

// kvTypes are the dtypes of the K and the V cache.
type kvTypes struct{ K, V core.DType }

// rowBytes are the bytes of one cache row (every KV head of one position) of K and of V.
func (t kvTypes) rowBytes(c Config) (k, v int64) {
	n := int64(c.KVHeads * c.HeadDim)
	return t.K.Bytes(n), t.V.Bytes(n)
}

func (t kvTypes) String() string {
	if t.K == t.V {
		return t.K.String()
	}
	return "k " + t.K.String() + ", v " + t.V.String()
}

// kvCacheTypes are the dtypes a KV cache may have.
var kvCacheTypes = []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0}

// ParseKVCacheType parses a KV cache dtype as llama.cpp's --cache-type-k and --cache-type-v
// spell it: f32, f16, q8_0 or q4_0 (any case). Another name is core.ErrInvalidArgument.
func ParseKVCacheType(s string) (core.DType, error) {
	dt, err := core.ParseDType(s)
	if err == nil && isKVCacheType(dt) {
		return dt, nil
	}
	names := make([]string, len(kvCacheTypes))
	for i, t := range kvCacheTypes {
		names[i] = strings.ToLower(t.String())
	}
	return core.InvalidDType, fmt.Errorf("llm: KV cache type %q: want one of %s: %w", s, strings.Join(names, ", "), core.ErrInvalidArgument)
}

func isKVCacheType(dt core.DType) bool {
	for _, t := range kvCacheTypes {
		if dt == t {
			return true
		}
	}
	return false
}

// checkKVTypes checks that m's cache can have dtypes t: blocks of a quantized cache run along
// the head dimension, so it must be a whole number of them.
func checkKVTypes(m *Model, t kvTypes) error {
	for _, dt := range []core.DType{t.K, t.V} {
		if !isKVCacheType(dt) {
			return fmt.Errorf("llm: KV cache type %s (f32, f16, q8_0 or q4_0): %w", dt, core.ErrInvalidArgument)
		}
		if b := dt.BlockLen(); int64(m.Config.HeadDim)%b != 0 {
			return fmt.Errorf("llm: KV cache type %s needs a head dimension that is a multiple of %d; the model's is %d (f16 or f32 fit any): %w",
				dt, b, m.Config.HeadDim, core.ErrInvalidArgument)
		}
	}
	return nil
}

// KVCacheBytes is the memory one of m's two caches (K or V) takes for ctxLen positions in
// dtype dt: every layer's rows.
func KVCacheBytes(m *Model, ctxLen int, dt core.DType) int64 {
	return int64(m.Config.Layers) * int64(ctxLen) * dt.Bytes(int64(m.Config.KVHeads*m.Config.HeadDim))
}

// KVCacheTypes are the dtypes of the runner's K and V caches.
func (r *Runner) KVCacheTypes() (k, v core.DType) { return r.cfg.kv.K, r.cfg.kv.V }

// KVCacheBytes is the memory the runner's K and V caches take, every layer's: the context plus
// the rows a padded last chunk writes past it.
func (r *Runner) KVCacheBytes() (k, v int64) {
	kb, vb := r.cfg.kv.rowBytes(r.m.Config)
	n := int64(r.m.Config.Layers) * r.cap
	return n * kb, n * vb
}

// toKV converts new K or V rows [C, Hkv, D] to the cache's dtype: a CAST to F16, or QUANTIZE
// to blocks along the head dimension.
func toKV(g *core.Graph, t *core.Tensor, dt core.DType) *core.Tensor {
	switch dt {
	case core.F32:
		return t
	case core.Q8_0, core.Q4_0:
		return g.Quantize(t, dt, 0)
	}
	return g.Cast(t, dt)
}

// newRunnerKV is newRunner, retried with an F32 cache when the caller chose no KV dtype and a
// unit refuses the default's (the QNN CPU backend has no FLOAT_16 ops): the default must not
// make a model that ran before fail to load. A refusal for another reason fails again with
// F32 and reports the first error.
func newRunnerKV(ctx context.Context, m *Model, devices []core.Device, plan *sched.Plan, cfg runnerConfig) (*Runner, error) {
	r, err := newRunner(ctx, m, devices, plan, cfg)
	if err == nil || cfg.kvSet || cfg.kv == (kvTypes{core.F32, core.F32}) || !errors.Is(err, core.ErrUnsupported) {
		return r, err
	}
	cfg.logger.Debug("llm: the default KV cache type is refused; retrying with f32", "kv", cfg.kv, "err", err)
	cfg.kv = kvTypes{core.F32, core.F32}
	if r, err2 := newRunner(ctx, m, devices, plan, cfg); err2 == nil {
		return r, nil
	}
	return nil, err
}

// compactKV moves cache row base+keep[i] to row base+i in every layer's K and V cache (see
// sched.Runtime.CompactKV).
func (r *Runner) compactKV(ctx context.Context, base int64, keep []int) error {
	kRow, vRow := r.cfg.kv.rowBytes(r.m.Config)
	var ks, vs []sched.Span
	for _, kv := range r.kv {
		ks, vs = append(ks, kv[0]), append(vs, kv[1])
	}
	if err := r.rt.CompactKV(ctx, ks, kRow, base, keep); err != nil {
		return fmt.Errorf("llm: %w", err)
	}
	if err := r.rt.CompactKV(ctx, vs, vRow, base, keep); err != nil {
		return fmt.Errorf("llm: %w", err)
	}
	return nil
}
