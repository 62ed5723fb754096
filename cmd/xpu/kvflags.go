package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/kvcache"
)

// kvFlags are the KV cache dtype flags of run and serve, in llama.cpp's spellings:
// --cache-type-k/-ctk and --cache-type-v/-ctv, and xpu's --kv for both at once.
type kvFlags struct {
	fs         *flag.FlagSet
	k, v, both string
}

func addKVFlags(fs *flag.FlagSet) *kvFlags {
	f := &kvFlags{fs: fs}
	def := kvcache.DefaultType.String()
	for _, n := range []string{"cache-type-k", "ctk"} {
		fs.StringVar(&f.k, n, def, "KV cache dtype of K: f16, f32, q8_0 or q4_0 (q8_0/q4_0 need a head size that is a multiple of 32)")
	}
	for _, n := range []string{"cache-type-v", "ctv"} {
		fs.StringVar(&f.v, n, def, "KV cache dtype of V: f16, f32, q8_0 or q4_0")
	}
	fs.StringVar(&f.both, "kv", def, "KV cache dtype of K and V (--cache-type-k and --cache-type-v override it)")
	return f
}

func (f *kvFlags) set(names ...string) bool {
	for _, n := range names {
		if flagSet(f.fs, n) {
			return true
		}
	}
	return false
}

// options are the runner options the flags give: none when no flag is set, so that the
// library's default applies (an F16 cache, or F32 on a backend that refuses F16).
func (f *kvFlags) options() ([]llm.RunnerOption, error) {
	kSet, vSet, bothSet := f.set("cache-type-k", "ctk"), f.set("cache-type-v", "ctv"), f.set("kv")
	if !kSet && !vSet && !bothSet {
		return nil, nil
	}
	both, err := kvcache.ParseType(f.both)
	if err != nil {
		return nil, fmt.Errorf("--kv: %w", err)
	}
	k, v := both, both
	if kSet {
		if k, err = kvcache.ParseType(f.k); err != nil {
			return nil, fmt.Errorf("--cache-type-k: %w", err)
		}
	}
	if vSet {
		if v, err = kvcache.ParseType(f.v); err != nil {
			return nil, fmt.Errorf("--cache-type-v: %w", err)
		}
	}
	return []llm.RunnerOption{llm.WithKVCacheTypes(k, v)}, nil
}

// kType is the K cache dtype the flags ask for (the default when none is set): what the
// sparse FFN's planner sizes the cache by.
func (f *kvFlags) kType() core.DType {
	for _, s := range []struct {
		val   string
		names []string
	}{{f.k, []string{"cache-type-k", "ctk"}}, {f.both, []string{"kv"}}} {
		if f.set(s.names...) {
			if dt, err := kvcache.ParseType(s.val); err == nil {
				return dt
			}
		}
	}
	return kvcache.DefaultType
}

// printKVCache prints the KV cache's dtypes and memory for the context, as llama.cpp does at
// load, and what the runner allocated: the cache also has rows for a padded last chunk.
func printKVCache(w io.Writer, r *llm.Runner) {
	kt, vt := r.KVCacheTypes()
	kb := kvcache.Bytes(r.Model().Config, r.ContextLength(), kt)
	vb := kvcache.Bytes(r.Model().Config, r.ContextLength(), vt)
	ka, va := r.KVCacheBytes()
	fmt.Fprintf(w, "kv cache: %s for %d tokens (K %s: %s, V %s: %s; %s allocated with the padded chunk's rows)\n",
		humanSize(kb+vb), r.ContextLength(), kt, humanSize(kb), vt, humanSize(vb), humanSize(ka+va))
}

// humanSize is n bytes in KiB below a MiB, else in MiB.
func humanSize(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
