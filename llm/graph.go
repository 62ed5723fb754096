package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
)

// The runner's stage graphs are arch's (arch.Stage): the model gives the weights and the
// architecture's builder, the runner's stage build the projections (a projection hook's
// lowering, the taps).

// stage builds the runner's stage s of shape st (0: the embedding; s: layer s-1) with sb's
// projections, its taps as outputs after the stage's own.
func (m *Model) stage(st arch.Stage, s int, sb *stageBuild) (*core.Graph, error) {
	g := core.NewGraph()
	b := m.block(g, sb)
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
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: the taps of stage %d: %w", s, err)
	}
	return g, nil
}

// Block is a block adding to g for the model: its weights and plain projections (no lowering,
// no taps), for a technique that builds the model's stages its own way (arch.Block).
func (m *Model) Block(g *core.Graph) arch.Block { return m.block(g, nil) }

// block is a block adding to g for the model, its projections as the stage build sb lowers
// them (nil: plain matrix products).
func (m *Model) block(g *core.Graph, sb *stageBuild) arch.Block {
	return arch.NewBlock(g, &m.Config, m.arch, archHost{m, sb})
}

// archHost gives the architecture builders the model's weights and linear layers.
type archHost struct {
	m  *Model
	sb *stageBuild
}

func (h archHost) Weight(g *core.Graph, name string) *core.Tensor { return h.m.w(g, name) }

func (h archHost) Linear(g *core.Graph, x *core.Tensor, l int, name string) *core.Tensor {
	return h.m.linear(g, h.sb, x, l, name)
}
