package conformance

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// SuiteVersion names the suite's cases, tolerances (TOLERANCES.md) and outcome rules. It is
// raised whenever one of them changes, so that two reports with the same suite version and op
// set ran the same checks: a vendor's published report is comparable with another only then.
const SuiteVersion = "1.0"

// Provenance says what produced a report, so that a vendor can publish it and a reader can
// rerun it: the xpu build, the suite, the ABI and op-set versions on both sides, and the
// machine. The plugin's build id, the date and the seed are the report's Backend.BuildID,
// Started and Seed.
type Provenance struct {
	XPUVersion   string `json:"xpu_version"`            // the module version; "(devel)" for a build inside the repository
	XPUCommit    string `json:"xpu_commit"`             // the commit xpu was built from; "unknown" when the binary records none
	XPUModified  bool   `json:"xpu_modified,omitempty"` // built from a checkout with uncommitted changes
	GoVersion    string `json:"go_version"`
	SuiteVersion string `json:"suite_version"`
	ABIVersion   string `json:"abi_version"`    // the host's, "major.minor"
	OpSetVersion int    `json:"op_set_version"` // the op set the suite checks (abi/OPS.md)
	// PluginABIVersion and PluginOpSets are what the plugin's get_info reports ("" for a
	// built-in or isolated backend, whose info the host does not read through the ABI).
	PluginABIVersion string  `json:"plugin_abi_version,omitempty"`
	PluginOpSets     string  `json:"plugin_op_sets,omitempty"` // "min-max"
	Machine          Machine `json:"machine"`
}

// Machine describes where a report was made.
type Machine struct {
	OS     string `json:"os"`
	Arch   string `json:"arch"`
	CPU    string `json:"cpu"` // the CPU model; "unknown" where the system does not say
	Cores  int    `json:"cores"`
	Kernel string `json:"kernel,omitempty"`
}

// String is the machine in one line, as the Markdown and HTML reports show it.
func (m Machine) String() string {
	s := fmt.Sprintf("%s, %d cores, %s/%s", m.CPU, m.Cores, m.OS, m.Arch)
	if m.Kernel != "" {
		s += ", kernel " + m.Kernel
	}
	return s
}

// WithBuild records the xpu version and commit in the report's provenance. Without it they
// come from the binary's build information (debug.ReadBuildInfo), which lacks the commit
// where the toolchain did not stamp one (a git worktree, -buildvcs=false).
func WithBuild(version, commit string) Option {
	return func(c *config) { c.version, c.commit = version, commit }
}

// provenance fills a report's provenance from the configuration, the binary and the machine;
// plugin may be nil.
func provenance(cfg config, plugin *abi.Plugin) Provenance {
	p := Provenance{XPUVersion: cfg.version, XPUCommit: cfg.commit, GoVersion: runtime.Version(),
		SuiteVersion: SuiteVersion, ABIVersion: fmt.Sprintf("%d.%d", abi.ABIMajor, abi.ABIMinor),
		OpSetVersion: core.OpsetVersion, Machine: thisMachine()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if p.XPUVersion == "" {
			p.XPUVersion = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if p.XPUCommit == "" {
					p.XPUCommit = s.Value
				}
			case "vcs.modified":
				p.XPUModified = s.Value == "true"
			}
		}
	}
	if p.XPUVersion == "" {
		p.XPUVersion = "(devel)"
	}
	if p.XPUCommit == "" {
		p.XPUCommit = "unknown"
	}
	if plugin != nil {
		if info, st := plugin.GetInfo(); st == abi.StatusOK {
			p.PluginABIVersion = fmt.Sprintf("%d.%d", info.ABIMajor, info.ABIMinor)
			p.PluginOpSets = fmt.Sprintf("%d-%d", info.OpsetMin, info.OpsetMax)
		}
	}
	return p
}

func thisMachine() Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPU: cpuModel(), Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// cpuModel reads the CPU's model from /proc/cpuinfo: "model name" on x86, "Hardware" or the
// implementer and part on Arm; "unknown" elsewhere.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	var hw, impl, part string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "model name":
			if v != "" {
				return v
			}
		case "Hardware":
			hw = v
		case "CPU implementer":
			if impl == "" {
				impl = v
			}
		case "CPU part":
			if part == "" {
				part = v
			}
		}
	}
	switch {
	case hw != "":
		return hw
	case impl != "":
		return "Arm implementer " + impl + " part " + part
	}
	return "unknown"
}

// provenanceLines are the report header's provenance, one "- key: value" line each, shared by
// the Markdown report (and through it the HTML page).
func (r *Report) provenanceLines() []string {
	p := r.Provenance
	commit := p.XPUCommit
	if p.XPUModified {
		commit += " (modified)"
	}
	lines := []string{
		fmt.Sprintf("xpu %s, commit %s, %s", p.XPUVersion, commit, p.GoVersion),
		fmt.Sprintf("suite %s, ABI %s, op set %d", p.SuiteVersion, p.ABIVersion, p.OpSetVersion),
	}
	if p.PluginABIVersion != "" {
		lines = append(lines, fmt.Sprintf("plugin ABI %s, op sets %s", p.PluginABIVersion, p.PluginOpSets))
	}
	return append(lines, "machine: "+p.Machine.String())
}

// junitProperties are the provenance as JUnit <property> elements.
func (r *Report) junitProperties() []junitProperty {
	p := r.Provenance
	props := []junitProperty{
		{"xpu.version", p.XPUVersion}, {"xpu.commit", p.XPUCommit}, {"go.version", p.GoVersion},
		{"suite.version", p.SuiteVersion}, {"abi.version", p.ABIVersion},
		{"opset.version", fmt.Sprint(p.OpSetVersion)},
		{"plugin.name", r.Backend.Name}, {"plugin.version", r.Backend.Version}, {"plugin.build_id", r.Backend.BuildID},
	}
	if p.PluginABIVersion != "" {
		props = append(props, junitProperty{"plugin.abi_version", p.PluginABIVersion}, junitProperty{"plugin.op_sets", p.PluginOpSets})
	}
	return append(props, junitProperty{"machine", p.Machine.String()},
		junitProperty{"date", r.Started.Format("2006-01-02T15:04:05Z07:00")}, junitProperty{"seed", fmt.Sprint(r.Seed)})
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}
