//go:build darwin

package coreml

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
)

// This file is compile-checked on Linux (GOOS=darwin in make vet) but runs only on a Mac: it
// calls Core ML through the Objective-C runtime with purego, without cgo.

const coreMLPath = "/System/Library/Frameworks/CoreML.framework/CoreML"

// MLComputeUnits values (Apple's MLComputeUnits enumeration).
var computeUnits = map[string]int{"cpu": 0, "gpu": 1, "all": 2, "ane": 3}

// MLMultiArrayDataType values: the kind in the high half, the bit width in the low half.
const (
	mlFloat32 = 0x10000 | 32
	mlFloat16 = 0x10000 | 16
	mlInt32   = 0x20000 | 32
)

var rt struct {
	once sync.Once
	err  error
	push func() uintptr
	pop  func(uintptr)
	sel  map[string]objc.SEL
}

func loadRuntime() error {
	rt.once.Do(func() {
		if _, err := purego.Dlopen(coreMLPath, purego.RTLD_NOW|purego.RTLD_GLOBAL); err != nil {
			rt.err = fmt.Errorf("%w: %v", ErrNoCoreML, err)
			return
		}
		lib, err := purego.Dlopen("/usr/lib/libobjc.A.dylib", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			rt.err = fmt.Errorf("%w: libobjc: %v", ErrNoCoreML, err)
			return
		}
		purego.RegisterLibFunc(&rt.push, lib, "objc_autoreleasePoolPush")
		purego.RegisterLibFunc(&rt.pop, lib, "objc_autoreleasePoolPop")
		rt.sel = map[string]objc.SEL{}
		for _, s := range []string{"stringWithUTF8String:", "fileURLWithPath:", "compileModelAtURL:error:",
			"new", "setComputeUnits:", "modelWithContentsOfURL:configuration:error:", "path", "UTF8String",
			"localizedDescription", "alloc", "initWithDataPointer:shape:dataType:strides:deallocator:error:",
			"numberWithLongLong:", "arrayWithCapacity:", "addObject:", "featureValueWithMultiArray:",
			"dictionaryWithCapacity:", "setObject:forKey:", "initWithDictionary:error:", "setOutputBackings:",
			"predictionFromFeatures:options:error:", "featureValueForName:", "multiArrayValue", "dataPointer",
			"release", "retain"} {
			rt.sel[s] = objc.RegisterName(s)
		}
		for _, c := range []string{"MLModel", "MLModelConfiguration", "MLMultiArray", "MLFeatureValue",
			"MLDictionaryFeatureProvider", "MLPredictionOptions", "NSString", "NSURL", "NSNumber",
			"NSMutableArray", "NSMutableDictionary"} {
			if objc.GetClass(c) == 0 {
				rt.err = fmt.Errorf("%w: class %s is missing (Core ML of macOS 13 / iOS 16 or newer is needed)", ErrNoCoreML, c)
				return
			}
		}
	})
	return rt.err
}

func probe() (int, string) {
	if err := loadRuntime(); err != nil {
		return 0, err.Error()
	}
	return 80, ""
}

func newEngine() (engine, error) {
	if err := loadRuntime(); err != nil {
		return nil, err
	}
	return darwinEngine{}, nil
}

type darwinEngine struct{}

func (darwinEngine) label() string  { return "coreml" }
func (darwinEngine) emulated() bool { return false }

func cls(name string) objc.ID { return objc.ID(objc.GetClass(name)) }

func send(id objc.ID, sel string, args ...any) objc.ID { return id.Send(rt.sel[sel], args...) }

func nsString(s string) objc.ID { return send(cls("NSString"), "stringWithUTF8String:", s) }

func goString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := uintptr(0); i < 1<<16; i++ {
		c := *(*byte)(unsafe.Add(p, i)) // a C string owned by Foundation
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// nsError turns an NSError into a Go error with its localized description.
func nsError(what string, e objc.ID) error {
	if e == 0 {
		return fmt.Errorf("coreml: %s failed without an NSError", what)
	}
	desc := send(e, "localizedDescription")
	return fmt.Errorf("coreml: %s: %s", what, goString(objc.Send[unsafe.Pointer](desc, rt.sel["UTF8String"])))
}

func withPool[T any](f func() (T, error)) (T, error) {
	pool := rt.push()
	defer rt.pop(pool)
	return f()
}

// load compiles the package once per cache key: the .mlmodelc lands in cacheDir/key.mlmodelc,
// where a later prepare (another process included) finds it and skips compileModelAtURL.
func (darwinEngine) load(ctx context.Context, pkgDir, cacheDir, key, units string) (model, error) {
	return withPool(func() (model, error) {
		compiled := filepath.Join(cacheDir, key+".mlmodelc")
		if _, err := os.Stat(compiled); err != nil {
			var nserr objc.ID
			url := send(cls("NSURL"), "fileURLWithPath:", nsString(pkgDir))
			out := send(cls("MLModel"), "compileModelAtURL:error:", url, unsafe.Pointer(&nserr))
			if out == 0 {
				return nil, nsError("compileModelAtURL", nserr)
			}
			tmp := goString(objc.Send[unsafe.Pointer](send(out, "path"), rt.sel["UTF8String"]))
			if err := os.Rename(tmp, compiled); err != nil {
				// another volume or a concurrent prepare: load from where Core ML put it
				if _, serr := os.Stat(compiled); serr != nil {
					compiled = tmp
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cfg := send(cls("MLModelConfiguration"), "new")
		defer send(cfg, "release")
		send(cfg, "setComputeUnits:", computeUnits[units])
		var nserr objc.ID
		url := send(cls("NSURL"), "fileURLWithPath:", nsString(compiled))
		m := send(cls("MLModel"), "modelWithContentsOfURL:configuration:error:", url, cfg, unsafe.Pointer(&nserr))
		if m == 0 {
			return nil, nsError("modelWithContentsOfURL", nserr)
		}
		send(m, "retain")
		return &darwinModel{m: m}, nil
	})
}

type darwinModel struct {
	mu sync.Mutex
	m  objc.ID
}

// multiArray wraps b (no copy) as an MLMultiArray of shape with row-major strides. The
// deallocator is nil: the xpu buffer owns the memory and outlives the prediction.
func multiArray(b []byte, shape []int64, dt int) (objc.ID, error) {
	sh := send(cls("NSMutableArray"), "arrayWithCapacity:", len(shape))
	st := send(cls("NSMutableArray"), "arrayWithCapacity:", len(shape))
	strides := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		strides[i] = acc
		acc *= shape[i]
	}
	for i := range shape {
		send(sh, "addObject:", send(cls("NSNumber"), "numberWithLongLong:", shape[i]))
		send(st, "addObject:", send(cls("NSNumber"), "numberWithLongLong:", strides[i]))
	}
	var nserr objc.ID
	a := send(send(cls("MLMultiArray"), "alloc"), "initWithDataPointer:shape:dataType:strides:deallocator:error:",
		unsafe.Pointer(unsafe.SliceData(b)), sh, dt, st, uintptr(0), unsafe.Pointer(&nserr))
	if a == 0 {
		return 0, nsError("MLMultiArray initWithDataPointer", nserr)
	}
	return a, nil
}

func mlArrayType(f feature) int {
	switch f.dt.String() {
	case "f16":
		return mlFloat16
	case "i32":
		return mlInt32
	}
	return mlFloat32
}

// predict runs one prediction with inputs and outputs wrapped in place.
func (d *darwinModel) predict(ctx context.Context, feats []feature, in, out map[string][]byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := withPool(func() (struct{}, error) {
		dict := send(cls("NSMutableDictionary"), "dictionaryWithCapacity:", len(in))
		backs := send(cls("NSMutableDictionary"), "dictionaryWithCapacity:", len(out))
		var made []objc.ID
		defer func() {
			for _, a := range made {
				send(a, "release")
			}
		}()
		for _, f := range feats {
			b, isIn := in[f.name]
			if !isIn {
				b = out[f.name]
			}
			a, err := multiArray(b, f.shape, mlArrayType(f))
			if err != nil {
				return struct{}{}, err
			}
			made = append(made, a)
			if isIn {
				send(dict, "setObject:forKey:", send(cls("MLFeatureValue"), "featureValueWithMultiArray:", a), nsString(f.name))
			} else {
				send(backs, "setObject:forKey:", a, nsString(f.name))
			}
		}
		var nserr objc.ID
		prov := send(send(cls("MLDictionaryFeatureProvider"), "alloc"), "initWithDictionary:error:", dict, unsafe.Pointer(&nserr))
		if prov == 0 {
			return struct{}{}, nsError("MLDictionaryFeatureProvider", nserr)
		}
		made = append(made, prov)
		opts := send(cls("MLPredictionOptions"), "new")
		made = append(made, opts)
		send(opts, "setOutputBackings:", backs)
		res := send(d.m, "predictionFromFeatures:options:error:", prov, opts, unsafe.Pointer(&nserr))
		if res == 0 {
			return struct{}{}, nsError("prediction", nserr)
		}
		// Core ML writes into the backings; where it chose its own storage, copy from it
		for name, b := range out {
			arr := send(send(res, "featureValueForName:", nsString(name)), "multiArrayValue")
			p := objc.Send[unsafe.Pointer](arr, rt.sel["dataPointer"])
			if p != nil && p != unsafe.Pointer(unsafe.SliceData(b)) {
				copy(b, unsafe.Slice((*byte)(p), len(b))) // Core ML's own output storage
			}
		}
		return struct{}{}, nil
	})
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	return err
}

func (d *darwinModel) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m != 0 {
		send(d.m, "release")
		d.m = 0
	}
	return nil
}
