package llm

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// KVCacheTypes are the dtypes of the runner's K and V caches.
func (r *Runner) KVCacheTypes() (k, v core.DType) { return r.cfg.kv.K, r.cfg.kv.V }

// KVCacheBytes is the memory the runner's K and V caches take, every layer's: the context plus
// the rows a padded last chunk writes past it.
func (r *Runner) KVCacheBytes() (k, v int64) {
	kb, vb := r.cfg.kv.RowBytes(r.m.Config)
	n := int64(r.m.Config.Layers) * r.cap
	return n * kb, n * vb
}

// newRunnerKV is newRunner, retried with an F32 cache when the caller chose no KV dtype and a
// unit refuses the default's (the QNN CPU backend has no FLOAT_16 ops): the default must not
// make a model that ran before fail to load. A refusal for another reason fails again with
// F32 and reports the first error.
func newRunnerKV(ctx context.Context, m *Model, devices []core.Device, plan *sched.Plan, cfg runnerConfig) (*Runner, error) {
	r, err := newRunner(ctx, m, devices, plan, cfg)
	if err == nil || cfg.kvSet || cfg.kv == (kvcache.Types{K: core.F32, V: core.F32}) || !errors.Is(err, core.ErrUnsupported) {
		return r, err
	}
	cfg.logger.Debug("llm: the default KV cache type is refused; retrying with f32", "kv", cfg.kv, "err", err)
	cfg.kv = kvcache.Types{K: core.F32, V: core.F32}
	if r, err2 := newRunner(ctx, m, devices, plan, cfg); err2 == nil {
		return r, nil
	}
	return nil, err
}

// compactKV moves cache row base+keep[i] to row base+i in every layer's K and V cache (see
// sched.Runtime.CompactKV).
func (r *Runner) compactKV(ctx context.Context, base int64, keep []int) error {
	kRow, vRow := r.cfg.kv.RowBytes(r.m.Config)
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
