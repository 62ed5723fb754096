package llm

import "github.com/xpuhub/xpu/core"

// KVRows is kvRows for the tests of package llm_test (the speculative ones, which import
// package spec and so cannot live in package llm).
func KVRows(r *Runner, n int) [][]float32 { return kvRows(r, n) }

// kvRows are the cache's first n rows of every layer, K then V, as floats.
func kvRows(r *Runner, n int) [][]float32 {
	kRow, vRow := r.cfg.kv.RowBytes(r.m.Config)
	var out [][]float32
	for _, kv := range r.kv {
		for i, s := range kv {
			rowBytes, dt := kRow, r.cfg.kv.K
			if i == 1 {
				rowBytes, dt = vRow, r.cfg.kv.V
			}
			x, err := core.Dequantize(dt, r.rt.Arena().Bytes(s)[:int64(n)*rowBytes], 0)
			if err != nil {
				panic(err) // the cache's own dtype and whole rows: cannot fail
			}
			out = append(out, x)
		}
	}
	return out
}
