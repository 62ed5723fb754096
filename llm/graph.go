package llm

import (
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
)

// The runner's stage graphs are arch's (arch.Stage), built over a stage build (stagebuild.go):
// the model gives the weights and the architecture's builder, the stage build the projections
// (a projection hook's lowering, or its read-backs).

// stage builds the runner's stage s of shape st (0: the embedding; s: layer s-1) over sb, the
// tensors a projection reader reads back as outputs after the stage's own.
func (m *Model) stage(st arch.Stage, s int, sb *stageBuild) (*core.Graph, error) {
	g := core.NewGraph()
	b := arch.NewBlock(g, &m.Config, m.arch, sb)
	var err error
	if s == 0 {
		err = st.Embed(b)
	} else {
		err = st.Layer(b, s-1)
	}
	if err != nil {
		return nil, err
	}
	sb.output(g)
	return g, g.Err()
}

// Block is a block adding to g for the model: its weights and plain projections (no lowering,
// no read-backs), for a technique that builds the model's stages its own way (arch.Block).
func (m *Model) Block(g *core.Graph) arch.Block {
	return arch.NewBlock(g, &m.Config, m.arch, &stageBuild{m: m})
}
