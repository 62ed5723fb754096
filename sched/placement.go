package sched

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// Policy decides the order in which a node is offered to the devices of a session. The node
// goes to the first device in that order whose Context.Analyze accepts it.
//
// Built-in policies rank devices with a score made of the device kind and its capability bits
// (see the Prefer*, MaxPerformance and MaxEfficiency variables); ties keep the order the devices
// were given in. Two further rules apply to every policy:
//   - emulated devices (CapEmulated) and the reference backend ("ref", correct by design, not
//     fast) are ranked after every other device, so they serve as the last resort;
//   - a device the policy leaves out is only used as the CPU fallback (see NewSession).
type Policy interface {
	// Name is how reports and flags spell the policy.
	Name() string
	// Rank returns the devices n may run on, best first. It may leave devices out; it must
	// not invent devices that are not in devices.
	Rank(n *core.Node, devices []core.Device) []core.Device
}

// refBackend is the name of the CPU reference backend (core/ref).
const refBackend = "ref"

// Kind scores. Performance: NPUs have the highest matmul throughput on phone SoCs (HeteroLLM,
// mllm-NPU), then GPUs, then other accelerators, then CPUs. Efficiency (energy per op): the NPU
// is the most frugal, a fixed-function accelerator next, the GPU before the CPU.
var (
	perfKindScore = map[core.DeviceKind]int{core.DeviceNPU: 400, core.DeviceGPU: 300, core.DeviceAccel: 200, core.DeviceCPU: 100}
	effKindScore  = map[core.DeviceKind]int{core.DeviceNPU: 400, core.DeviceAccel: 300, core.DeviceGPU: 200, core.DeviceCPU: 100}
)

// lastResort pushes emulators and the reference below every real device.
func lastResort(info core.DeviceInfo) int {
	s := 0
	if info.Caps.Has(core.CapEmulated) {
		s -= 2000
	}
	if info.Backend == refBackend {
		s -= 1000
	}
	return s
}

// capBonus is the score a device's capabilities add, each by its weight.
type capBonus []struct {
	cap core.Caps
	add int
}

func (b capBonus) of(info core.DeviceInfo) int {
	s := 0
	for _, c := range b {
		if info.Caps.Has(c.cap) {
			s += c.add
		}
	}
	return s
}

// perfBonus favours native reduced precision (fp16, int8 dot products) and asynchronous
// submission, which all shorten a step on the same kind of device.
var perfBonus = capBonus{{core.CapFP16, 20}, {core.CapInt8, 10}, {core.CapAsync, 5}}

// effBonus favours unified memory (no copies between host and device, which cost energy) and
// int8 arithmetic.
var effBonus = capBonus{{core.CapUnifiedMemory, 20}, {core.CapInt8, 10}, {core.CapFP16, 5}}

func perfScore(info core.DeviceInfo) int {
	return perfKindScore[info.Kind] + lastResort(info) + perfBonus.of(info)
}

func effScore(info core.DeviceInfo) int {
	return effKindScore[info.Kind] + lastResort(info) + effBonus.of(info)
}

// scorePolicy ranks every device by a score, highest first, stable.
type scorePolicy struct {
	name  string
	score func(core.DeviceInfo) int
}

func (p scorePolicy) Name() string { return p.name }

func (p scorePolicy) Rank(_ *core.Node, devices []core.Device) []core.Device {
	out := slices.Clone(devices)
	slices.SortStableFunc(out, func(a, b core.Device) int { return p.score(b.Info()) - p.score(a.Info()) })
	return out
}

// preferKind puts the kind first, then everything else in MaxPerformance order.
func preferKind(name string, k core.DeviceKind) Policy {
	return scorePolicy{name: name, score: func(info core.DeviceInfo) int {
		s := perfScore(info)
		if info.Kind == k && lastResort(info) == 0 {
			s += 10000
		}
		return s
	}}
}

// The built-in policies. Each ranks all devices; see Policy for the rules they share.
var (
	// PreferNPU offers nodes to NPUs first, then to the other devices in MaxPerformance order.
	PreferNPU = preferKind("prefer-npu", core.DeviceNPU)
	// PreferGPU offers nodes to GPUs first, then to the other devices in MaxPerformance order.
	PreferGPU = preferKind("prefer-gpu", core.DeviceGPU)
	// PreferCPU offers nodes to CPUs first (a native CPU backend before the reference), then
	// to the other devices in MaxPerformance order.
	PreferCPU = preferKind("prefer-cpu", core.DeviceCPU)
	// MaxPerformance ranks NPU > GPU > accelerator > CPU; within a kind, fp16, int8 and async
	// support break ties.
	MaxPerformance Policy = scorePolicy{name: "max-performance", score: perfScore}
	// MaxEfficiency ranks NPU > accelerator > GPU > CPU; within a kind, unified memory, int8
	// and fp16 support break ties.
	MaxEfficiency Policy = scorePolicy{name: "max-efficiency", score: effScore}
)

// byName ranks the named devices in the order named and leaves the others out.
type byName []string

// ByName offers nodes to the named units in the order given. A name is a unit name
// ("neon:0{cpus=1}", see UnitName), a device ID ("neon:0": every unit of that device) or a
// backend name ("neon": all its units, in the order given to the session). Units not named are
// only used as the CPU fallback. NewSession fails with ErrNotFound if a name matches no unit.
func ByName(names ...string) Policy { return byName(slices.Clone(names)) }

func (p byName) Name() string { return "by-name:" + strings.Join(p, ",") }

func (p byName) Rank(_ *core.Node, devices []core.Device) []core.Device {
	var out []core.Device
	seen := map[string]bool{}
	for _, name := range p {
		for _, d := range devices {
			if u := UnitName(d); p.matches(name, d) && !seen[u] {
				seen[u] = true
				out = append(out, d)
			}
		}
	}
	return out
}

func (byName) matches(name string, d core.Device) bool {
	info := d.Info()
	return name == info.ID() || name == info.Backend || name == UnitName(d)
}

// check reports names that match none of devices.
func (p byName) check(devices []core.Device) error {
	for _, name := range p {
		found := false
		for _, d := range devices {
			found = found || p.matches(name, d)
		}
		if !found {
			return fmt.Errorf("policy %s: no unit %q: %w", p.Name(), name, core.ErrNotFound)
		}
	}
	return nil
}

// funcPolicy adapts a custom function.
type funcPolicy struct {
	name string
	rank func(n *core.Node, devices []core.Device) []core.Device
}

func (p funcPolicy) Name() string { return p.name }
func (p funcPolicy) Rank(n *core.Node, devices []core.Device) []core.Device {
	return p.rank(n, devices)
}

// PolicyFunc makes a custom policy: rank returns, for node n, the devices it may run on, best
// first (a subset of devices).
func PolicyFunc(name string, rank func(n *core.Node, devices []core.Device) []core.Device) Policy {
	return funcPolicy{name: name, rank: rank}
}

// ParsePolicy reads a policy as its Name spells it: "prefer-npu", "prefer-gpu", "prefer-cpu",
// "max-performance", "max-efficiency", or "by-name:neon,ref" (a bare device or backend list such
// as "neon,ref" means the same).
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{PreferNPU, PreferGPU, PreferCPU, MaxPerformance, MaxEfficiency} {
		if strings.EqualFold(s, p.Name()) {
			return p, nil
		}
	}
	list := strings.TrimPrefix(s, "by-name:")
	var names []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if strings.ContainsAny(n, " \t\n\r=") {
			return nil, fmt.Errorf("policy %q: bad device name %q: %w", s, n, core.ErrInvalidArgument)
		}
		if n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("policy %q: %w", s, core.ErrInvalidArgument)
	}
	return ByName(names...), nil
}

// assignment is where placement put one node and why.
type assignment struct {
	Node      *core.Node
	Device    int            // index into the session's devices
	Precision core.Precision // as Analyze (then Prepare) reported it
	// Fallback is set when the node is not on the policy's first choice for it; Reason then
	// gives the refusals that sent it elsewhere.
	Fallback bool
	Reason   string
}

// placeInput is what placement decides from: the devices, every node's ranking (indices into
// devices) and each device's verdicts (nil for devices that were not analyzed, or when
// Analyze failed: then analyzeErr holds why).
type placeInput struct {
	graph      *core.Graph
	devices    []core.Device
	names      []string // the devices' unit names
	ranks      [][]int
	verdicts   [][]core.NodeVerdict
	analyzeErr []error
	fallback   int // the CPU fallback device, -1 if none
	strict     bool
}

// rankAll asks the policy for every node and maps the answer to device indices (devices are
// told apart by their unit names, so two units of one device are two entries). It also finds
// the CPU fallback device: the first device of kind CPU among those given.
func rankAll(g *core.Graph, devices []core.Device, p Policy) (ranks [][]int, fallback int, err error) {
	index := make(map[string]int, len(devices))
	fallback = -1
	for i, d := range devices {
		info, name := d.Info(), UnitName(d)
		if _, dup := index[name]; dup {
			return nil, -1, fmt.Errorf("unit %s given twice: %w", name, core.ErrInvalidArgument)
		}
		index[name] = i
		if fallback < 0 && info.Kind == core.DeviceCPU {
			fallback = i
		}
	}
	if c, ok := p.(interface{ check([]core.Device) error }); ok {
		if err := c.check(devices); err != nil {
			return nil, -1, err
		}
	}
	ranks = make([][]int, len(g.Nodes))
	for ni, n := range g.Nodes {
		for _, d := range p.Rank(n, devices) {
			if d == nil {
				return nil, -1, fmt.Errorf("policy %s: nil device for %s: %w", p.Name(), n, core.ErrInvalidArgument)
			}
			i, ok := index[UnitName(d)]
			if !ok {
				return nil, -1, fmt.Errorf("policy %s: unit %s for %s is not one of the session's: %w",
					p.Name(), UnitName(d), n, core.ErrInvalidArgument)
			}
			if !slices.Contains(ranks[ni], i) {
				ranks[ni] = append(ranks[ni], i)
			}
		}
	}
	return ranks, fallback, nil
}

// wanted lists the devices placement may ask: every ranked device and the fallback.
func (in *placeInput) wanted() []bool {
	w := make([]bool, len(in.devices))
	for _, r := range in.ranks {
		for _, i := range r {
			w[i] = true
		}
	}
	if in.fallback >= 0 && !in.strict {
		w[in.fallback] = true
	}
	return w
}

// verdict is device d's answer for node ni.
func (in *placeInput) verdict(d, ni int) core.NodeVerdict {
	switch {
	case in.analyzeErr != nil && in.analyzeErr[d] != nil:
		return core.NodeVerdict{Reason: "analyze failed: " + in.analyzeErr[d].Error()}
	case in.verdicts == nil || in.verdicts[d] == nil:
		return core.NodeVerdict{Reason: "not analyzed"}
	}
	v := in.verdicts[d][ni]
	if !v.Supported && v.Reason == "" {
		v.Reason = "refused"
	}
	return v
}

// place assigns every node: the first ranked device that accepts it, else (unless strict) the
// CPU fallback. Strict mode also refuses any node that is not on its first choice.
func place(in *placeInput) ([]assignment, error) {
	out := make([]assignment, len(in.graph.Nodes))
	for ni, n := range in.graph.Nodes {
		var refusals []string
		refuse := func(d int, v core.NodeVerdict) {
			refusals = append(refusals, fmt.Sprintf("%s: %s", in.names[d], v.Reason))
		}
		chosen := -1
		var prec core.Precision
		for _, d := range in.ranks[ni] {
			v := in.verdict(d, ni)
			if v.Supported {
				chosen, prec = d, v.Precision
				break
			}
			refuse(d, v)
		}
		if len(refusals) > 0 && in.strict {
			return nil, fmt.Errorf("strict placement: %s: %s: %w", n, refusals[0], core.ErrUnsupported)
		}
		if chosen < 0 && !in.strict && in.fallback >= 0 && !slices.Contains(in.ranks[ni], in.fallback) {
			if v := in.verdict(in.fallback, ni); v.Supported {
				chosen, prec = in.fallback, v.Precision
			} else {
				refuse(in.fallback, v)
			}
		}
		if chosen < 0 {
			why := "no device offered"
			if len(refusals) > 0 {
				why = strings.Join(refusals, "; ")
			}
			return nil, fmt.Errorf("no device accepts %s: %s: %w", n, why, core.ErrUnsupported)
		}
		out[ni] = assignment{Node: n, Device: chosen, Precision: prec, Fallback: len(refusals) > 0,
			Reason: strings.Join(refusals, "; ")}
	}
	return out, nil
}
