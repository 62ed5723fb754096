package abi

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"runtime"

	"github.com/xpuhub/xpu/core"
)

// goarchMachine is the ELF machine a plugin must be built for to load in this process.
var goarchMachine = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"386":     elf.EM_386,
	"arm":     elf.EM_ARM,
	"riscv64": elf.EM_RISCV,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"loong64": elf.EM_LOONGARCH,
}

// checkELF reads the ELF header of a candidate plugin so that the two common mistakes (a file
// that is no shared library, one built for another architecture) get a clear message instead of
// dlerror's, which for a foreign machine merely says the file cannot be opened.
func checkELF(r io.ReaderAt) (err error) {
	defer func() {
		if p := recover(); p != nil { // debug/elf on a hostile file: report, never crash
			err = fmt.Errorf("not a shared library (unreadable ELF: %v): %w", p, core.ErrIncompatible)
		}
	}()
	var magic [4]byte
	if _, err := r.ReadAt(magic[:], 0); err != nil || !bytes.Equal(magic[:], []byte(elf.ELFMAG)) {
		return fmt.Errorf("not a shared library (no ELF header): %w", core.ErrIncompatible)
	}
	f, err := elf.NewFile(r)
	if err != nil {
		return fmt.Errorf("not a shared library (bad ELF file: %v): %w", err, core.ErrIncompatible)
	}
	if f.Type != elf.ET_DYN {
		return fmt.Errorf("not a shared library (ELF type %v): %w", f.Type, core.ErrIncompatible)
	}
	want, known := goarchMachine[runtime.GOARCH]
	if known && f.Machine != want {
		return fmt.Errorf("wrong architecture: built for %v, this process is %s (%v): %w",
			f.Machine, runtime.GOARCH, want, core.ErrIncompatible)
	}
	wantClass := elf.ELFCLASS64
	if runtime.GOARCH == "386" || runtime.GOARCH == "arm" {
		wantClass = elf.ELFCLASS32
	}
	if f.Class != wantClass {
		return fmt.Errorf("wrong architecture: %v file in a %v process: %w", f.Class, wantClass,
			core.ErrIncompatible)
	}
	return nil
}
