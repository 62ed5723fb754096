package w8a8

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/cachedir"
	"github.com/xpuhub/xpu/internal/safefile"
)

// CalibrationVersion is the record format this package writes and reads.
const CalibrationVersion = 1

// Rule is how a calibration turns activation statistics into scales, thresholds, hot channels
// and the pruned layer set (the defaults: DefaultRule).
//
// Per MATMUL input, over every calibration token t and channel c:
//  1. m_c = max_t |x[t,c]|, and M the median of the m_c.
//  2. Outlier channels: m_c > OutlierRatio · M. The bulk is every other channel.
//  3. The per-tensor activation scale sa = (the Percentile-th percentile of |x| over the bulk)
//     / 127, so the int8 grid is spent on the bulk; the threshold t = 127 · sa: a value beyond
//     it is clipped by QUANTIZE and is an outlier (mllm-NPU's rule: what the per-tensor scale
//     does not cover). Percentile 100 is the bulk's maximum.
//  4. Hot channels: every outlier channel of step 2 that held an outlier, then the other
//     channels ranked by how many outliers they held until the hot set holds HotCover of them,
//     while it has fewer than HotFraction of the channels (rounded up). Their weight columns
//     stay resident as floats for the shadow path; an outlier in any other channel is dropped
//     (clipped) at run time.
//  5. Layer importance: how much the logits move (NMSE) when that layer alone runs without
//     its shadow path, all others with it. The Keep fraction of the layers (rounded up, at
//     least 1), the most important first, keep the shadow path when pruning is on.
type Rule struct {
	OutlierRatio float64 `json:"outlier_ratio"`
	Percentile   float64 `json:"percentile"`
	HotCover     float64 `json:"hot_cover"`
	HotFraction  float64 `json:"hot_fraction"`
	Keep         float64 `json:"keep"`
}

// DefaultRule: outlier channels 6× the median channel, the bulk's 99.99th percentile, hot
// channels up to 3% holding 95% of the outliers (mllm-NPU: under 3% of channels produce over
// 80%), 15% of the layers kept (the paper's pruning rate of 85%).
var DefaultRule = Rule{OutlierRatio: 6, Percentile: 99.99, HotCover: 0.95, HotFraction: 0.03, Keep: 0.15}

// Check validates the rule's ranges.
func (r Rule) Check() error {
	if !(r.OutlierRatio > 1) || !(r.Percentile > 0 && r.Percentile <= 100) || !(r.HotCover > 0 && r.HotCover <= 1) ||
		!(r.HotFraction > 0 && r.HotFraction <= 1) || !(r.Keep >= 0 && r.Keep <= 1) {
		return fmt.Errorf("w8a8: rule %+v: want outlier_ratio > 1, percentile in (0, 100], hot_cover and hot_fraction in (0, 1], keep in [0, 1]: %w",
			r, core.ErrInvalidArgument)
	}
	return nil
}

// Calibration is what a calibration run records for one model.
type Calibration struct {
	Version int `json:"version"`
	// Model is the ModelKey of the model calibrated; a runner refuses another model's.
	Model string `json:"model"`
	// Arch, Dim, FFN and Layers are the model's shape, checked again at load.
	Arch   string  `json:"arch"`
	Dim    int     `json:"dim"`
	FFN    int     `json:"ffn"`
	Heads  int     `json:"heads"`
	Layers []Layer `json:"layers"`
	// Tokens is how many tokens the calibration text had.
	Tokens int  `json:"tokens"`
	Rule   Rule `json:"rule"`
}

// Layer is one layer's record.
type Layer struct {
	// Inputs, in the order of Inputs (attn_in, attn_out_in, ffn_in, ffn_down_in).
	Inputs []Input `json:"inputs"`
	// Importance is the logits NMSE when this layer alone skips its shadow path (measured; 0
	// when not measured).
	Importance float64 `json:"importance"`
	// Ratio is mllm-NPU's importance metric: max |outlier| / sa over the layer's inputs.
	Ratio float64 `json:"ratio"`
	// Shadow: the layer keeps its shadow path when pruning is on.
	Shadow bool `json:"shadow"`
	// OutAbsMax is each projection's largest |output| in the float model: the W8A8 MATMUL's
	// 16-bit output grid is set from it.
	OutAbsMax map[string]float32 `json:"out_absmax"`
}

// Input is one MATMUL input's record.
type Input struct {
	Name string `json:"name"`
	// Scale is the per-tensor activation scale sa; Threshold = 127·sa.
	Scale     float32 `json:"scale"`
	Threshold float32 `json:"threshold"`
	// AbsMax is the largest |x| seen.
	AbsMax float32 `json:"absmax"`
	// OutlierChannels are the channels whose maximum exceeded OutlierRatio × the median.
	OutlierChannels []int32 `json:"outlier_channels"`
	// Hot are the channels whose weight columns the shadow path keeps (ascending).
	Hot []int32 `json:"hot"`
	// Outliers counts the values beyond the threshold, HotOutliers those in hot channels.
	Outliers    int `json:"outliers"`
	HotOutliers int `json:"hot_outliers"`
}

// Width is the channel count of an input for a model of dim and ffn.
func Width(input string, dim, ffn int) int {
	if input == InputDown {
		return ffn
	}
	return dim
}

// Validate checks c against the model it is to be used with: its key and shape.
func (c *Calibration) Validate(key, arch string, dim, ffn, layers int) error {
	if c.Version != CalibrationVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrBadCalibration, c.Version, CalibrationVersion)
	}
	if c.Model != key {
		return fmt.Errorf("%w: made for model %s, this model is %s (run xpu calibrate again)", ErrStale, c.Model, key)
	}
	if c.Arch != arch || c.Dim != dim || c.FFN != ffn || len(c.Layers) != layers {
		return fmt.Errorf("%w: shape %s dim %d ffn %d, %d layers; the model is %s dim %d ffn %d, %d layers",
			ErrStale, c.Arch, c.Dim, c.FFN, len(c.Layers), arch, dim, ffn, layers)
	}
	for l, ly := range c.Layers {
		if len(ly.Inputs) != len(Inputs) {
			return fmt.Errorf("%w: layer %d has %d inputs, want %d", ErrBadCalibration, l, len(ly.Inputs), len(Inputs))
		}
		for i, in := range ly.Inputs {
			w := Width(Inputs[i], dim, ffn)
			switch {
			case in.Name != Inputs[i]:
				return fmt.Errorf("%w: layer %d input %d is %q, want %q", ErrBadCalibration, l, i, in.Name, Inputs[i])
			case !(in.Scale > 0) || math.IsInf(float64(in.Scale), 0) || !(in.Threshold > 0):
				return fmt.Errorf("%w: layer %d %s: scale %g, threshold %g", ErrBadCalibration, l, in.Name, in.Scale, in.Threshold)
			}
			for _, h := range in.Hot {
				if h < 0 || int(h) >= w {
					return fmt.Errorf("%w: layer %d %s: hot channel %d outside [0, %d)", ErrBadCalibration, l, in.Name, h, w)
				}
			}
		}
	}
	return nil
}

// Marshal is the record as indented JSON.
func (c *Calibration) Marshal() ([]byte, error) { return json.MarshalIndent(c, "", " ") }

// Parse reads a record (it is validated against a model by Validate).
func Parse(b []byte) (*Calibration, error) {
	var c Calibration
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCalibration, err)
	}
	return &c, nil
}

// Load reads a record from a file.
func Load(path string) (*Calibration, error) {
	b, err := safefile.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Save writes c to path atomically.
func (c *Calibration) Save(path string) error {
	b, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// a fresh temporary name: a fixed one could be a FIFO left there, which would block the write
	tmp, err := os.CreateTemp(filepath.Dir(path), ".w8a8-*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}

// CacheDir is where calibrations live by default: $XPU_CACHE_DIR/w8a8, else
// $XDG_CACHE_HOME/xpu/w8a8, else ~/.cache/xpu/w8a8 (the order of the other caches).
func CacheDir() (string, error) {
	d, err := cachedir.Dir("w8a8")
	if err != nil {
		return "", fmt.Errorf("w8a8: %w", err)
	}
	return d, nil
}

// CachePath is the default file of a model's calibration: <cache dir>/<model key>.json.
func CachePath(key string) (string, error) {
	d, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, key+".json"), nil
}

// Analyze applies steps 1–4 of the rule to one input's activations (rows of width values,
// row-major) and returns its record.
func (r Rule) Analyze(name string, xs []float32, width int) (Input, error) {
	if width <= 0 || len(xs) == 0 || len(xs)%width != 0 {
		return Input{}, fmt.Errorf("w8a8: %s: %d values in rows of %d: %w", name, len(xs), width, core.ErrInvalidArgument)
	}
	in := Input{Name: name}
	chMax := make([]float32, width)
	for i, x := range xs {
		a := float32(math.Abs(float64(x)))
		if !(a <= math.MaxFloat32) {
			return Input{}, fmt.Errorf("w8a8: %s: activation %g is not finite: %w", name, x, core.ErrInvalidArgument)
		}
		chMax[i%width] = max(chMax[i%width], a)
		in.AbsMax = max(in.AbsMax, a)
	}
	sorted := slices.Clone(chMax)
	slices.Sort(sorted)
	median := float64(sorted[width/2])
	outlier := make([]bool, width)
	for c, m := range chMax {
		if float64(m) > r.OutlierRatio*median {
			outlier[c] = true
			in.OutlierChannels = append(in.OutlierChannels, int32(c))
		}
	}
	var bulk []float32
	for i, x := range xs {
		if !outlier[i%width] {
			bulk = append(bulk, float32(math.Abs(float64(x))))
		}
	}
	slices.Sort(bulk)
	top := float32(0)
	if len(bulk) > 0 {
		idx := int(math.Ceil(r.Percentile/100*float64(len(bulk)))) - 1
		top = bulk[min(max(idx, 0), len(bulk)-1)]
	}
	if top == 0 {
		top = in.AbsMax // no bulk (or an all-zero one): cover everything
	}
	if top == 0 {
		top = 1
	}
	in.Scale = top / 127
	in.Threshold = 127 * in.Scale
	count := make([]int, width)
	for i, x := range xs {
		if float32(math.Abs(float64(x))) > in.Threshold {
			count[i%width]++
			in.Outliers++
		}
	}
	if in.Outliers == 0 {
		return in, nil
	}
	order := make([]int, width)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return count[order[a]] > count[order[b]] })
	for _, c := range order {
		if outlier[c] && count[c] > 0 {
			in.Hot = append(in.Hot, int32(c))
			in.HotOutliers += count[c]
		}
	}
	maxHot := int(math.Ceil(r.HotFraction * float64(width)))
	for _, c := range order {
		if count[c] == 0 || len(in.Hot) >= maxHot || float64(in.HotOutliers) >= r.HotCover*float64(in.Outliers) {
			break
		}
		if !outlier[c] {
			in.Hot = append(in.Hot, int32(c))
			in.HotOutliers += count[c]
		}
	}
	slices.Sort(in.Hot)
	return in, nil
}

// Prune sets each layer's Shadow flag: the Keep fraction of the layers (rounded up, at least
// one) with the highest Importance (Ratio breaks ties, and orders the layers when no
// importance was measured) keep the shadow path.
func (r Rule) Prune(layers []Layer) {
	order := make([]int, len(layers))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		la, lb := layers[order[a]], layers[order[b]]
		if la.Importance != lb.Importance {
			return la.Importance > lb.Importance
		}
		return la.Ratio > lb.Ratio
	})
	keep := max(1, int(math.Ceil(r.Keep*float64(len(layers))-1e-9)))
	for i, l := range order {
		layers[l].Shadow = i < keep
	}
}
