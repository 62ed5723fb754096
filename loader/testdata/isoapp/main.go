// Command isoapp is the Go application of the README ("Using xpu from Go") cut down to what the
// loader's process-count test needs: it opens the backend ISOAPP_BACKEND (isolated when
// XPU_ISOLATE names it), runs out = relu(x + c) once and prints the result. ISOAPP_WIRE=0
// leaves out loader.ServeIfPluginHost, as an application that does not know about it would.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
)

func main() {
	if os.Getenv("ISOAPP_WIRE") != "0" {
		loader.ServeIfPluginHost()
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "isoapp:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := loader.Open(ctx, os.Getenv("ISOAPP_BACKEND"))
	if err != nil {
		return err
	}
	defer b.Close()
	cx, err := b.Devices()[0].NewContext(ctx, nil)
	if err != nil {
		return err
	}
	defer cx.Close()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	c := g.Const("c", core.F32, core.Shape{4}, core.EncodeF32([]float32{1, -5, 0, 2}))
	g.Output(g.ReLU(g.Add(x, c)))
	exe, err := cx.Prepare(ctx, g)
	if err != nil {
		return err
	}
	defer exe.Close()
	in, err := cx.Alloc(16, core.BufferHostVisible)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := cx.Alloc(16, core.BufferHostVisible)
	if err != nil {
		return err
	}
	defer out.Close()
	ex, err := exe.NewExecution()
	if err != nil {
		return err
	}
	defer ex.Close()
	if err := in.Write(0, core.EncodeF32([]float32{1, 2, 3, 4})); err != nil {
		return err
	}
	for i, buf := range []core.Buffer{in, out} {
		if err := ex.Bind(i, buf, 0); err != nil {
			return err
		}
	}
	if err := ex.Run(ctx); err != nil {
		return err
	}
	res := make([]byte, 16)
	if err := out.Read(0, res); err != nil {
		return err
	}
	fmt.Println("isolated", b.Info().Isolated, "result", core.DecodeF32(res))
	return nil
}
