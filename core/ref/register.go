package ref

import (
	"context"

	"github.com/xpuhub/xpu/core"
)

// Name is the reference backend's name in the registry ("--backend ref").
const Name = "ref"

func init() {
	core.Register(core.BuiltIn{Name: Name, Open: func(context.Context) (core.Backend, error) { return New(), nil }})
}
