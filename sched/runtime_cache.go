package sched

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// DefaultCacheSize is how many unused prepared executables a Runtime (and so an Executor) keeps.
const DefaultCacheSize = 64

// exeCache shares prepared executables among a runtime's programs: compiling a graph that was
// prepared before on the same unit with the same prepare options (a program closed and
// compiled again, two programs with a stage in common) takes the executable already there
// instead of preparing it again, which on an NPU can take seconds. Unreferenced executables
// stay, least recently used first out, up to size; the rest close when the runtime does.
//
// The key is the unit index (an executable lives in its unit's context, so the plugin build
// and device cannot change under it), the prepare options and prepareKey's hash of the graph's
// structure, shapes, attributes and constants.
type exeCache struct {
	mu      sync.Mutex
	size    int
	clock   uint64
	closed  bool
	entries map[string]*exeEntry
	hits    int64
	log     *slog.Logger
}

type exeEntry struct {
	exe  core.Executable
	refs int
	used uint64
	// consts keeps the graph's constant bytes alive while the entry is: the key names them by
	// address, which the garbage collector could otherwise hand to other bytes of a new graph
	consts [][]byte
}

func newExeCache(size int, log *slog.Logger) *exeCache {
	if log == nil {
		log = slog.Default()
	}
	return &exeCache{size: max(size, 0), entries: map[string]*exeEntry{}, log: log}
}

// cachedExe is a program's reference to a cached executable: Close gives the reference back
// (the executable itself closes when evicted or with the runtime).
type cachedExe struct {
	core.Executable
	c    *exeCache
	key  string
	once sync.Once
}

func (x *cachedExe) Close() error {
	var err error
	x.once.Do(func() { err = x.c.release(x.key) })
	return err
}

// exeCacheKey identifies g prepared on a unit with opts.
func exeCacheKey(unit int, unitName string, opts map[string]string, g *core.Graph) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:%s|", unit, unitName)
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		fmt.Fprintf(&b, "%s=%s,", k, opts[k])
	}
	return prepareKey(b.String(), g)
}

// get returns the executable for key, preparing it with prepare when none is cached. The
// caller closes what it gets to give its reference back.
func (c *exeCache) get(ctx context.Context, key string, g *core.Graph,
	prepare func(context.Context) (core.Executable, error)) (core.Executable, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	if e, ok := c.entries[key]; ok {
		e.refs++
		c.clock++
		e.used = c.clock
		c.hits++
		c.mu.Unlock()
		return &cachedExe{Executable: e.exe, c: c, key: key}, nil
	}
	c.mu.Unlock()
	// outside the lock: preparing compiles, which may take seconds on an NPU
	exe, err := prepare(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.Join(errClosed, exe.Close())
	}
	if e, ok := c.entries[key]; ok { // another compile prepared it meanwhile
		e.refs++
		c.hits++
		if err := exe.Close(); err != nil {
			// the caller has its executable; a duplicate that fails to close is not its failure
			c.log.Warn("xpu: closing a duplicate executable", "err", err)
		}
		return &cachedExe{Executable: e.exe, c: c, key: key}, nil
	}
	var consts [][]byte
	for _, t := range g.Tensors {
		if t.Kind == core.KindConst {
			consts = append(consts, t.Data)
		}
	}
	c.clock++
	c.entries[key] = &exeEntry{exe: exe, refs: 1, used: c.clock, consts: consts}
	return &cachedExe{Executable: exe, c: c, key: key}, nil
}

// release gives back one reference to key's executable and evicts beyond the size.
func (c *exeCache) release(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok && e.refs > 0 {
		e.refs--
	}
	return c.evictLocked()
}

// evictLocked closes the least recently used unreferenced executables beyond the size.
func (c *exeCache) evictLocked() error {
	var errs []error
	for {
		idle, oldest := 0, ""
		for k, e := range c.entries {
			if e.refs == 0 {
				idle++
				if oldest == "" || e.used < c.entries[oldest].used {
					oldest = k
				}
			}
		}
		if idle <= c.size {
			return errors.Join(errs...)
		}
		errs = append(errs, c.entries[oldest].exe.Close())
		delete(c.entries, oldest)
	}
}

// close closes every executable; the runtime's programs have been released.
func (c *exeCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for k, e := range c.entries {
		errs = append(errs, e.exe.Close())
		delete(c.entries, k)
	}
	return errors.Join(errs...)
}

// held is the number of references programs or sessions still hold.
func (c *exeCache) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.entries {
		n += e.refs
	}
	return n
}

// stats is the number of cached executables and of compiles that found theirs cached.
func (c *exeCache) stats() (entries int, hits int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.hits
}

// prepareKey identifies a prepared graph: the unit (an executable lives in that unit's
// context, so the backend build cannot change under it) and the graph's structure, shapes,
// attributes and constants (by address and length: the backend uploaded those bytes).
func prepareKey(unit string, g *core.Graph) string {
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	for _, t := range g.Tensors {
		put(uint64(t.DType))
		put(uint64(t.Kind))
		put(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			put(uint64(d))
		}
		if t.Kind == core.KindConst {
			fmt.Fprintf(h, "%p/%d", t.Data, len(t.Data))
		}
	}
	for _, n := range g.Nodes {
		put(uint64(n.Op))
		put(uint64(len(n.Inputs)))
		for _, in := range n.Inputs {
			put(uint64(in.ID))
		}
		put(uint64(n.Output.ID))
		for _, v := range n.IAttr {
			put(uint64(v))
		}
		for _, v := range n.FAttr {
			put(uint64(math.Float32bits(v)))
		}
	}
	for _, ts := range [][]*core.Tensor{g.Inputs, g.Outputs} {
		put(uint64(len(ts)))
		for _, t := range ts {
			put(uint64(t.ID))
		}
	}
	return unit + "|" + hex.EncodeToString(h.Sum(nil))
}
