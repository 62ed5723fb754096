package abi

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
)

// BackendOption configures NewBackend.
type BackendOption func(*backendConfig)

type backendConfig struct{ validate bool }

// WithValidation installs the validation layer (Validated) under the backend's devices: every
// call is checked against the ABI's rules, a broken rule is an error wrapping ErrValidation.
// Without it the layer is not installed at all.
func WithValidation() BackendOption { return func(c *backendConfig) { c.validate = true } }

// NewBackend presents an opened plugin as a core.Backend (its Score is the plugin's probe
// score). Closing the backend closes the plugin.
func NewBackend(p *Plugin, opts ...BackendOption) (core.Backend, error) {
	var cfg backendConfig
	for _, o := range opts {
		o(&cfg)
	}
	b := &backend{p: p}
	pc := NewPluginCalls(p)
	calls := func() (Calls, error) { return pc, nil }
	pi := p.Info()
	b.info = core.BackendInfo{Name: p.probe.Name, Vendor: pi.Vendor, Version: pi.Version,
		BuildID: pi.BuildID, SDKVersion: pi.SDKVersion, Path: p.Path(), Score: p.probe.Score}
	n, st := p.DeviceCount()
	if st != StatusOK {
		return nil, fmt.Errorf("%s: device_count: %w", b.info.Name, st.Err(p.LastError(0)))
	}
	if n > 1024 {
		return nil, fmt.Errorf("%s: device_count says %d devices: %w", b.info.Name, n, core.ErrInternal)
	}
	infos := make([]core.DeviceInfo, n)
	for i := range n {
		di, st := p.DeviceInfo(i)
		if st != StatusOK {
			return nil, fmt.Errorf("%s: device_info(%d): %w", b.info.Name, i, st.Err(p.LastError(0)))
		}
		infos[i] = di
	}
	if cfg.validate {
		calls = Validated(calls, b.info.Name, infos)
	}
	for i, di := range infos {
		b.devs = append(b.devs, NewDevice(calls, uint32(i), di))
	}
	return b, nil
}

type backend struct {
	p    *Plugin
	info core.BackendInfo
	devs []core.Device
}

func (b *backend) Info() core.BackendInfo { return b.info }

func (b *backend) Devices() []core.Device { return append([]core.Device(nil), b.devs...) }

func (b *backend) Close() error { return b.p.Close() }

// Plugin returns the raw plugin under a backend made by NewBackend (for the conformance suite's
// ABI tests), or nil for any other backend.
func PluginOf(be core.Backend) *Plugin {
	if b, ok := be.(*backend); ok {
		return b.p
	}
	return nil
}

// EncodeOptions writes options as "k=v;k=v" in key order, refusing the separators inside keys
// and values (they would change the meaning of the string the plugin parses). It is the one
// encoding of context and prepare options, in process and isolated.
func EncodeOptions(opts map[string]string) (string, error) {
	keys := make([]string, 0, len(opts))
	for k, v := range opts {
		if k == "" || strings.ContainsAny(k, "=;\x00") || strings.ContainsAny(v, ";\x00") {
			return "", fmt.Errorf("option %q=%q: keys need no '=' or ';', values no ';': %w", k, v,
				core.ErrInvalidArgument)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + opts[k]
	}
	return strings.Join(parts, ";"), nil
}

// NodeVerdicts turns a plugin's graph_analyze answer into core verdicts (a refusal without a
// reason gets one), in process and isolated alike.
func NodeVerdicts(raw []RawVerdict) []core.NodeVerdict {
	vs := make([]core.NodeVerdict, len(raw))
	for i, v := range raw {
		vs[i] = core.NodeVerdict{Supported: v.Verdict == core.VerdictYes, Precision: v.Precision,
			Reason: v.Reason}
		if !vs[i].Supported && vs[i].Reason == "" {
			vs[i].Reason = "refused without a reason"
		}
	}
	return vs
}

// Refused is the error of a prepare whose graph has nodes the plugin's analysis refused (each
// named with its reason, wrapping core.ErrUnsupported), or nil when it refused none.
func Refused(id string, g *core.Graph, verdicts []core.NodeVerdict) error {
	var refused []string
	for i, v := range verdicts {
		if !v.Supported {
			refused = append(refused, fmt.Sprintf("%s: %s", g.Nodes[i], v.Reason))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("%s: prepare: %s: %w", id, strings.Join(refused, "; "), core.ErrUnsupported)
}

var nodeIndexRE = regexp.MustCompile(`\bnode (\d+)`)

// NameNodes appends the graph's node names to the node indices a plugin's message mentions
// ("node 3" becomes `node 3 "blk.0.attn_q"`), so that errors name the node the user built.
func NameNodes(g *core.Graph, msg string) string {
	return nodeIndexRE.ReplaceAllStringFunc(msg, func(m string) string {
		i, err := strconv.Atoi(nodeIndexRE.FindStringSubmatch(m)[1])
		if err != nil || i < 0 || i >= len(g.Nodes) {
			return m
		}
		return fmt.Sprintf("%s %q", m, g.Nodes[i].Name)
	})
}

// fenceSlice bounds each blocking fence_wait so that a cancelled ctx is noticed promptly
// without a goroutine per wait; a long wait is legitimate, so a timed-out slice is repeated.
const fenceSlice = 20 * time.Millisecond

// WaitSliced calls wait with slices of at most 20 ms (less where ctx's deadline is nearer)
// until wait reports done, returning its error, or ctx ends, returning ctx's error. It is how
// a fence_wait honours a context, in process and across the isolation boundary alike.
func WaitSliced(ctx context.Context, wait func(slice time.Duration) (done bool, err error)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := fenceSlice
		if dl, ok := ctx.Deadline(); ok {
			slice = min(slice, max(time.Until(dl), 0))
		}
		if done, err := wait(slice); done {
			return err
		}
	}
}
